"""Specs of reading any tokenizer.json (``monitor.families.tokenizer``), checked against the reference.

tokenizers >= 0.20 saves what petals 2.2's tokenizers 0.14 cannot read (pair merges, the new Metaspace) or
reads with another meaning (``ignore_merges``). For the tiny Llama 3 and Mixtral checkpoints, saved by the
reference as the published ones are, and for variants the reference saves of them (a vocabulary where
``ignore_merges`` changes the tokens, Metaspace pre-tokenizers), each answer of our tokenizer is the
reference's (transformers 4.46.3 with tokenizers 0.20.3, in a child process, asked the same calls through
the same code): ids with and without special tokens, offsets, tokens, word ids, chat templates, decoding,
special tokens, padding and truncation. Nothing is mocked and no id is written here. The checkpoints our
stack reads already (tiny Llama, BLOOM, Falcon, the demo's SmolLM2) still load through plain AutoTokenizer.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import tokenizers
from transformers import AutoTokenizer

from monitor.families import load_tokenizer
from monitor.families.tokenizer import EmulatingBackend, TokenizerError, needs_conversion
from monitor.harness import reference
from support import require_reference
from monitor.harness.tiny_model import tiny_model as build_tiny

_spec = importlib.util.spec_from_file_location("tokenizer_calls", reference.SCRIPTS / "tokenizer_calls.py")
tokenizer_calls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tokenizer_calls)  # the calls' code, shared with the reference's side

TEXTS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
    "it's", "they'll", "We're here, aren't we? I'd say I've seen IT'S", "1234567", "3.14159 and 2024-01-01",
    " leading space", "  two leading spaces", "trailing space ", "tabs\tand\ttabs", "new\nlines\n\n\nand\r\nCRLF",
    "multiple     spaces   here", "Café naïve résumé über", "Привет, мир!", "日本語のテキスト 中文字符",
    "emoji 😀🎉👍🏽 done", "a\u00a0non-breaking space", "<|eot_id|>", "text <|eot_id|> more<|eot_id|>",
    "<|begin_of_text|>start", "<s>[INST] hi [/INST]", "hello</s> <s>again", "<unk>", "", " ", "\n", "x",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke about 1234567 cats 😀 — they'll love it."}],
    [{"role": "system", "content": "You answer briefly."},
     {"role": "user", "content": "Привет, мир!  It's  spaced\tout.\n"}],  # (Mixtral's template refuses it: both must)
]
PAIRS = [("Is this the first?", "And the second one."), ("<s>opening", " spaced second")]


@pytest.fixture(scope="module", autouse=True)
def _reference_installed():
    require_reference()


def calls_for(tokenizer, texts, *, conversations=(), pairs=(), pad_token=None) -> list:
    """The calls both tokenizers answer: every way in, and decoding (of our ids: equal ids are asserted too)."""
    calls = [{"op": "attributes"}, {"op": "tokens", "ids": list(range(len(tokenizer)))}]
    for text in texts:
        for add in (True, False):
            calls.append({"op": "call", "text": text, "kwargs": {"add_special_tokens": add, "return_offsets_mapping":
                                                                 True, "return_special_tokens_mask": True}})
        calls += [{"op": "encode", "text": text}, {"op": "tokenize", "text": text}]
    calls += [{"op": "call", "text": a, "pair": b, "kwargs": {"return_offsets_mapping": True}} for a, b in pairs]
    calls += [{"op": "chat", "messages": messages} for messages in conversations]
    long = " ".join(texts[:8])
    left = {"pad_token": pad_token, "padding_side": "left", "truncation_side": "left"}
    calls += [
        {"op": "call", "text": list(texts[:5]), "kwargs": {"padding": True}, "set": {"pad_token": pad_token}},
        {"op": "call", "text": list(texts[:5]), "set": {"pad_token": pad_token},
         "kwargs": {"padding": "max_length", "max_length": 48, "pad_to_multiple_of": 16, "truncation": True}},
        {"op": "call", "text": long, "kwargs": {"truncation": True, "max_length": 7}},
        {"op": "call", "text": long, "kwargs": {"truncation": True, "max_length": 9, "stride": 3,
                                                "return_overflowing_tokens": True, "return_offsets_mapping": True}},
        {"op": "call", "text": [long, *texts[:3]], "set": left, "kwargs": {
            "padding": True, "truncation": True, "max_length": 8, "stride": 2, "return_overflowing_tokens": True,
            "return_special_tokens_mask": True}},
    ]
    ids = [tokenizer(text, add_special_tokens=add)["input_ids"] for text in texts for add in (True, False)]
    for messages in conversations:
        try:
            ids.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        except Exception:  # noqa: BLE001 - a template that refuses the conversation: compared above
            pass
    for row in ids + [[i] for i in range(len(tokenizer))]:
        calls += [{"op": "decode", "ids": row, "kwargs": {"skip_special_tokens": skip}} for skip in (False, True)]
    return calls


def assert_as_the_reference(path: Path, tokenizer, calls: list) -> None:
    ours = json.loads(json.dumps(tokenizer_calls.answer(tokenizer, calls)))
    theirs = reference.run("tokenizer_calls", {"path": str(path), "calls": calls})["results"]
    differing = [(call, mine, reference_answer) for call, mine, reference_answer in zip(calls, ours, theirs)
                 if mine != reference_answer]
    assert not differing, f"{len(differing)} of {len(calls)} calls differ from the reference, first: {differing[:3]}"


@pytest.mark.parametrize("family", ["llama3", "mixtral"])
def test_a_new_format_tiny_checkpoint_tokenizes_as_the_reference(data_dir, family):
    path = build_tiny(data_dir, family).path
    assert needs_conversion(json.loads((path / "tokenizer.json").read_text()))  # pair merges, as 0.20 saves
    tokenizer = load_tokenizer(path)
    assert isinstance(tokenizer._tokenizer, EmulatingBackend) == (family == "llama3")  # its ignore_merges
    pad = tokenizer.eos_token
    assert_as_the_reference(path, tokenizer, calls_for(tokenizer, TEXTS, conversations=CONVERSATIONS, pairs=PAIRS,
                                                       pad_token=pad))


def ignore_merges_words(backend) -> list:
    """Vocabulary entries that a text pre-tokenizes to as one word but that plain BPE spells in pieces:
    the words ``ignore_merges`` makes one token."""
    words = []
    for token in backend.get_vocab(with_added_tokens=False):
        splits = backend.pre_tokenizer.pre_tokenize_str(backend.decoder.decode([token]))
        if [split for split, _ in splits] == [token] and len(backend.model.tokenize(token)) > 1:
            words.append(token)
    return words


def test_ignore_merges_makes_a_vocabulary_word_one_token_as_the_reference(data_dir, tmp_path):
    """Searched in the tiny Llama 3's vocabulary; trained BPE reaches each of its entries by merges, so the
    reference saves a variant with whole words added to it (as Llama 3's vocabulary has them)."""
    path = build_tiny(data_dir, "llama3").path
    backend = load_tokenizer(path)._tokenizer._inner
    words = ignore_merges_words(backend)
    if not words:
        sentence = "Tokenizers spell unusual words: capitalization, Berliners and collaboratively served models"
        splits = [split for split, _ in backend.pre_tokenizer.pre_tokenize_str(sentence)]
        words = [split for split in splits if len(backend.model.tokenize(split)) > 2][:4]
        path = tmp_path / "added-words"
        reference.run("build_tokenizer", {"source": str(build_tiny(data_dir, "llama3").path), "out": str(path),
                                          "kind": "add_words", "words": words})
        backend = load_tokenizer(path)._tokenizer._inner
        assert set(words) <= set(ignore_merges_words(backend))
    tokenizer = load_tokenizer(path)
    vocab = tokenizer.get_vocab()
    texts = [backend.decoder.decode([word]) for word in words]
    texts += [f"x{text}." for text in texts] + [f"Say{''.join(texts)} and{texts[0]}<|eot_id|>{texts[-1]}!"]
    for text, word in zip(texts, words):
        ours = tokenizer(text)["input_ids"]
        assert vocab[word] in ours and ours != backend.encode(text).ids, text
    conversation = [[{"role": "user", "content": texts[-1]}]]
    assert_as_the_reference(path, tokenizer, calls_for(tokenizer, texts + TEXTS[:6], conversations=conversation,
                                                       pairs=[(texts[0], texts[1])], pad_token="<|end_of_text|>"))
    with pytest.raises(ValueError, match="pre-tokenized"):
        tokenizer(texts[:2], is_split_into_words=True)

    saved = tmp_path / "saved"  # save_pretrained keeps ignore_merges: the reference reads it as it was
    tokenizer.save_pretrained(saved)
    again = load_tokenizer(saved)
    assert [again(text)["input_ids"] for text in texts] == [tokenizer(text)["input_ids"] for text in texts]
    assert_as_the_reference(saved, again, calls_for(again, texts[-2:]))


@pytest.mark.parametrize("scheme, split", [("first", False), ("first", True), ("always", True), ("never", True)])
def test_a_metaspace_pre_tokenizer_tokenizes_as_the_reference(data_dir, tmp_path, scheme, split):
    path = tmp_path / f"metaspace-{scheme}-{split}"
    reference.run("build_tokenizer", {"source": str(build_tiny(data_dir, "mixtral").path), "out": str(path),
                                      "kind": "metaspace", "prepend_scheme": scheme, "split": split})
    tokenizer = load_tokenizer(path)
    texts = TEXTS + ["<s>hello", "<s> hello", "hello<s>world", "▁already marked", "</s>"]
    assert_as_the_reference(path, tokenizer, calls_for(tokenizer, texts, conversations=CONVERSATIONS[:2],
                                                       pairs=PAIRS, pad_token="</s>"))
    assert isinstance(tokenizer._tokenizer, EmulatingBackend) == (scheme == "first")
    if scheme == "first":  # save_pretrained writes the scheme back: the reference reads it as it was
        tokenizer.save_pretrained(tmp_path / "saved")
        assert_as_the_reference(tmp_path / "saved", load_tokenizer(tmp_path / "saved"), calls_for(tokenizer, texts[-6:]))


def test_what_tokenizers_0_14_cannot_do_is_refused_in_one_line_naming_the_file(data_dir, tmp_path):
    source = json.loads((build_tiny(data_dir, "mixtral").path / "tokenizer.json").read_text())

    def saved(name: str, spec) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        text = spec if isinstance(spec, str) else json.dumps(spec)
        (directory / "tokenizer.json").write_text(text)
        return directory

    spaced = json.loads(json.dumps(source))
    spaced["model"]["merges"][0] = ["a b", "c"]
    unknown = {**source, "normalizer": {"type": "ByteLevel"}}  # (a normalizer 0.14 lacks)
    unknown_field = {**source, "decoder": {"type": "ByteFallback", "mode": "strict"}}
    always_unsplit = {**source, "normalizer": None,
                      "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                        "split": False}}
    plain_unknown = {**source, "normalizer": {"type": "ByteLevel"},
                     "model": {**source["model"], "merges": [" ".join(m) for m in source["model"]["merges"]]}}
    cases = {"not-json": ("{oops", "JSON"), "spaced-merge": (spaced, "space"),
             "unknown-normalizer": (unknown, "normalizer (ByteLevel)"),
             "unknown-field": (unknown_field, "decoder.mode"), "always-unsplit": (always_unsplit, "Metaspace"),
             "plain-unknown": (plain_unknown, "cannot be read")}
    for name, (spec, problem) in cases.items():
        directory = saved(name, spec)
        with pytest.raises(ValueError) as raised:
            load_tokenizer(directory)
        message = str(raised.value)
        assert isinstance(raised.value, TokenizerError) and "\n" not in message, message
        assert str(directory / "tokenizer.json") in message and problem in message, message


@pytest.mark.parametrize("family", ["llama", "bloom", "falcon", "smollm2"])
def test_an_old_format_checkpoint_loads_through_plain_autotokenizer(data_dir, family):
    if family == "smollm2":
        from monitor.harness.demo_model import ensure_demo_model

        path = ensure_demo_model(data_dir, progress=False)
    else:
        path = build_tiny(data_dir, family).path
    assert not needs_conversion(json.loads((path / "tokenizer.json").read_text()))
    ours, plain = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    assert type(ours) is type(plain) and type(ours._tokenizer) is tokenizers.Tokenizer
    assert ours._tokenizer.to_str() == plain._tokenizer.to_str() and ours.init_kwargs == plain.init_kwargs
    assert [ours(text)["input_ids"] for text in TEXTS] == [plain(text)["input_ids"] for text in TEXTS]
    if plain.chat_template:
        assert ours.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True) == \
            plain.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
