"""Spec: a local checkpoint is untrusted input (``monitor.families.checkpoint``, ``demo --checkpoint``).

Whatever folder an operator points ``swarm-monitor demo --checkpoint`` at, a checkpoint we cannot
serve costs one line naming the problem (and, for a family we do not serve, the ones we do), exit
status 1, and no traceback — before any server starts. Nothing here needs a swarm: the checks
read only config.json, the safetensors headers and file sizes.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from monitor.app.cli import main
from monitor.families import FAMILIES
from monitor.families.checkpoint import CheckpointError, Checkpoint, check_memory, describe, family_of, inspect


def write_safetensors(path: Path, tensors: dict[str, list[int]], *, truncate: int = 0) -> None:
    """A safetensors file of float32 zeros with these shapes (``truncate`` bytes cut off its end)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for n in shape:
            size *= n
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + bytes(offset)
    path.write_bytes(data[:len(data) - truncate] if truncate else data)


def llama_folder(tmp_path: Path, *, blocks: int = 2, config: dict | None = None, **weights) -> Path:
    folder = tmp_path / "Meta-Llama-3.1-8B-Instruct"
    folder.mkdir()
    cfg = {"model_type": "llama", "num_hidden_layers": blocks, "hidden_size": 8,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (folder / "config.json").write_text(json.dumps(config if config is not None else cfg))
    tensors = {"model.embed_tokens.weight": [16, 8], "lm_head.weight": [16, 8], "model.norm.weight": [8]}
    tensors.update({f"model.layers.{i}.mlp.up_proj.weight": [8, 8] for i in range(blocks)})
    write_safetensors(folder / "model.safetensors", tensors, **weights)
    return folder


def demo(*args: str):
    return CliRunner().invoke(main, ["demo", *args], catch_exceptions=False)


def test_a_published_layout_is_read_without_loading_it(tmp_path):
    checkpoint = inspect(llama_folder(tmp_path, blocks=3))
    assert checkpoint.family == "llama3" and checkpoint.num_blocks == 3
    # no dht_prefix in its config: petals' own rule (the repository's name, dots as dashes, "-hf")
    assert checkpoint.dht_prefix == "Meta-Llama-3-1-8B-Instruct-hf"
    assert checkpoint.block_params == 3 * 64 and checkpoint.other_params == 16 * 8 * 2 + 8
    assert describe(checkpoint.path) == FAMILIES["llama3"] == "Llama 3.x"


@pytest.mark.parametrize("config, family", [
    ({"model_type": "llama"}, "llama"),
    ({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}}, "llama"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3"),
    ({"model_type": "mixtral"}, "mixtral"), ({"model_type": "bloom"}, "bloom"), ({"model_type": "falcon"}, "falcon"),
    ({"model_type": "gpt2"}, None), ({"model_type": "llama", "rope_scaling": "llama3"}, "llama"),
])
def test_the_family_comes_from_the_config(config, family):
    assert family_of(config) == family


@pytest.mark.parametrize("damage, expected", [
    ("not a folder", "is not a directory"),
    ("no config", "no config.json"),
    ("config not json", "config.json: not readable JSON"),
    ("config a list", "config.json: not a JSON object"),
    ("unsupported family", "model_type 'gpt2' is not a family we serve; supported: BLOOM, Falcon, Llama 2, "
                           "Llama 3.x, Mixtral"),
    ("no blocks", "num_hidden_layers must be a whole number"),
    ("pickled weights only", "no *.safetensors weights (it has pytorch_model.bin: convert it to safetensors"),
    ("truncated weights", "lies outside the file (truncated or damaged)"),
    ("not safetensors", "not a safetensors file"),
    ("a block missing", "the weights hold no tensors for block 2"),
    ("bad prefix", "is not a valid model name"),
])
def test_a_checkpoint_we_cannot_serve_is_one_line_naming_the_problem(tmp_path, damage, expected):
    folder = tmp_path / "folder"
    if damage == "not a folder":
        folder.write_text("x")
    elif damage == "no config":
        folder.mkdir()
    elif damage == "config not json":
        folder.mkdir()
        (folder / "config.json").write_text("{model_type: llama")
    elif damage == "config a list":
        folder.mkdir()
        (folder / "config.json").write_text("[]")
    elif damage == "unsupported family":
        folder = llama_folder(tmp_path, config={"model_type": "gpt2", "n_layer": 2})
    elif damage == "no blocks":
        folder = llama_folder(tmp_path, config={"model_type": "llama", "num_hidden_layers": True})
    elif damage == "pickled weights only":
        folder = llama_folder(tmp_path)
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif damage == "truncated weights":
        folder = llama_folder(tmp_path, truncate=10)
    elif damage == "not safetensors":
        folder = llama_folder(tmp_path)
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"hello" + bytes(10))
    elif damage == "a block missing":
        folder = llama_folder(tmp_path, config={"model_type": "llama", "num_hidden_layers": 3})
    elif damage == "bad prefix":
        folder = llama_folder(tmp_path, config={"model_type": "llama", "num_hidden_layers": 2,
                                                "dht_prefix": "../../etc"})
    with pytest.raises(CheckpointError) as raised:
        inspect(folder)
    message = str(raised.value)
    assert expected in message and "\n" not in message, message

    result = demo("--checkpoint", str(folder), "--port", "0")  # the same line from the command, before any server
    assert result.exit_code == 1 and result.output.strip() == f"Error: {message}", result.output


def test_the_memory_a_layout_needs_is_checked_before_loading(tmp_path):
    checkpoint = Checkpoint(path=tmp_path, family="llama3", dht_prefix="big-hf", num_blocks=126,
                            block_params=126 * 3_200_000_000, other_params=2_100_000_000)  # ~ Llama 3.1 405B
    spans = [(0, 126), (0, 63), (63, 126)]
    with pytest.raises(CheckpointError) as raised:
        check_memory(checkpoint, spans, available=24 << 30)
    message = str(raised.value)
    # every block served twice, in float32, the client's embeddings and head, and each process's own
    expected = ((2 * 126 * 3_200_000_000 + 2_100_000_000) * 4 + 5 * (400 << 20)) / 2**30
    assert f"needs about {expected:.1f} GiB; 24.0 GiB is available" in message and "--servers" in message, message
    small = Checkpoint(path=tmp_path, family="mixtral", dht_prefix="tiny-hf", num_blocks=8, block_params=700_000,
                       other_params=100_000)
    check_memory(small, spans, available=24 << 30)  # a tiny one fits


def test_the_command_refuses_a_checkpoint_with_tiny_and_never_prints_a_traceback(tmp_path):
    folder = llama_folder(tmp_path, config={"model_type": "gpt2", "n_layer": 2})
    result = demo("--checkpoint", str(folder), "--tiny")
    assert result.exit_code == 2 and "pass one of them" in result.output
    # as an operator runs it: its own process, stderr and all
    run = subprocess.run([sys.executable, "-m", "monitor.app.cli", "demo", "--checkpoint", str(folder), "--port", "0"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SWARM_MONITOR_DATA_DIR": str(tmp_path / "data")})
    assert run.returncode == 1 and "Traceback" not in run.stderr + run.stdout, run.stderr
    assert run.stderr.strip().splitlines() == [f"Error: {folder}: model_type 'gpt2' is not a family we serve; "
                                               "supported: BLOOM, Falcon, Llama 2, Llama 3.x, Mixtral"], run.stderr
