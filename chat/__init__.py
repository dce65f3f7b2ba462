"""Chat through the swarm's healthiest servers."""
