"""Save a variant of a tiny checkpoint's tokenizer, as the reference tokenizers writes it: the cases the
tiny checkpoints lack that our reading of new tokenizer.json files must still get right.

stdin: {"source": DIR, "out": DIR, "kind": KIND, ...}; stdout: {"tokenizers": VERSION}
  kind "add_words", "words": [STR]: the source's BPE with each word (a pre-tokenized word, in the model's
      alphabet) added to its vocabulary, no merge leading to it: with ``ignore_merges`` such a word is one
      token, without it BPE spells it in pieces.
  kind "metaspace", "prepend_scheme": "always" | "first" | "never", "split": BOOL: the source's
      sentencepiece-style BPE with a ``Metaspace`` pre-tokenizer and decoder in place of its normalizer
      (as Mistral's and non-legacy Llama tokenizers are saved today).
The checkpoint's tokenizer config files are written beside it.
"""

import json
import sys
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, pre_tokenizers

COPIED = ("tokenizer_config.json", "special_tokens_map.json")


def add_words(spec: dict, config: dict, words: list) -> None:
    """The words take the ids after the model's vocabulary; the added tokens move up behind them (in the
    post-processor's templates and the config's ``added_tokens_decoder`` too)."""
    vocab = spec["model"]["vocab"]
    new = [word for word in dict.fromkeys(words) if word not in vocab]
    first = max(vocab.values()) + 1
    moved = {t["id"]: t["id"] + len(new) for t in spec["added_tokens"] if t["id"] >= first}
    vocab.update({word: first + i for i, word in enumerate(new)})
    for token in spec["added_tokens"]:
        token["id"] = moved.get(token["id"], token["id"])
    _renumber(spec.get("post_processor"), moved)
    decoder = config.get("added_tokens_decoder") or {}
    config["added_tokens_decoder"] = {str(moved.get(int(k), int(k))): v for k, v in decoder.items()}


def _renumber(node, moved: dict) -> None:
    """Special token ids in a post-processor (TemplateProcessing's ``"ids"`` lists), in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "ids" and isinstance(value, list):
                node[key] = [moved.get(i, i) for i in value]
            else:
                _renumber(value, moved)
    elif isinstance(node, list):
        for item in node:
            _renumber(item, moved)


def metaspace(spec: dict, prepend_scheme: str, split: bool) -> dict:
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme, split=split)
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme=prepend_scheme, split=split),
                                     decoders.ByteFallback(), decoders.Fuse()])
    return json.loads(tok.to_str())


def main() -> None:
    args = json.loads(sys.stdin.read())
    source, out = Path(args["source"]), Path(args["out"])
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    configs = {name: json.loads((source / name).read_text(encoding="utf-8"))
               for name in COPIED if (source / name).is_file()}
    if args["kind"] == "add_words":
        add_words(spec, configs.setdefault("tokenizer_config.json", {}), args["words"])
    elif args["kind"] == "metaspace":
        spec = metaspace(spec, args["prepend_scheme"], args["split"])
    else:
        raise ValueError(f"unknown kind {args['kind']!r}")
    out.mkdir(parents=True, exist_ok=True)
    Tokenizer.from_str(json.dumps(spec)).save(str(out / "tokenizer.json"))  # as this version writes it
    for name, config in configs.items():
        (out / name).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    print(json.dumps({"tokenizers": tokenizers.__version__}))


if __name__ == "__main__":
    main()
