"""Swarm monitor for Petals."""
