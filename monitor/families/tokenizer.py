"""Tokenizers saved by any tokenizers version (filled in by the tokenizer work)."""


def load_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
