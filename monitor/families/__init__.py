"""The model families the monitor reads beside petals 2.2's own: what the client side of a model
needs (config, tokenizer, embeddings, final norm, head) and what a harness server needs (the blocks).

petals 2.2 serves BLOOM, Falcon and Llama 2-style checkpoints on transformers 4.34. The models
people serve today come from petals' main branch: **Llama 3.x** (petals' ``llama`` model type with
``rope_type: llama3`` rotary scaling; ``llama3``) and **Mixtral** (mixture-of-experts blocks, a
model type of its own; ``mixtral``). Their servers speak 2.2's protocol, so a 2.2 client talks to
them once it can read the model: :func:`install` teaches this process to (idempotent, cheap after
the first call), and :func:`load_tokenizer` reads any ``tokenizer.json`` a current tokenizers
library writes. Every place that reads a checkpoint calls ``install()`` first: the chat's client
files and remote model, the correctness probes' local blocks, the harness's servers.
"""

from __future__ import annotations

import threading
from typing import Any

#: family name -> how people know it (the README's families table says the same)
FAMILIES = {
    "bloom": "BLOOM",
    "falcon": "Falcon",
    "llama": "Llama 2",
    "llama3": "Llama 3.x",
    "mixtral": "Mixtral",
}

_installed = False
_lock = threading.Lock()


def install() -> None:
    """Register the newer families with transformers and petals 2.2 in this process."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        from monitor import compat

        compat.import_petals()
        from monitor.families import llama3, mixtral

        llama3.register()
        mixtral.register()
        _installed = True


def load_tokenizer(path) -> Any:
    """The checkpoint's tokenizer, whichever tokenizers version saved it (see ``tokenizer``)."""
    from monitor.families.tokenizer import load_tokenizer as load

    return load(path)
