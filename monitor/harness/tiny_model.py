"""A tiny random Llama checkpoint, built offline, for tests and the fast demo.

No model hub is reachable here, so the swarm harness needs a checkpoint it can make itself:
a byte-level BPE tokenizer trained with `tokenizers` on a small built-in text, and a Llama with
random (seeded) weights, saved as a Hugging Face directory whose config carries `dht_prefix`.
"""

from __future__ import annotations

import json
from pathlib import Path

from monitor.harness.checkpoints import build_once

TINY_DHT_PREFIX = "tiny-llama"
TINY_NUM_BLOCKS = 8
_VERSION = 1  # bump when the recipe changes, so cached checkpoints are rebuilt

_CORPUS = """\
Petals runs large language models collaboratively. A model is cut into transformer blocks,
volunteer servers each serve a range of blocks, and they announce themselves in a distributed hash table.
A client walks a route of servers that together cover all blocks. The monitor shows which models are
fully served, which blocks are missing or served by a single server, and how fast each server answers.
The quick brown fox jumps over the lazy dog. 0123456789 Hello, world! What is the capital of France?
Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of Italy.
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_model_path(data_dir: Path) -> Path:
    return Path(data_dir) / "models" / f"{TINY_DHT_PREFIX}-v{_VERSION}"


def ensure_tiny_model(data_dir: Path, *, seed: int = 0) -> Path:
    """Build the checkpoint once and return its directory (cached; safe against concurrent builds)."""
    def build(scratch: Path) -> str:
        _build(scratch, seed=seed)
        return f"seed {seed}"

    return build_once(tiny_model_path(data_dir), build)


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build(out: Path, *, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=TINY_NUM_BLOCKS,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Random weights at the default init give near-uniform logits; a larger scale makes greedy
    # decoding decisive, so token-for-token comparisons are meaningful.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.2)
    model.config.dht_prefix = TINY_DHT_PREFIX
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved["dht_prefix"] = TINY_DHT_PREFIX
    config_path.write_text(json.dumps(saved, indent=2) + "\n")
