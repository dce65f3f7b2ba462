"""Save a tiny random checkpoint of a newer family with the reference transformers, laid out as the
published ones are saved today (safetensors, causal-LM keys, a tokenizer.json with pair-format merges).

stdin: {"family": "llama3" | "mixtral", "out": DIR, "dht_prefix": STR, "num_blocks": 8, "seed": 0,
        "shape": {...}}   (optional, llama3 only: a client side of a real model's size — ``hidden_size``,
        ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``, ``vocab_size``, ``dtype``:
        the tokenizer grows to the vocabulary with words "<rN>" that only decoding meets, as Llama 3's
        reserved tokens fill its own)
stdout: {"transformers": VERSION, "tokenizers": VERSION, "vocab_size": N}
Runs only with the reference first on PYTHONPATH (monitor.harness.reference.run).
"""

import json
import sys

import tokenizers
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from build_tokenizer import add_words
from corpus import CORPUS

# Llama 3's pre-tokenizer pattern, as published in its tokenizer.json
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MIXTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


def llama3_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE as Llama 3's: its split pattern, ``ignore_merges``, BOS added by the template."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    tok.add_special_tokens(LLAMA3_SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   clean_up_tokenization_spaces=True,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = LLAMA3_TEMPLATE
    return fast


def mixtral_tokenizer() -> PreTrainedTokenizerFast:
    """Sentencepiece-style BPE as Mistral's: "▁" for spaces, byte fallback, BOS added by the template."""
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained.train_from_iterator(CORPUS.splitlines(), trainer=trainers.BpeTrainer(vocab_size=500, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = MIXTRAL_TEMPLATE
    return fast


def widened(tokenizer: PreTrainedTokenizerFast, vocab_size: int) -> PreTrainedTokenizerFast:
    """The tokenizer with words "<r0>", "<r1>" … after its vocabulary (its special tokens moved up behind
    them, as Llama 3's sit at the end) until it holds ``vocab_size`` ids: every id a head of that size
    can pick decodes to text. No pre-token ever spells "<rN>" (punctuation splits from letters), so
    encoding is unchanged."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    config = {}
    words = [f"<r{i}>" for i in range(vocab_size - len(tokenizer))]
    add_words(spec, config, words)
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                                   clean_up_tokenization_spaces=True,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = tokenizer.chat_template
    assert len(fast) == vocab_size, (len(fast), vocab_size)
    return fast


def causal_lm(family: str, tokenizer, num_blocks: int, shape: dict = None):
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   torch_dtype=(shape or {}).get("dtype", "float32"))
    if family == "llama3":  # as Llama-3.1: GQA, llama3 rotary scaling, untied head, head_dim given
        from transformers import LlamaConfig, LlamaForCausalLM

        size = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        if shape:
            size = {key: shape[key] for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_key_value_heads")}
            size["head_dim"] = size["hidden_size"] // size["num_attention_heads"]
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), num_hidden_layers=num_blocks, **size, max_position_embeddings=4096,
            rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 256},
            **special))
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(  # as Mixtral-8x7B/8x22B: 8 experts, 2 per token, GQA
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=num_blocks,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=4096, rope_theta=1e6, sliding_window=None, tie_word_embeddings=False, **special))


def main() -> None:
    args = json.loads(sys.stdin.read())
    family = args["family"]
    shape = args.get("shape")
    tokenizer = llama3_tokenizer() if family == "llama3" else mixtral_tokenizer()
    if shape:
        tokenizer = widened(tokenizer, shape["vocab_size"])
        torch.set_default_dtype(getattr(torch, shape.get("dtype", "float32")))  # built in its own precision
    torch.manual_seed(args.get("seed", 0))
    model = causal_lm(family, tokenizer, args.get("num_blocks", 8), shape)
    # Default init gives near-uniform logits; a larger scale makes greedy decoding decisive (at a
    # real hidden size, the scale that keeps a row's logits as spread as the tiny models' are).
    scale = 0.2 * (64 / shape["hidden_size"]) ** 0.5 if shape else 0.2
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, scale)
    model.config.dht_prefix = args["dht_prefix"]
    model.save_pretrained(args["out"], safe_serialization=True)
    tokenizer.save_pretrained(args["out"])
    print(json.dumps({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                      "vocab_size": len(tokenizer)}))


if __name__ == "__main__":
    main()
