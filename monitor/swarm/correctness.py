"""Correctness checks at the DHT edge: are a server's outputs what its blocks compute?

Where the monitor has the model's weights (a local ``path`` in the model's settings: the demo's
model, an operator's checkpoint), a ``ReferenceModel`` computes the hidden states after every block
for one fixed input, on CPU in float32, loading one block at a time with petals' own
``load_pretrained_block`` (so any family petals serves works, and memory holds one block, not the
model). A server of blocks [start, end) then gets the state before ``start`` as its probe input
(``monitor.swarm.speed``), and its outputs are compared with the state after ``end - 1``. The fixed
input is what the family's client sends to block 0 for seeded random tokens — the checkpoint's own
embeddings, layer-normed for BLOOM (its ``word_embeddings_layernorm``) — so activations are as large
as in real use. Each block builds its own causal mask and positions (BLOOM's ALiBi, Llama's and
Falcon's rotary) from the input's length, as a server does from its cache's length. The states are
computed once per model and kept (blocks × tokens × hidden floats: ~1 MB for the demo model).

Without weights, ``CrossCheck`` compares servers of the same blocks with one another: each probe
covers one *segment* (blocks between two consecutive span boundaries of the model's servers), all
servers of a segment get the same seeded input, and their outputs are compared pairwise
(``monitor.core.probes.cross_check``): a server outvoted by agreeing others is wrong; a
disagreement nobody outvotes is shown as one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from monitor import compat  # (before petals)
from monitor.core.probes import DECODE_STEPS, PREFILL_TOKENS, cross_check, tolerance

log = logging.getLogger(__name__)

REFERENCE_SEED = 4_321
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "word_embeddings.weight", "wte.weight")
EMBEDDING_NORM = "word_embeddings_layernorm"  # BLOOM's client norms the embeddings before block 0


def relative_error(outputs, expected) -> float:
    """‖outputs − expected‖ / ‖expected‖ in float64 (inf when outputs are not finite)."""
    import torch

    outputs, expected = outputs.double(), expected.double()
    if outputs.shape != expected.shape or not torch.isfinite(outputs).all():
        return float("inf")
    scale = expected.norm().item()
    return (outputs - expected).norm().item() / scale if scale > 0 else float((outputs - expected).norm().item())


class ReferenceError(RuntimeError):
    """The model's weights could not be used as a reference; the message says why."""


class ReferenceModel:
    """The hidden states of one fixed input after each block of a local checkpoint."""

    def __init__(self, path: Path, num_blocks: int, *, tokens: int = PREFILL_TOKENS + DECODE_STEPS,
                 seed: int = REFERENCE_SEED):
        self.path = Path(path)
        self.num_blocks = num_blocks
        self.tokens = tokens
        self.seed = seed
        self._states: Optional[list] = None
        self._lock = threading.Lock()
        self.build_seconds: Optional[float] = None

    @property
    def ready(self) -> bool:
        return self._states is not None

    def states(self) -> list:
        """[h_0, h_1, ..., h_num_blocks]: the input, then the state after each block (computed once)."""
        with self._lock:
            if self._states is None:
                started = time.perf_counter()
                self._states = self._compute()
                self.build_seconds = time.perf_counter() - started
                log.info("reference states of %s (%d blocks) computed in %.1f s", self.path.name, self.num_blocks,
                         self.build_seconds)
            return self._states

    def input_for(self, start: int):
        return self.states()[start]

    def expected(self, start: int, end: int):
        """What blocks [start, end) must return for ``input_for(start)``."""
        return self.states()[end]

    def _compute(self) -> list:
        import torch
        from petals.server.from_pretrained import load_pretrained_block
        from petals.utils.auto_config import AutoDistributedConfig

        from monitor import families

        families.install()
        try:
            config = AutoDistributedConfig.from_pretrained(str(self.path))
        except Exception as e:  # noqa: BLE001
            raise ReferenceError(f"the checkpoint's config could not be read ({type(e).__name__})") from None
        states = [self._first_input(config)]
        hidden = states[0]
        with torch.inference_mode(), warnings.catch_warnings():
            # petals loads weights into a block built on the meta device; torch warns about each one
            warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter", category=UserWarning)
            for index in range(self.num_blocks):
                with compat.MODEL_BUILD_LOCK:  # (no other thread may build a model meanwhile)
                    block = load_pretrained_block(str(self.path), index, config=config, torch_dtype=torch.float32)
                hidden = block(hidden)[0].float()
                states.append(hidden.clone())
                del block
        return states

    def _first_input(self, config):
        """What the client sends to block 0 for seeded random tokens: the checkpoint's embeddings
        (layer-normed where the family does so); seeded noise of unit size if the checkpoint has
        no embedding matrix we recognise."""
        import torch

        hidden_size = config.hidden_size
        generator = torch.Generator().manual_seed(self.seed)
        tensors = _checkpoint_tensors(self.path)
        key = next((k for k in tensors if k.endswith(EMBEDDING_SUFFIXES)), None)
        table = tensors.slice(key) if key else None
        if table is None or table.get_shape()[-1] != hidden_size:
            return torch.randn(1, self.tokens, hidden_size, generator=generator)
        vocabulary = table.get_shape()[0]
        ids = torch.randint(0, vocabulary, (self.tokens,), generator=generator).tolist()
        embeddings = torch.cat([table[i:i + 1].float() for i in ids], dim=0).unsqueeze(0)
        norm = key.replace("word_embeddings.weight", EMBEDDING_NORM)  # (only BLOOM's names have one)
        if norm != key and f"{norm}.weight" in tensors:
            weight = tensors.slice(f"{norm}.weight")[:].float()
            bias = tensors.slice(f"{norm}.bias")[:].float() if f"{norm}.bias" in tensors else None
            epsilon = float(getattr(config, "layer_norm_epsilon", 1e-5))
            embeddings = torch.nn.functional.layer_norm(embeddings, (hidden_size,), weight, bias, epsilon)
        return embeddings


class _CheckpointTensors(dict):
    """key -> file of a safetensors checkpoint, with lazy slices of any tensor."""

    def __init__(self, path: Path, files: dict):
        super().__init__(files)
        self.path = path

    def slice(self, key: str):
        from safetensors import safe_open

        return safe_open(str(self.path / self[key]), "pt").get_slice(key)


def _checkpoint_tensors(path: Path) -> _CheckpointTensors:
    """The tensors of a safetensors checkpoint (sharded or not); empty if it has none we can read."""
    from safetensors import safe_open

    files = {}
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            files = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError):
            files = {}
    elif (path / "model.safetensors").exists():
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            files = {key: "model.safetensors" for key in f.keys()}
    return _CheckpointTensors(path, files if isinstance(files, dict) else {})


# ---- without weights: servers of the same blocks compared with one another -------------------


def segments(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The blocks cut at every span boundary: each segment is either wholly in a span or not."""
    spans = list(spans)
    cuts = sorted({b for span in spans for b in span})
    pieces = list(zip(cuts, cuts[1:]))
    return [(a, b) for a, b in pieces if any(s <= a and b <= e for s, e in spans)]


@dataclass
class _Output:
    at: float
    outputs: object
    torch_dtype: Optional[str]
    quant_type: Optional[str]


class CrossCheck:
    """The latest outputs of every server per (model, segment) for the seeded default input, and
    the verdicts their pairwise comparison gives. Outputs older than ``max_age`` are forgotten."""

    def __init__(self, max_age: float):
        self.max_age = max_age
        self._outputs: dict[tuple[str, int, int], dict[str, _Output]] = {}
        self._turn: dict[tuple[str, str], int] = {}

    def segment_for(self, peer_id: str, model: str, span: tuple[int, int],
                    all_spans: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """The segment of its span this server is probed on next (each in turn); the whole span
        when no other server shares any of its blocks (nothing to compare with)."""
        mine = [seg for seg in segments(all_spans) if span[0] <= seg[0] and seg[1] <= span[1]]
        shared = [seg for seg in mine if sum(1 for s, e in all_spans if s <= seg[0] and seg[1] <= e) > 1]
        if not shared:
            return span
        turn = self._turn.get((peer_id, model), 0)
        self._turn[(peer_id, model)] = turn + 1
        return shared[turn % len(shared)]

    def add(self, peer_id: str, model: str, start: int, end: int, outputs, *, at: float,
            torch_dtype: Optional[str], quant_type: Optional[str]) -> None:
        self._outputs.setdefault((model, start, end), {})[peer_id] = _Output(at, outputs, torch_dtype, quant_type)

    def verdicts(self, model: str, start: int, end: int, now: float) -> dict[str, tuple[str, tuple[str, ...], float, float]]:
        """peer -> (verdict, peers it disagrees with, its largest error, its tolerance), over the
        fresh outputs for this segment; empty when fewer than two servers were compared."""
        fresh = {peer: out for peer, out in self._outputs.get((model, start, end), {}).items()
                 if out.at >= now - self.max_age}
        self._outputs[(model, start, end)] = fresh
        peers = sorted(fresh)
        if len(peers) < 2:
            return {}
        errors, allowed = {}, {}
        for i, a in enumerate(peers):
            for b in peers[i + 1:]:
                errors[(a, b)] = relative_error(fresh[a].outputs, fresh[b].outputs)
                allowed[(a, b)] = (tolerance(fresh[a].torch_dtype, fresh[a].quant_type, end - start)
                                   + tolerance(fresh[b].torch_dtype, fresh[b].quant_type, end - start))
        judged = cross_check(errors, allowed)
        result = {}
        for peer, (verdict, against) in judged.items():
            mine = [error for pair, error in errors.items() if peer in pair]
            limits = [limit for pair, limit in allowed.items() if peer in pair]
            result[peer] = (verdict, against, max(mine), min(limits))
        return result
