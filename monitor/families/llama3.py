"""Llama 3.x as a variant of petals 2.2's llama family: two small patches to transformers 4.34's Llama.

Llama 3.x checkpoints are petals' ``llama`` model type, and petals 2.2's registry takes one entry
per model type, so Llama 3 cannot be a family of its own: it must be read by the Llama classes
petals 2.2 already uses (``DistributedLlamaConfig`` on the client, ``WrappedLlamaBlock`` on a
server and in the correctness probes' local blocks), which are transformers 4.34's. What differs is
the rotary position embedding, which is computed inside each block from the attention cache's
length (a client sends hidden states only, never positions), so the server's block and the
monitor's reference blocks are the only places positions are computed; the client's
``LlamaModel`` is built with no layers. :func:`register` (idempotent, via
``monitor.families.install()``) makes two patches, each a wrapper that hands anything not Llama 3
to 4.34's own code, so Llama 2-style checkpoints behave exactly as before:

1. ``LlamaConfig._rope_scaling_validation`` (run by ``LlamaConfig.__init__``, so by ``AutoConfig``,
   petals' ``AutoDistributedConfig`` and ``DistributedLlamaConfig.from_pretrained`` alike). 4.34
   accepts only ``{"type": "linear"|"dynamic", "factor": f}`` and raises "rope_scaling must be a
   dictionary with two fields, type and factor" on the form checkpoints are saved in today,
   ``{"rope_type": ..., ...}``. The wrapper rewrites the new spelling first
   (:func:`normalize_rope_scaling`): ``default`` is no scaling (``None``); ``linear`` and ``dynamic``
   become 4.34's ``type``/``factor`` (the same scaling: linear divides the positions where the
   reference divides the frequencies; dynamic NTK grows the base with the sequence as the
   reference's does, except that 4.34 never shrinks it back after a long sequence); ``llama3`` is
   checked for its four fields and kept as saved; anything else (``yarn``, ``longrope``) is refused
   with a one-line error, as 4.34's blocks cannot compute it.

2. ``LlamaAttention._init_rope`` (called by every 4.34 Llama attention, so by petals'
   ``OptimizedLlamaAttention`` inside ``WrappedLlamaBlock``). For a ``llama3`` config it installs
   :class:`Llama3RotaryEmbedding`, a subclass of 4.34's ``LlamaRotaryEmbedding`` whose only change
   is its inverse frequencies: Llama 3.1's, as the reference (transformers 4.46
   ``_compute_llama3_parameters``) computes them, bit for bit (:func:`llama3_inv_freq`). 4.34's
   cos/sin cache, its growth with the sequence and petals' use of it are unchanged. Its cache starts
   at the original context length rather than ``max_position_embeddings`` (131072 for Llama 3.1:
   134 MB of cache per block at head_dim 128); it grows on demand exactly as 4.34's does.
   The same hook refuses, with one line naming the field, what 4.34's Llama block cannot compute:
   a ``head_dim`` other than hidden_size / num_attention_heads (4.34 derives it and reshapes the
   attention output to hidden_size), and ``mlp_bias`` (4.34's ``LlamaMLP`` has no biases).
   ``attention_bias`` needs nothing: 4.34 puts a bias on q, k, v and o as the reference does.
   :func:`check_blocks_supported` makes the same check on a config, for callers that want to
   refuse a checkpoint before building anything.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Optional

import torch
from torch import nn
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

LLAMA3 = "llama3"
#: the new spelling's rope types 4.34 computes under its own ``type`` name
_SAME_IN_4_34 = ("linear", "dynamic")
_LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_MARK = "_monitor_llama3_patch"  # set on our wrappers: register() patches once
_lock = threading.Lock()


class UnsupportedLlamaConfig(ValueError):
    """A Llama config petals 2.2's blocks (transformers 4.34) cannot compute; the message is one line."""


def rope_type(rope_scaling: Any) -> Optional[str]:
    """The rope type a ``rope_scaling`` dict names, either spelling (``None`` without scaling)."""
    if not isinstance(rope_scaling, dict):
        return None
    return rope_scaling.get("rope_type", rope_scaling.get("type"))


def is_llama3(rope_scaling: Any) -> bool:
    return rope_type(rope_scaling) == LLAMA3


def normalize_rope_scaling(rope_scaling: Any) -> Any:
    """``rope_scaling`` as 4.34 reads it: the new spelling (``rope_type``) mapped to 4.34's
    (``type``/``factor``) where 4.34 computes the same scaling, ``llama3`` checked and kept, the old
    spelling (and anything that is not a dict) unchanged for 4.34's own validation."""
    if not isinstance(rope_scaling, dict) or "rope_type" not in rope_scaling and not is_llama3(rope_scaling):
        return rope_scaling
    kind = rope_type(rope_scaling)
    if kind == "default":
        return None
    if kind in _SAME_IN_4_34:
        factor = rope_scaling.get("factor")
        return {"type": kind, "factor": float(factor) if isinstance(factor, (int, float)) else factor}
    if kind == LLAMA3:
        missing = [name for name in _LLAMA3_FIELDS if name not in rope_scaling]
        if missing:
            raise UnsupportedLlamaConfig(f"rope_scaling of rope_type llama3 lacks {', '.join(missing)}")
        wrong = [name for name in _LLAMA3_FIELDS
                 if isinstance(rope_scaling[name], bool) or not isinstance(rope_scaling[name], (int, float))]
        if wrong:
            raise UnsupportedLlamaConfig(f"rope_scaling of rope_type llama3 has non-numeric {', '.join(wrong)}")
        scaling = {key: value for key, value in rope_scaling.items() if key != "type"}
        scaling["rope_type"] = LLAMA3
        return scaling
    raise UnsupportedLlamaConfig(f"rope_scaling rope_type {kind!r} is not supported by petals 2.2's Llama "
                                 f"(transformers 4.34): only default, linear, dynamic and llama3 are")


def check_blocks_supported(config) -> None:
    """Raise :class:`UnsupportedLlamaConfig` if 4.34's Llama block cannot compute this config's."""
    derived = config.hidden_size // config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None and head_dim != derived:
        raise UnsupportedLlamaConfig(
            f"head_dim {head_dim} differs from hidden_size / num_attention_heads = {derived}: petals 2.2's Llama "
            f"blocks (transformers 4.34) cannot compute it")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedLlamaConfig("mlp_bias is set: petals 2.2's Llama blocks (transformers 4.34) have no MLP "
                                     "biases")


def llama3_inv_freq(dim: int, base: float, scaling: dict, device=None):
    """Llama 3.1's rotary inverse frequencies for a head of ``dim`` channels.

    Start from the plain ones, base^(-2i/dim), and look at each one's wavelength 2π/f against the
    original context length L: wavelengths under L / high_freq_factor (high frequencies) are kept;
    over L / low_freq_factor (low frequencies) the frequency is divided by ``factor``; in between,
    it is blended linearly in L/wavelength between the two. The float32 operations are done in the
    reference's order, so the result is the reference's bit for bit.
    """
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]

    plain = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim))
    wavelength = 2 * math.pi / plain
    longest_kept, shortest_divided = context / high, context / low
    divided = torch.where(wavelength > shortest_divided, plain / factor, plain)
    weight = (context / wavelength - low) / (high - low)  # 0 at L/low .. 1 at L/high
    blended = (1 - weight) * divided / factor + weight * divided
    in_between = ~(wavelength < longest_kept) * ~(wavelength > shortest_divided)
    return torch.where(in_between, blended, divided)


class Llama3RotaryEmbedding(LlamaRotaryEmbedding):
    """4.34's rotary embedding with Llama 3.1's inverse frequencies (its forward, cos/sin cache and
    cache growth are 4.34's). The cache starts at the original context length."""

    def __init__(self, dim, max_position_embeddings, base, device=None, *, scaling: dict):
        nn.Module.__init__(self)  # (not the parent's: it would build a cache of the plain frequencies)
        self.dim, self.max_position_embeddings, self.base = dim, max_position_embeddings, base
        self.scaling = dict(scaling)
        self.register_buffer("inv_freq", llama3_inv_freq(dim, base, scaling, device), persistent=False)
        initial = min(max_position_embeddings, int(scaling["original_max_position_embeddings"]))
        self._set_cos_sin_cache(seq_len=initial, device=self.inv_freq.device, dtype=torch.get_default_dtype())


def _patch_config_validation(config_cls) -> None:
    original = config_cls._rope_scaling_validation
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _rope_scaling_validation(self):
        self.rope_scaling = normalize_rope_scaling(self.rope_scaling)
        if not is_llama3(self.rope_scaling):
            original(self)

    setattr(_rope_scaling_validation, _MARK, True)
    config_cls._rope_scaling_validation = _rope_scaling_validation


def _patch_init_rope(attention_cls) -> None:
    original = attention_cls._init_rope
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _init_rope(self):
        check_blocks_supported(self.config)
        if not is_llama3(self.config.rope_scaling):
            return original(self)
        self.rotary_emb = Llama3RotaryEmbedding(self.head_dim, self.max_position_embeddings, self.rope_theta,
                                                scaling=self.config.rope_scaling)

    setattr(_init_rope, _MARK, True)
    attention_cls._init_rope = _init_rope


def register() -> None:
    """Make transformers 4.34's Llama accept and compute ``rope_type: llama3`` configs (idempotent)."""
    with _lock:
        _patch_config_validation(LlamaConfig)
        _patch_init_rope(LlamaAttention)
