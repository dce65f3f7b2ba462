"""Chat through the swarm's healthiest servers.

Layers, each importing only those above it:

- ``policy``: pure routing policy (peer weights, penalties, exploration); no petals.
- ``errors``, ``decoding``: what a request can fail with, what an answer is made of; no petals.
- ``remote_model``, ``sequence``: the seam into petals (model loading, the sequence manager that
  applies the policy, per-span timing and failover inside an inference session).
- ``session``, ``engine``: sessions, generation, streaming, limits; the one ``ChatEngine``.
- ``feedback``: the links to the monitor's store (weights in, outcomes out).
- ``http``: the chat page, chat.petals.dev's API and the OpenAI API, as one Flask blueprint.
"""
