"""A Mixtral decoder layer as a petals 2.2 server block.

What petals 2.2 asks of a block class (``petals.server.backend``, ``petals.utils.convert_block``,
``petals.server.from_pretrained``): it is built from the model's config alone; its parameters are
named as the checkpoint's keys under ``model.layers.N.``, with nothing else (every parameter is
loaded from the checkpoint); it holds attention modules of the config's ``attn_class`` whose
``num_heads`` add up to the model's; and ``forward(hidden_states, layer_past=None, use_cache=False)``
takes hidden states only — positions and the causal mask come from the length of the attention
cache it is handed — and returns ``(hidden_states,)``, or ``(hidden_states, (keys, values))`` with
``use_cache``. The cache is laid out as the backend allocates it, for the key/value heads only
(``num_key_value_groups`` query heads share one): keys ``[batch * kv_heads, head_dim, length]``,
values ``[batch * kv_heads, length, head_dim]``.

The computation is current transformers' Mixtral (``MixtralDecoderLayer``), step for step, so that
its rounding is the same: RMS norms; attention with grouped key/value heads, rotary positions
(``rope_theta``) and, when ``sliding_window`` is set, each token attending to itself and the
``sliding_window - 1`` tokens before it; the sparse mixture of experts: router logits, softmax,
the top ``num_experts_per_tok`` experts renormalised to sum 1, and their ``w2(silu(w1 x) * w3 x)``
summed with those weights. Router jitter noise is a training-time perturbation: a server only
infers, so it is never applied.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.mistral.modeling_mistral import MistralRMSNorm

KeyValue = Tuple[torch.Tensor, torch.Tensor]


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin of the rotary angles at ``positions``: ``[len(positions), head_dim]``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    angles = torch.outer(positions.float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """[batch, kv_heads, length, head_dim] -> [batch, kv_heads * groups, length, head_dim]."""
    if groups == 1:
        return states
    batch, kv_heads, length, head_dim = states.shape
    states = states[:, :, None].expand(batch, kv_heads, groups, length, head_dim)
    return states.reshape(batch, kv_heads * groups, length, head_dim)


def attention_mask(past_length: int, length: int, sliding_window: Optional[int], batch_size: int,
                   dtype: torch.dtype, device: torch.device) -> Tuple[Optional[torch.Tensor], bool]:
    """The additive mask for queries at positions ``past_length ..`` over keys ``0 ..``, and whether
    attention is plainly causal instead. As the reference hands SDPA: no mask (``is_causal`` for
    a fresh prompt, nothing for one new token) unless the window hides some key."""
    total = past_length + length
    windowed = sliding_window is not None and total >= sliding_window
    if not windowed and (past_length == 0 or length == 1):
        return None, length > 1
    queries = torch.arange(past_length, total, device=device)[:, None]
    keys = torch.arange(total, device=device)[None, :]
    hidden = keys > queries
    if sliding_window is not None:
        hidden |= keys <= queries - sliding_window
    mask = torch.zeros(length, total, dtype=dtype, device=device).masked_fill(hidden, torch.finfo(dtype).min)
    return mask[None, None].expand(batch_size, 1, length, total), False


class MixtralAttention(nn.Module):
    """Self-attention with grouped key/value heads and rotary positions (petals' ``attn_class``)."""

    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.head_dim = head_dim_of(config)
        if self.head_dim * self.num_heads != self.hidden_size:
            raise ValueError(
                f"head_dim {self.head_dim} × {self.num_heads} heads != hidden_size {self.hidden_size}: petals 2.2's "
                "servers size attention caches by hidden_size / num_attention_heads per head")
        self.rope_theta = config.rope_theta
        self.sliding_window = config.sliding_window
        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(self.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False)

    def _heads(self, states: torch.Tensor, num_heads: int) -> torch.Tensor:
        batch, length, _ = states.shape
        return states.view(batch, length, num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor, past_key_value: Optional[KeyValue] = None
                ) -> Tuple[torch.Tensor, KeyValue]:
        """Returns the attention output and the keys and values of every position so far
        ([batch, kv_heads, length, head_dim] each)."""
        batch, length, _ = hidden_states.shape
        past_length = 0 if past_key_value is None else past_key_value[0].shape[2]
        query = self._heads(self.q_proj(hidden_states), self.num_heads)
        key = self._heads(self.k_proj(hidden_states), self.num_key_value_heads)
        value = self._heads(self.v_proj(hidden_states), self.num_key_value_heads)

        positions = torch.arange(past_length, past_length + length, device=hidden_states.device)
        cos, sin = rotary_cos_sin(positions, self.head_dim, self.rope_theta, value.dtype)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin
        if past_key_value is not None:
            key = torch.cat([past_key_value[0], key], dim=2)
            value = torch.cat([past_key_value[1], value], dim=2)

        mask, is_causal = attention_mask(past_length, length, self.sliding_window, batch, query.dtype, query.device)
        output = F.scaled_dot_product_attention(
            query, repeat_kv(key, self.num_key_value_groups), repeat_kv(value, self.num_key_value_groups),
            attn_mask=mask, is_causal=is_causal)
        output = output.transpose(1, 2).contiguous().view(batch, length, self.num_heads * self.head_dim)
        return self.o_proj(output), (key, value)


class MixtralExpert(nn.Module):
    """One expert: ``w2(act(w1 x) * w3 x)``."""

    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act_fn(self.w1(hidden_states)) * self.w3(hidden_states))


class MixtralSparseMoe(nn.Module):
    """The router (``gate``) and the experts; each token goes to its top ``num_experts_per_tok``."""

    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_local_experts, bias=False)
        self.experts = nn.ModuleList(MixtralExpert(config) for _ in range(config.num_local_experts))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        tokens = hidden_states.reshape(-1, shape[-1])
        probabilities = F.softmax(self.gate(tokens), dim=1, dtype=torch.float)
        weights, chosen = torch.topk(probabilities, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(tokens.dtype)

        output = torch.zeros_like(tokens)
        # expert by expert, its tokens in (rank, token) order, added up as the reference adds them
        for index, expert in enumerate(self.experts):
            rank, token = torch.where((chosen == index).T)
            if token.numel() == 0:
                continue
            contribution = expert(tokens[token]) * weights[token, rank, None]
            output.index_add_(0, token, contribution.to(tokens.dtype))
        return output.view(shape)


class WrappedMixtralBlock(nn.Module):
    """One Mixtral decoder layer, as a petals server runs it (see the module's docstring)."""

    def __init__(self, config, *_args):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = MixtralAttention(config)
        self.block_sparse_moe = MixtralSparseMoe(config)
        self.input_layernorm = MistralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MistralRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, *args, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, layer_past: Optional[KeyValue] = None,
                use_cache: bool = False, **kwargs):
        assert attention_mask is None and position_ids is None, "positions and masks come from the cache's length"
        batch = hidden_states.shape[0]
        past = self._from_server_cache(layer_past, batch) if layer_past is not None else None

        residual = hidden_states
        attended, present = self.self_attn(self.input_layernorm(hidden_states), past)
        hidden_states = residual + attended
        residual = hidden_states
        hidden_states = residual + self.block_sparse_moe(self.post_attention_layernorm(hidden_states))

        if use_cache:
            return hidden_states, self._to_server_cache(present)
        return (hidden_states,)

    def _from_server_cache(self, layer_past: KeyValue, batch: int) -> KeyValue:
        """keys [batch * kv_heads, head_dim, length], values [batch * kv_heads, length, head_dim]
        -> both [batch, kv_heads, length, head_dim]."""
        keys, values = layer_past
        heads, head_dim = self.self_attn.num_key_value_heads, self.self_attn.head_dim
        length = keys.shape[-1]
        keys = keys.permute(0, 2, 1).reshape(batch, heads, length, head_dim)
        return keys, values.reshape(batch, heads, length, head_dim)

    def _to_server_cache(self, present: KeyValue) -> KeyValue:
        keys, values = present
        batch, heads, length, head_dim = keys.shape
        keys = keys.reshape(batch * heads, length, head_dim).permute(0, 2, 1)
        return keys, values.reshape(batch * heads, length, head_dim)
