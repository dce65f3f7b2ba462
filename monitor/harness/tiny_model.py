"""Tiny random checkpoints of every model family we serve (BLOOM, Falcon, Llama 2-style from
petals 2.2; Llama 3.x and Mixtral from petals' main branch), built offline, for tests and the fast demo.

No model hub is reachable here, so the swarm harness needs checkpoints it can make itself: a
byte-level BPE tokenizer trained with `tokenizers` on a small built-in text, and a model of each
family with random (seeded) weights, saved as a Hugging Face directory whose config carries
`dht_prefix`. Each is laid out as that family's published checkpoints are, because petals' server
finds a block's weights by the family's block prefix and its client loads the rest by key:

- Llama (``meta-llama/Llama-2-*-hf``, ``petals-team/StableBeluga2``): the causal LM's keys
  (``model.embed_tokens``, ``model.layers.N.…``, ``model.norm``, ``lm_head``), rotary positions,
  grouped key/value heads.
- BLOOM (``bigscience/bloom-petals``, ``bigscience/bloomz-petals``): the *base model's* keys
  (``word_embeddings``, ``word_embeddings_layernorm``, ``h.N.…``, ``ln_f``; no ``transformer.``
  prefix and no head: the head is tied to the embeddings), ALiBi positions.
- Falcon (``tiiuae/falcon-40b``, ``tiiuae/falcon-180B``): the causal LM's keys
  (``transformer.word_embeddings``, ``transformer.h.N.…``, ``transformer.ln_f``, head tied), the
  new decoder architecture (parallel attention and MLP, two layer norms per block), rotary
  positions and fewer key/value heads than query heads (``num_kv_heads``).

- Llama 3.x (``meta-llama/Llama-3.1-*``) and Mixtral (``mistralai/Mixtral-8x*``): saved by the
  reference transformers (``monitor.harness.reference``) exactly as the published ones are saved
  today: ``rope_type: llama3`` and grouped key/value heads; ``model_type: mixtral`` with routed
  experts (``model.layers.N.block_sparse_moe.…``); tokenizers with pair-format merges (Llama 3's
  with ``ignore_merges``) and each family's chat template.

A client sends only hidden states: every block builds its own causal mask and ALiBi or rotary
positions from the length of its attention cache, so the same probe and chat code serves all three.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from monitor.harness.checkpoints import build_once

FAMILIES = ("llama", "bloom", "falcon", "llama3", "mixtral")
REFERENCE_FAMILIES = ("llama3", "mixtral")  # saved by the reference transformers
DEFAULT_FAMILY = "llama"
TINY_NUM_BLOCKS = 8
TINY_DHT_PREFIX = "tiny-llama"  # the Llama one's (the default family's)
# bump a family's version when its recipe changes, so cached checkpoints are rebuilt
_VERSIONS = {"llama": 1, "bloom": 1, "falcon": 1, "llama3": 1, "mixtral": 1}

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


@dataclass(frozen=True)
class TinyModel:
    """One family's tiny checkpoint: where it is and how the swarm names it."""

    family: str
    path: Path
    dht_prefix: str
    num_blocks: int = TINY_NUM_BLOCKS

    @property
    def name(self) -> str:
        return f"{self.dht_prefix} (random)"


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; the tiny models are {', '.join(FAMILIES)}")
    return family


def tiny_dht_prefix(family: str = DEFAULT_FAMILY) -> str:
    return f"tiny-{check_family(family)}"


def tiny_model_path(data_dir: Path, family: str = DEFAULT_FAMILY) -> Path:
    return Path(data_dir) / "models" / f"{tiny_dht_prefix(family)}-v{_VERSIONS[family]}"


def ensure_tiny_model(data_dir: Path, *, family: str = DEFAULT_FAMILY, seed: int = 0) -> Path:
    """Build the family's checkpoint once and return its directory (cached; safe against concurrent
    builds)."""
    def build(scratch: Path) -> str:
        if family in REFERENCE_FAMILIES:
            from monitor.harness import reference

            saved = reference.run("build_checkpoint", {"family": family, "out": str(scratch), "seed": seed,
                                                       "dht_prefix": tiny_dht_prefix(family),
                                                       "num_blocks": TINY_NUM_BLOCKS})
            return f"{family}, seed {seed}, saved by transformers {saved['transformers']}"
        _build(scratch, family=family, seed=seed)
        return f"{family}, seed {seed}"

    return build_once(tiny_model_path(data_dir, family), build)


def tiny_model(data_dir: Path, family: str = DEFAULT_FAMILY, *, seed: int = 0) -> TinyModel:
    """The family's tiny checkpoint, built on first use."""
    path = ensure_tiny_model(data_dir, family=family, seed=seed)
    return TinyModel(family=family, path=path, dht_prefix=tiny_dht_prefix(family))


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


def _causal_lm(family: str, tokenizer):
    """The family's causal LM at tiny sizes (hidden 64, 4 query heads, 8 blocks)."""
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, torch_dtype="float32")
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_NUM_BLOCKS,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False,
            **special))
    if family == "bloom":
        from transformers import BloomConfig, BloomForCausalLM

        return BloomForCausalLM(BloomConfig(
            vocab_size=len(tokenizer), hidden_size=64, n_layer=TINY_NUM_BLOCKS, n_head=4,
            tie_word_embeddings=True, **special))
    from transformers import FalconConfig, FalconForCausalLM

    return FalconForCausalLM(FalconConfig(  # as Falcon-40B/180B: 128/232 query heads share 8 kv heads
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=TINY_NUM_BLOCKS, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True, parallel_attn=True, multi_query=True, alibi=False,
        bias=False, max_position_embeddings=512, tie_word_embeddings=True, **special))


def _build(out: Path, *, family: str, seed: int) -> None:
    import torch

    check_family(family)
    tokenizer = _train_tokenizer()
    torch.manual_seed(seed)
    model = _causal_lm(family, tokenizer)
    # Random weights at the default init give near-uniform logits; a larger scale makes greedy
    # decoding decisive, so token-for-token comparisons are meaningful.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.2)
    dht_prefix = tiny_dht_prefix(family)
    # BLOOM's petals checkpoints hold the base model (blocks under "h."), the head tied to its embeddings
    saved_model = model.transformer if family == "bloom" else model
    saved_model.config.dht_prefix = dht_prefix
    saved_model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved["dht_prefix"] = dht_prefix
    config_path.write_text(json.dumps(saved, indent=2) + "\n")


# A client side of a real model's size (Llama 3.1's vocabulary of 128,256, its hidden size) with one or
# two blocks (at hidden 8192 a block is 150M parameters however small its MLP, so the benchmark's have one,
# served in bfloat16: the servers share this machine's two cores with the chat): what the chat's own
# compute is measured and specified on (``chat.head_step``). "wide" is
# the specs' (small enough for make test), "70b" and "405b" the benchmark's (the head and embeddings of
# Llama-3.1-70B and -405B; their blocks served as they are, with a small MLP).
WIDE_SHAPES = {
    "wide": dict(hidden_size=512, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=128256, dtype="float32", num_blocks=2),
    "70b": dict(hidden_size=8192, intermediate_size=1024, num_attention_heads=64, num_key_value_heads=8,
                vocab_size=128256, dtype="bfloat16", num_blocks=1),
    "405b": dict(hidden_size=16384, intermediate_size=1024, num_attention_heads=128, num_key_value_heads=8,
                 vocab_size=128256, dtype="bfloat16", num_blocks=1),
}
_WIDE_VERSION = {"wide": 1, "70b": 2, "405b": 1}


def wide_model(data_dir: Path, size: str = "wide", *, seed: int = 0) -> TinyModel:
    """A Llama 3.1-style checkpoint with a client side of ``WIDE_SHAPES[size]`` (built on first use by
    the reference transformers, its tokenizer grown to the full vocabulary)."""
    shape = dict(WIDE_SHAPES[size])
    num_blocks = shape.pop("num_blocks")
    prefix = f"llama3-{size}-head"
    path = Path(data_dir) / "models" / f"{prefix}-v{_WIDE_VERSION[size]}"

    def build(scratch: Path) -> str:
        from monitor.harness import reference

        saved = reference.run("build_checkpoint", {"family": "llama3", "out": str(scratch), "seed": seed,
                                                   "dht_prefix": prefix, "num_blocks": num_blocks, "shape": shape},
                              timeout=1800)
        return f"llama3 {size}, seed {seed}, saved by transformers {saved['transformers']}"

    return TinyModel(family="llama3", path=build_once(path, build), dht_prefix=prefix, num_blocks=num_blocks)
