"""Make petals 2.2 import on hivemind 1.1.12.

petals 2.2 imports names such as ``hivemind.PeerID`` and ``hivemind.get_logger`` that hivemind
1.1.12 no longer re-exports at the top level. Copying the public names of the submodules back
onto the package is enough; nothing else differs for what petals uses. Import this module before
petals, in every process (our own and every petals server we start). ``import_petals()`` is the
one import path for petals in this codebase.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading
import warnings

# transformers 4.34 uses a torch API that torch 2.13 deprecates; the warning is noise here.
warnings.filterwarnings("ignore", message=r".*_register_pytree_node.*", category=FutureWarning)

import hivemind  # noqa: E402

_SOURCES = ("hivemind.p2p", "hivemind.compression", "hivemind.dht", "hivemind.moe")


def _public_names(module):
    names = getattr(module, "__all__", None)
    return names if names is not None else [n for n in vars(module) if not n.startswith("_")]


def _restore_top_level_names() -> None:
    import hivemind.utils

    modules = [importlib.import_module(name) for name in _SOURCES]
    modules.append(hivemind.utils)
    for info in pkgutil.iter_modules(hivemind.utils.__path__, "hivemind.utils."):
        modules.append(importlib.import_module(info.name))
    for module in modules:
        for name in _public_names(module):
            if not hasattr(hivemind, name) and hasattr(module, name):
                setattr(hivemind, name, getattr(module, name))


def _quiet_petals_startup() -> None:
    # petals checks PyPI for a newer version on import of its server CLI and asks the hub for
    # model metadata: nothing may leave loopback, and no hub is reachable here.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("BITSANDBYTES_NOWELCOME", "1")


_quiet_petals_startup()
_restore_top_level_names()


# Building a model (petals' client model, a server block, transformers' ``from_pretrained`` with
# ``low_cpu_mem_usage``) goes through accelerate's ``init_empty_weights``, which swaps
# ``torch.nn.Module.register_parameter`` for the whole process and swaps it back on exit: two
# threads building at once can leave it swapped for good, and every module built afterwards has
# its weights on the meta device (a chat that answers garbage, a reference that cannot compute).
# Whoever builds a model in a process that may build another at the same time holds this lock.
MODEL_BUILD_LOCK = threading.RLock()


def import_petals():
    """Return the petals package, imported after the compat shims are in place."""
    import petals

    return petals
