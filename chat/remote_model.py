"""Load a petals model whose remote blocks are reached through *our* DHT and sequence manager.

petals' ``*ForCausalLM.from_pretrained`` takes no ``dht=``: each model builds a ``RemoteSequential``
that starts its own DHT with hivemind's defaults (NAT traversal on). While a model is being built
here, ``RemoteSequential`` is handed a sequence manager made by our factory instead, bound to the
process's DHT client. This works for every model family petals supports, in one place.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from monitor import compat  # (must precede petals)

if TYPE_CHECKING:
    from petals.client.routing.sequence_manager import RemoteSequenceManager

_BUILD_LOCK = compat.MODEL_BUILD_LOCK  # (also held by whoever else builds models in this process)


@contextmanager
def _sequence_managers_from(factory: Callable):
    from petals.client import remote_sequential

    with _BUILD_LOCK:
        original = remote_sequential.RemoteSequenceManager
        remote_sequential.RemoteSequenceManager = factory
        try:
            yield
        finally:
            remote_sequential.RemoteSequenceManager = original


def load_remote_model(
    path: Path,
    dht,
    *,
    sequence_manager_cls=None,
    dht_prefix: Optional[str] = None,
    torch_dtype=None,
    **client_config,
):
    """Load the client side of a model (embeddings, head, tokenizer files stay local) on ``dht``.

    ``sequence_manager_cls`` defaults to petals' ``RemoteSequenceManager``; the health-aware
    router passes its subclass. ``client_config`` goes to petals' ClientConfig (e.g. ban_timeout).
    ``torch_dtype``: the client side's precision (float32 unless given: ``chat.client_side`` chooses).
    """
    import torch
    from petals import AutoDistributedModelForCausalLM

    from monitor import families

    families.install()
    from petals.client.routing.sequence_manager import RemoteSequenceManager

    cls = sequence_manager_cls or RemoteSequenceManager

    def factory(config, block_uids, dht=None, **kwargs):
        return cls(config, block_uids, dht=bound_dht, **kwargs)

    bound_dht = dht
    # petals ignores the dht_prefix saved in a local checkpoint's config.json; pass it explicitly.
    dht_prefix = dht_prefix or json.loads((Path(path) / "config.json").read_text()).get("dht_prefix")
    if not dht_prefix:
        raise ValueError(f"{path}/config.json has no dht_prefix; pass dht_prefix= for this model")
    with _sequence_managers_from(factory):
        model = AutoDistributedModelForCausalLM.from_pretrained(
            str(path),
            initial_peers=[str(a) for a in dht.get_visible_maddrs()] or ["/ip4/127.0.0.1/tcp/1"],
            torch_dtype=torch_dtype or torch.float32,
            dht_prefix=dht_prefix,
            **client_config,
        )
    return model


def sequence_manager_of(model) -> "RemoteSequenceManager":
    """The sequence manager of a model ``load_remote_model`` built: its routes and view of the swarm."""
    return model.transformer.h.sequence_manager
