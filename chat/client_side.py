"""A model's client side in the chat's process: what precision and device it runs in, what memory it
needs, and the loaded model with its head steps.

A Petals client computes the embeddings, the final norm and the head itself. For the models the
swarm exists for that is most of a chat host's work and memory: Llama 3.1 70B's embeddings and head
are 2 × 128,256 × 8,192 parameters (8.4 GB in float32, 4.2 GB in bfloat16), 405B's twice that.

- **Precision** (``[chat] chat_dtype``): ``float32``, ``bfloat16``, or ``auto``: bfloat16 where the
  float32 client side would pass ``AUTO_BFLOAT16_BYTES`` and the device computes bfloat16 fast (a
  GPU, or a CPU with AVX-512 BF16 or AMX), else float32 — so small models keep float32's exact
  numerics. On a CPU without fast bfloat16 an explicit ``bfloat16`` halves the memory and computes
  the head as petals' ``LMHead`` does (float32 math, a chunk at a time).
- **Device** (``[chat] chat_device``): ``cpu``, ``cuda``, ``cuda:N``, ``auto`` (a GPU when torch sees
  one). A CUDA device torch does not see is refused in one line (``ClientSideError``) when the chat
  starts.
- **Memory** (``needs``): read from the checkpoint's safetensors headers before anything loads —
  the client side at rest in its precision, and its peak while loading (transformers reads a whole
  safetensors file before it keeps the client's tensors of it, converted). A model that does not
  fit what the machine has free is refused (``ClientSideTooLarge``, one line naming both figures),
  and the other models still load.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from monitor.families.checkpoint import CheckpointError, inspect

from chat.errors import ChatError
from chat.head_step import HeadSteps, StepStats

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "auto")
AUTO_BFLOAT16_BYTES = 1 << 30  # a float32 client side larger than this runs in bfloat16 under ``auto``
LOAD_OVERHEAD = 256 << 20  # what loading takes beside the tensors (torch's and transformers' own)
BYTES = {"float32": 4, "bfloat16": 2}
_DEVICE = re.compile(r"^(cpu|auto|cuda)(?::(\d{1,3}))?$")


class ClientSideError(ValueError):
    """A ``chat_dtype`` or ``chat_device`` this machine cannot honour: one line for the operator."""


class ClientSideTooLarge(ChatError):
    """The model's client side does not fit the memory the chat host has free."""

    status = 503

    def __init__(self, name: str, needed: int, available: int, dtype: str):
        super().__init__(f"the chat cannot load model {name!r}: its client side (embeddings and head, "
                         f"{dtype}) needs {gib(needed)} of memory while loading, and the chat host has "
                         f"{gib(available)} free")
        self.needed, self.available = needed, available


def gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"


def fast_bfloat16() -> bool:
    """Does this CPU compute bfloat16 matrix products natively (AVX-512 BF16 or AMX)?"""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def resolve_device(setting: str) -> str:
    """``cpu`` or ``cuda:N`` for the ``chat_device`` setting; ``ClientSideError`` when torch sees
    no such device."""
    import torch

    match = _DEVICE.match(setting.strip().lower())
    if match is None:
        raise ClientSideError(f"chat_device {setting!r}: use cpu, cuda, cuda:N or auto")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise ClientSideError(f"chat_device {setting!r}: use cpu, cuda, cuda:N or auto")
        return "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "auto":
        return "cuda:0" if count else "cpu"
    wanted = int(index or 0)
    if not count:
        raise ClientSideError(f"chat_device {setting!r}: torch sees no CUDA device on this machine "
                              f"(torch {torch.__version__}); use cpu or auto")
    if wanted >= count:
        raise ClientSideError(f"chat_device {setting!r}: torch sees {count} CUDA device(s), cuda:0 to "
                              f"cuda:{count - 1}")
    return f"cuda:{wanted}"


def _checked_dtype(setting: str) -> str:
    if setting not in DTYPES:
        raise ClientSideError(f"chat_dtype {setting!r}: use float32, bfloat16 or auto")
    return setting


def resolve_dtype(setting: str, device: str, float32_bytes: int) -> str:
    """``float32`` or ``bfloat16`` for the ``chat_dtype`` setting, a client side of ``float32_bytes``
    in float32, on ``device``."""
    if _checked_dtype(setting) != "auto":
        return setting
    fast = device.startswith("cuda") or fast_bfloat16()
    return "bfloat16" if fast and float32_bytes > AUTO_BFLOAT16_BYTES else "float32"


@dataclass(frozen=True)
class Needs:
    """What a checkpoint's client side takes: its parameters, the bytes of its largest safetensors
    file (read whole while loading) and of the client's tensors in it."""

    params: int
    largest_file: int

    def at_rest(self, dtype: str) -> int:
        return self.params * BYTES[dtype]

    def loading(self, dtype: str) -> int:
        """The peak while loading: the client side being filled, one file read whole beside it."""
        return self.at_rest(dtype) + self.largest_file + LOAD_OVERHEAD


def needs(path: Path) -> Needs:
    """What the checkpoint's client side takes (every tensor outside the blocks), from its
    safetensors headers (``monitor.families.checkpoint.inspect``: nothing loads, a damaged
    checkpoint is refused in one line)."""
    found = inspect(path)
    return Needs(params=found.other_params, largest_file=found.largest_file)


def available_memory() -> int:
    """Bytes this process could still take: the machine's available memory, or less where a cgroup
    limits it."""
    import psutil

    free = psutil.virtual_memory().available
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(0, free)


@dataclass
class ClientSide:
    """A model's loaded client side: the petals model, its head steps, and what it runs in."""

    remote: Any
    heads: HeadSteps
    dtype: str
    device: str
    memory: int  # bytes of its tensors at rest

    def info(self) -> dict:
        """Precision, device, memory and the chat's own milliseconds per token (``GET /v1/models``:
        ``petals.client_side``; the chat page)."""
        ms = self.heads.stats.ms_per_token()
        rows = self.heads.stats.rows_per_step()
        return {"dtype": self.dtype, "device": self.device, "memory_bytes": self.memory,
                "head_ms_per_token": None if ms is None else round(ms, 3),
                "rows_per_head_step": None if rows is None else round(rows, 2)}


@dataclass(frozen=True)
class ClientSideSettings:
    """``[chat] chat_dtype``, ``chat_device`` and ``chat_head_threads`` as set, and where free memory is read
    (``available``: a spec's stand-in for the machine's free memory)."""

    dtype: str = "auto"
    device: str = "auto"
    head_threads: int = 0  # threads of a head step (0: torch's own, every core)
    available: Callable[[], int] = field(default=available_memory)

    @classmethod
    def from_settings(cls, settings: Any) -> "ClientSideSettings":
        return cls(dtype=settings.chat_dtype, device=settings.chat_device, head_threads=settings.chat_head_threads)

    def checked(self) -> "ClientSideSettings":
        """Itself, once the device and the precision are known to be possible here
        (``ClientSideError`` otherwise): the chat refuses to start on a setting it cannot honour."""
        resolve_device(self.device)
        _checked_dtype(self.dtype)
        return self


def load(name: str, path: Path, settings: ClientSideSettings, build: Callable[[Any], Any],
         observe: Optional[Callable[[float, int], None]] = None) -> ClientSide:
    """Load ``name``'s client side from ``path`` in the precision and on the device ``settings``
    give, after checking that its peak while loading fits the free memory: ``build(torch_dtype)``
    makes the petals model (``chat.remote_model.load_remote_model``); ``observe`` gets each head
    step's seconds and rows."""
    import torch

    device = resolve_device(settings.device)
    try:
        need = needs(path)
    except CheckpointError as e:
        raise ClientSideError(str(e)) from None
    dtype = resolve_dtype(settings.dtype, device, need.at_rest("float32"))
    peak = need.loading(dtype) if device == "cpu" else need.largest_file + LOAD_OVERHEAD
    free = settings.available()
    if peak > free:
        logger.error("model %s: its client side needs %s while loading in %s; %s is free", name, gib(peak), dtype,
                     gib(free))
        raise ClientSideTooLarge(name, peak, free, dtype)
    logger.info("loading the client side of %s from %s in %s on %s (%s at rest)", name, path, dtype, device,
                gib(need.at_rest(dtype)))
    remote = build(getattr(torch, dtype))
    if device != "cpu":
        remote = remote.to(device)
    weight = remote.get_output_embeddings().weight
    chunked = weight.dtype == torch.bfloat16 and device == "cpu" and not fast_bfloat16()
    heads = HeadSteps(name, weight.detach(), chunked=chunked, stats=StepStats(observe), threads=settings.head_threads)
    return ClientSide(remote=remote, heads=heads, dtype=dtype, device=device, memory=need.at_rest(dtype))

