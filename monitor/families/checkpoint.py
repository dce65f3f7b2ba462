"""A local checkpoint, read as untrusted input before anything loads it: which family it is, its DHT
prefix and block count, and how much memory serving it takes.

``swarm-monitor demo --checkpoint PATH`` reads a directory someone downloaded or converted; a wrong
one must cost a one-line error that names the problem and the supported families, never a
traceback and never a half-started swarm. Nothing here runs code from the checkpoint: only
``config.json`` (JSON), the safetensors headers (JSON, bounded) and file sizes are read. Weights are
loaded later by petals' own loaders, from safetensors only (no pickle); ``auto_map`` and custom
code are never honoured (nothing passes ``trust_remote_code``).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from monitor.families import FAMILIES

MAX_CONFIG_BYTES = 1 << 20
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit for a header
MAX_BLOCKS = 1024
SERVE_DTYPE_BYTES = 4  # the harness's servers and the chat compute in float32
PROCESS_OVERHEAD = 400 << 20  # a python + torch + petals process before any weights
MEMORY_MARGIN = 0.9  # of the memory available now, what serving may take
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
BLOCK_KEY = re.compile(r"^(?:model\.layers|transformer\.h|h)\.(\d+)\.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be served; its message is one line meant for the operator."""


def supported() -> str:
    return ", ".join(FAMILIES.values())


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    family: str
    dht_prefix: str
    num_blocks: int
    block_params: int  # parameters of all blocks together
    other_params: int  # embeddings, final norm, head: what a client loads
    largest_file: int = 0  # bytes of tensor data in its largest safetensors file (read whole while loading)

    @property
    def label(self) -> str:
        return FAMILIES[self.family]

    def memory_needed(self, spans: list[tuple[int, int]]) -> int:
        """Bytes to serve ``spans`` (one server each) and the monitor's chat beside them."""
        per_block = self.block_params / max(1, self.num_blocks) * SERVE_DTYPE_BYTES
        servers = sum((end - start) * per_block for start, end in spans)
        return int(servers + self.other_params * SERVE_DTYPE_BYTES + (len(spans) + 2) * PROCESS_OVERHEAD)


def family_of(config: dict) -> Optional[str]:
    """The family a config.json describes, or None if it is none we serve."""
    model_type = config.get("model_type")
    if model_type == "llama":
        scaling = config.get("rope_scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        return "llama3" if kind == "llama3" else "llama"
    if model_type in ("bloom", "falcon", "mixtral"):
        return model_type
    return None


def describe(path) -> Optional[str]:
    """How people know the family of the checkpoint at ``path`` ("Llama 3.x …"), or None."""
    try:
        family = family_of(_config(Path(path)))
    except CheckpointError:
        return None
    return FAMILIES.get(family) if family else None


def default_dht_prefix(path: Path) -> str:
    """petals' own rule for a model's DHT prefix: the repository's name, dots as dashes, "-hf"."""
    prefix = path.name.replace(".", "-")
    return prefix if prefix.endswith("-hf") else prefix + "-hf"


def inspect(path) -> Checkpoint:
    """Read the checkpoint at ``path``; raise CheckpointError naming what is wrong."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory (a checkpoint is a folder with config.json and "
                              f"*.safetensors)")
    config = _config(path)
    family = family_of(config)
    if family is None:
        raise CheckpointError(f"{path}: model_type {config.get('model_type')!r} is not a family we serve; "
                              f"supported: {supported()}")
    num_blocks = config.get("num_hidden_layers", config.get("n_layer"))
    if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or not 1 <= num_blocks <= MAX_BLOCKS:
        raise CheckpointError(f"{path}/config.json: num_hidden_layers must be a whole number from 1 to "
                              f"{MAX_BLOCKS}, got {num_blocks!r}")
    prefix = config.get("dht_prefix") or default_dht_prefix(path)
    if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", prefix):
        raise CheckpointError(f"{path}/config.json: dht_prefix {prefix!r} is not a valid model name "
                              f"(letters, digits, '.', '_', '-'; at most 128)")
    blocks, other, seen, largest = _parameters(path)
    missing = sorted(set(range(num_blocks)) - seen)
    if missing:
        raise CheckpointError(f"{path}: the weights hold no tensors for block {missing[0]}"
                              f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''} of {num_blocks}")
    return Checkpoint(path=path, family=family, dht_prefix=prefix, num_blocks=num_blocks, block_params=blocks,
                      other_params=other, largest_file=largest)


def check_memory(checkpoint: Checkpoint, spans: list[tuple[int, int]], available: Optional[int] = None) -> None:
    """Refuse, before loading anything, a layout this machine's memory cannot hold."""
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    needed = checkpoint.memory_needed(spans)
    if needed > available * MEMORY_MARGIN:
        raise CheckpointError(
            f"{checkpoint.path.name}: serving {len(spans)} server(s) of its {checkpoint.num_blocks} blocks in float32 "
            f"needs about {needed / 2**30:.1f} GiB; {available / 2**30:.1f} GiB is available "
            f"(use fewer --servers, or a smaller checkpoint)")


def _config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: no config.json (a checkpoint is a folder with config.json and *.safetensors)")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{file}: larger than {MAX_CONFIG_BYTES >> 10} KiB; not a model config")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: not readable JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: not a JSON object")
    return config


def _parameters(path: Path) -> tuple[int, int, set[int], int]:
    """(block parameters, other parameters, block indices seen, the largest file's tensor bytes) from
    the safetensors headers."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in path.glob("*.bin"))
        hint = f" (it has {', '.join(pickled[:2])}: convert it to safetensors; pickled weights are not loaded)" \
            if pickled else ""
        raise CheckpointError(f"{path}: no *.safetensors weights{hint}")
    blocks = other = largest = 0
    seen: set[int] = set()
    for file in files:
        header, data_bytes = _header(file)
        largest = max(largest, data_bytes)
        for key, info in header.items():
            if key == "__metadata__":
                continue
            if not isinstance(info, dict) or info.get("dtype") not in DTYPE_BYTES or \
                    not isinstance(info.get("shape"), list) or \
                    not all(isinstance(n, int) and 0 <= n < 2**40 for n in info["shape"]):
                raise CheckpointError(f"{file.name}: tensor {str(key)[:80]!r} has a malformed entry")
            count = 1
            for n in info["shape"]:
                count *= n
            offsets = info.get("data_offsets")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                    and 0 <= offsets[0] <= offsets[1] <= data_bytes
                    and offsets[1] - offsets[0] == count * DTYPE_BYTES[info["dtype"]]):
                raise CheckpointError(f"{file.name}: tensor {str(key)[:80]!r} lies outside the file "
                                      f"(truncated or damaged)")
            match = BLOCK_KEY.match(key)
            if match:
                blocks += count
                seen.add(int(match.group(1)))
            else:
                other += count
    return blocks, other, seen, largest


def _header(file: Path) -> tuple[dict, int]:
    """The header of a safetensors file and how many bytes of tensor data follow it."""
    try:
        with file.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{file.name}: truncated (no safetensors header)")
            (size,) = struct.unpack("<Q", raw)
            if not 2 <= size <= MAX_HEADER_BYTES or size + 8 > file.stat().st_size:
                raise CheckpointError(f"{file.name}: not a safetensors file (header length {size})")
            header = json.loads(f.read(size))
    except OSError as e:
        raise CheckpointError(f"{file.name}: cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{file.name}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{file.name}: not a safetensors file (its header is not an object)")
    return header, file.stat().st_size - 8 - size
