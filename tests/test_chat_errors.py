"""Spec: what the chat tells a person when the swarm fails is what happened and what to do, never
petals' own error text (peers, addresses, files). Through the real web app and the session swarm:
``test_chat_limits.py``.
"""

from __future__ import annotations

from monitor.harness.tiny_model import TINY_DHT_PREFIX
from support import no_internals


def test_a_failure_in_the_swarm_is_told_without_the_peers_error_text():
    """petals' errors name peers, addresses and files: the user gets what happened and what to do."""
    from chat.session import _as_chat_error

    raw = RuntimeError("Failed to connect to /ip4/10.1.2.3/tcp/31337/p2p/12D3KooWExample "
                       "(File \"/srv/petals/client/inference_session.py\", line 322)")
    error = _as_chat_error(TINY_DHT_PREFIX, raw)
    assert error.status == 503 and "try again" in str(error) and TINY_DHT_PREFIX in str(error)
    no_internals(str(error), "/srv/petals", "10.1.2.3", "12D3KooW")
