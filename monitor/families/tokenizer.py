"""Read any ``tokenizer.json`` and tokenize exactly as the tokenizers library that wrote it does.

petals 2.2 pins transformers 4.34 and tokenizers 0.14, but the checkpoints published today were saved by
tokenizers >= 0.20, which writes what 0.14 cannot read, or reads with another meaning:

- BPE merges as pairs (``[["Ġ", "a"], ...]``): 0.14 reads only ``"Ġ a"`` strings and fails ("data did not
  match any variant of untagged enum ModelWrapper").
- ``ignore_merges`` (Llama 3): a pre-tokenized word that is itself in the vocabulary is that one token,
  whatever the merges say. 0.14 drops the field without a word and spells such words in pieces: other ids,
  so another prompt for the model.
- ``Metaspace`` with ``prepend_scheme``/``split`` (Mistral's and non-legacy Llama tokenizers) instead of
  0.14's ``add_prefix_space``: 0.14 fails to read it.

What 0.14 reads with its meaning goes through ``AutoTokenizer.from_pretrained`` untouched. Anything else is
converted into what 0.14 reads with the same meaning (:func:`convert`); what its format cannot say
(``ignore_merges``, the "first" prepend scheme) is emulated around its encoder (:class:`EmulatingBackend`),
beneath transformers, so that every way in (``tok(...)``, ``encode``, ``apply_chat_template``,
``tokenize``) takes it. The converted tokenizer is handed to transformers' own loader, which reads
``tokenizer_config.json`` and ``special_tokens_map.json`` as it always does. What neither conversion nor
emulation covers is refused in one line (:class:`TokenizerError`), never tokenized differently.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

FILE = "tokenizer.json"
_COMPONENTS = ("model", "normalizer", "pre_tokenizer", "post_processor", "decoder")
_UNCOMPARED = frozenset({"vocab", "merges"})  # too big to walk, and converted by hand
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenizerError(ValueError):
    """A tokenizer that cannot be read, or asked for what its emulation cannot do: one line."""


def load_tokenizer(path) -> Any:
    """The checkpoint's transformers tokenizer, tokenizing as the tokenizers version that saved it."""
    directory = Path(path)
    file = directory / FILE
    spec = _read_spec(file) if file.is_file() else None
    if spec is None or not needs_conversion(spec):
        return _from_pretrained(directory, file)
    return _from_pretrained(directory, file, tokenizer_object=build_backend(spec, file))


def _from_pretrained(directory: Path, file: Path, **kwargs) -> Any:
    """transformers' own loader (class, special tokens, chat template, added tokens from the config files);
    ``tokenizer_object`` replaces only what it would have read from ``tokenizer.json``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), **kwargs)
    except TokenizerError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, the user gets one line
        where = file if file.is_file() else directory
        raise TokenizerError(f"{where}: the tokenizer cannot be read: {_one_line(e)}") from None


def _read_spec(file: Path) -> dict:
    try:
        spec = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TokenizerError(f"{file}: not a readable JSON file: {_one_line(e)}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise TokenizerError(f"{file}: not a tokenizers file (no \"model\" object)")
    return spec


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


# ---- what needs converting -----------------------------------------------------------------------


def needs_conversion(spec: dict) -> bool:
    """Whether tokenizers 0.14 would fail on ``spec`` or read it with another meaning."""
    model = spec.get("model") or {}
    if "merges" in model and (model.get("ignore_merges") or any(not isinstance(m, str) for m in model["merges"])):
        return True
    return any(not _native(kind, node) for kind, node in _metaspaces(spec))


def _metaspaces(spec: dict) -> Iterator[tuple[str, dict]]:
    """("pre_tokenizer" | "decoder", node) for each Metaspace, within Sequences too."""
    for kind, key in (("pre_tokenizer", "pretokenizers"), ("decoder", "decoders")):
        node = spec.get(kind)
        for item in (node.get(key) or []) if isinstance(node, dict) and node.get("type") == "Sequence" else [node]:
            if isinstance(item, dict) and item.get("type") == "Metaspace":
                yield kind, item


def _scheme(node: dict) -> tuple[str, bool]:
    """(prepend scheme, split) of a Metaspace node, whichever version wrote it: 0.15-0.18 wrote
    ``add_prefix_space`` beside ``prepend_scheme`` (false meant never), 0.19 on only the latter and ``split``."""
    scheme = "never" if node.get("add_prefix_space") is False else node.get("prepend_scheme", "always")
    return scheme, bool(node.get("split", True))


def _native(kind: str, node: dict) -> bool:
    """Whether 0.14 reads this Metaspace node and means what its writer meant."""
    if "add_prefix_space" not in node:
        return False
    scheme, split = _scheme(node)
    if kind == "decoder":  # the decoder only drops the first token's leading space, or not
        return (scheme != "never") == bool(node["add_prefix_space"])
    return split and scheme == ("always" if node["add_prefix_space"] else "never")


# ---- converting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Emulation:
    """What the converted tokenizer must do that tokenizers 0.14's format cannot say."""

    ignore_merges: bool = False
    #: the Metaspace replacement when its prepend scheme is "first": a space goes in front of the text
    prefix: Optional[str] = None
    #: the source's components that 0.14 holds translated, written back when the tokenizer is saved
    saved: dict = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.ignore_merges or self.prefix is not None


def convert(spec: dict, file: Path) -> tuple[dict, Emulation]:
    """``spec`` as tokenizers 0.14 reads it with the same meaning, and what is left to emulate."""
    spec = json.loads(json.dumps(spec))  # (a deep copy)
    ignore_merges = _convert_model(spec["model"], file)
    saved = {key: spec.get(key) for key in ("normalizer", "pre_tokenizer")}
    prefix = _convert_pre_tokenizer(spec, file)
    for kind, node in list(_metaspaces(spec)):
        if kind == "decoder":  # (it drops the first token's leading replacement unless the scheme is never)
            scheme, _ = _scheme(node)
            replacement = node.get("replacement", "▁")
            node.clear()
            node.update(type="Metaspace", replacement=replacement, add_prefix_space=scheme != "never")
    return spec, Emulation(ignore_merges=ignore_merges, prefix=prefix, saved=saved if prefix is not None else {})


def _convert_model(model: dict, file: Path) -> bool:
    """Pair merges as "a b" strings; returns whether ``ignore_merges`` is to be emulated (tokenizers skips
    it when the model drops merges out at random)."""
    if "merges" not in model:
        return False
    merges = []
    for merge in model["merges"]:
        if not isinstance(merge, str):
            if not isinstance(merge, list) or len(merge) != 2 or any(not isinstance(p, str) or " " in p for p in merge):
                raise TokenizerError(f"{file}: the merge {merge!r} has a part with a space (or is not a pair), "
                                     "which tokenizers 0.14's \"a b\" merges cannot spell")
            merge = f"{merge[0]} {merge[1]}"
        merges.append(merge)
    model["merges"] = merges
    return bool(model.pop("ignore_merges", False)) and not model.get("dropout")


def _convert_pre_tokenizer(spec: dict, file: Path) -> Optional[str]:
    """Metaspace pre-tokenizers as 0.14 says them. One that does not split becomes a space-replacing
    normalizer (the same text for the model when it comes first); the "first" prepend scheme becomes 0.14's
    "never" plus the emulation's leading space (returned: the replacement). "always" without splitting has
    no 0.14 equivalent."""
    node = spec.get("pre_tokenizer")
    in_sequence = isinstance(node, dict) and node.get("type") == "Sequence"
    items = list(node.get("pretokenizers") or []) if isinstance(node, dict) and in_sequence else [node]
    prefix = None
    for index, item in enumerate(items):
        if not (isinstance(item, dict) and item.get("type") == "Metaspace") or _native("pre_tokenizer", item):
            continue
        scheme, split = _scheme(item)
        replacement = item.get("replacement", "▁")
        if (scheme == "first" or not split) and index != 0:
            raise TokenizerError(f"{file}: a Metaspace pre-tokenizer (prepend_scheme {scheme!r}, split {split}) "
                                 "after another one, which tokenizers 0.14 cannot do")
        if scheme == "always" and not split:
            raise TokenizerError(f"{file}: a Metaspace pre-tokenizer with prepend_scheme 'always' and split false, "
                                 "which tokenizers 0.14 cannot do")
        if split:
            items[index] = {"type": "Metaspace", "replacement": replacement, "add_prefix_space": scheme == "always"}
        else:
            items[index] = None
            replace = {"type": "Replace", "pattern": {"String": " "}, "content": replacement}
            normalizer = spec.get("normalizer")
            spec["normalizer"] = replace if normalizer is None else {"type": "Sequence",
                                                                      "normalizers": [normalizer, replace]}
        if scheme == "first":
            prefix = replacement
    items = [item for item in items if item is not None]
    if in_sequence:
        spec["pre_tokenizer"] = {**(node or {}), "pretokenizers": items} if items else None
    else:
        spec["pre_tokenizer"] = items[0] if items else None
    return prefix


def build_backend(spec: dict, file: Path) -> Any:
    """The tokenizers 0.14 ``Tokenizer`` of a converted ``spec``, emulating what its format cannot say."""
    from tokenizers import Tokenizer

    converted, emulation = convert(spec, file)
    try:
        inner = Tokenizer.from_str(json.dumps(converted))
    except Exception as e:  # noqa: BLE001 - the Rust side's message, in one line
        raise TokenizerError(f"{file}: tokenizers 0.14 cannot read its {_unreadable_part(converted)}: "
                             f"{_one_line(e)}") from None
    back = json.loads(inner.to_str())
    dropped = [path for key in _COMPONENTS for path in _dropped(converted.get(key), back.get(key), key)]
    if dropped:
        raise TokenizerError(f"{file}: tokenizers 0.14 does not know {', '.join(dropped[:4])}"
                             f"{' and more' if len(dropped) > 4 else ''}, so it would tokenize otherwise")
    return EmulatingBackend(inner, emulation) if emulation.active else inner


def _dropped(ours: Any, back: Any, where: str) -> Iterator[str]:
    """The fields of ``ours`` that 0.14 dropped while reading it (it ignores fields it does not know) and
    that say something (a false or null field says what leaving it out says)."""
    if isinstance(ours, dict) and isinstance(back, dict):
        for key, value in ours.items():
            if key in _UNCOMPARED:
                continue
            if key not in back:
                if value is not None and value is not False:
                    yield f"{where}.{key}"
            else:
                yield from _dropped(value, back[key], f"{where}.{key}")
    elif isinstance(ours, list) and isinstance(back, list) and len(ours) == len(back):
        for index, (a, b) in enumerate(zip(ours, back)):
            yield from _dropped(a, b, f"{where}[{index}]")


def _unreadable_part(converted: dict) -> str:
    """Which component 0.14 fails on, tried one at a time beside an empty model."""
    from tokenizers import Tokenizer, models

    empty = json.loads(Tokenizer(models.BPE()).to_str())
    for key in _COMPONENTS:
        try:
            Tokenizer.from_str(json.dumps({**empty, "added_tokens": [], key: converted.get(key)}))
        except Exception:  # noqa: BLE001 - that is the one
            kind = (converted.get(key) or {}).get("type") if isinstance(converted.get(key), dict) else None
            return f"{key}{f' ({kind})' if kind else ''}"
    return "added tokens, truncation or padding"


# ---- emulating ---------------------------------------------------------------------------------------


class EmulatingBackend:
    """A tokenizers 0.14 ``Tokenizer`` that encodes as tokenizers 0.20 does; everything but encoding (vocab,
    decoding, special tokens, settings) is the inner tokenizer's, attributes set on it included.

    ``ignore_merges``: the inner tokenizer encodes; then each run of tokens sharing a word id (0.14 numbers
    each pre-tokenized split, added tokens included, within each sequence; the post-processor's tokens have
    none) whose spelling (the concatenated tokens; byte-fallback tokens read back as text) is a vocabulary
    entry becomes that entry, as 0.20's BPE makes a split found in its vocabulary one token.
    Metaspace "first": a space goes in front of each sequence whose text does not start with a space or an
    added token, as 0.20 prepends the replacement to the piece at the text's start; offsets are shifted back.

    Encoding runs without the inner tokenizer's truncation and padding, which apply to the emulated tokens
    afterwards as tokenizers applies them (single sequences; a pair is refused when it is truncated).
    Pre-tokenized input is refused: its word ids do not tell the splits apart.
    """

    _OWN = ("_inner", "_emulation", "_cache")

    def __init__(self, inner: Any, emulation: Emulation):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_emulation", emulation)
        object.__setattr__(self, "_cache", {})

    def __getattr__(self, name: str) -> Any:
        if name in EmulatingBackend._OWN or name.startswith("__"):  # (no recursion; copy and pickle are ours)
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __reduce__(self):
        return EmulatingBackend, (self._inner, self._emulation)

    # -- saving: the source's meaning, readable by 0.20 and by load_tokenizer again

    def to_str(self, pretty: bool = False) -> str:
        spec = json.loads(self._inner.to_str())
        if self._emulation.ignore_merges:
            spec["model"]["ignore_merges"] = True
        spec.update(self._emulation.saved)
        return json.dumps(spec, ensure_ascii=False, indent=2 if pretty else None)

    def save(self, path: str, pretty: bool = True) -> None:
        Path(path).write_text(self.to_str(pretty), encoding="utf-8")

    # -- encoding

    def encode(self, sequence, pair=None, is_pretokenized: bool = False, add_special_tokens: bool = True):
        item = sequence if pair is None else (sequence, pair)
        return self.encode_batch([item], is_pretokenized=is_pretokenized, add_special_tokens=add_special_tokens)[0]

    def encode_batch(self, input, is_pretokenized: bool = False, add_special_tokens: bool = True) -> list:
        if is_pretokenized:
            raise TokenizerError("pre-tokenized input (is_split_into_words) is not supported by this tokenizer "
                                 "(its ignore_merges or Metaspace 'first' scheme is emulated on whole texts)")
        items = [tuple(item) if isinstance(item, (tuple, list)) else (item, None) for item in input]
        inner, truncation, padding = self._inner, self._inner.truncation, self._inner.padding
        with _bare(inner, truncation, padding):
            shifts = [tuple(self._needs_space(text) for text in item) for item in items]
            texts = [_with_spaces(item, shift) for item, shift in zip(items, shifts)]
            encodings = inner.encode_batch(texts, add_special_tokens=add_special_tokens)
        emulated = [self._emulate(encoding, shift) for encoding, shift in zip(encodings, shifts)]
        if all(e is None for e in emulated):  # the tokens 0.20 gives: let tokenizers truncate and pad them
            if truncation is None and padding is None:
                return encodings
            return inner.encode_batch(texts, add_special_tokens=add_special_tokens)
        out = [e if e is not None else _Encoding.of(encoding) for e, encoding in zip(emulated, encodings)]
        if truncation is not None:
            out = [_truncate(e, truncation) for e in out]
        if padding is not None:
            _pad(out, padding)
        return out

    def _needs_space(self, text: Optional[str]) -> bool:
        prefix = self._emulation.prefix
        if prefix is None or not text or text[0] in (" ", prefix):
            return False
        probe = self._inner.encode(text, add_special_tokens=False)  # does an added token open the text?
        return not (probe.ids and probe.offsets[0][0] == 0 and probe.ids[0] in self._inner.get_added_tokens_decoder())

    def _emulate(self, encoding: Any, shifts: tuple) -> Optional[_Encoding]:
        """The encoding as 0.20 gives it, or None when that is ``encoding`` itself."""
        merged = self._merge_words(encoding) if self._emulation.ignore_merges else None
        if not any(shifts):
            return merged
        out = merged if merged is not None else _Encoding.of(encoding)
        out.offsets = [_unshift(offsets) if seq is not None and shifts[seq] else offsets
                       for offsets, seq in zip(out.offsets, out.sequence_ids)]
        return out

    def _merge_words(self, encoding: Any) -> Optional[_Encoding]:
        vocab = self._model_info()["vocab"]
        tokens, words, seqs, special = encoding.tokens, encoding.word_ids, encoding.sequence_ids, \
            encoding.special_tokens_mask
        groups, start, n = [], 0, len(tokens)
        while start < n:
            end = start + 1
            if words[start] is not None and not special[start]:
                while end < n and words[end] == words[start] and seqs[end] == seqs[start] and not special[end]:
                    end += 1
            groups.append((start, end))
            start = end
        merges = {}
        for start, end in groups:
            if end - start > 1:
                word = self._spelling(tokens[start:end])
                if word is not None and word in vocab:
                    merges[start] = word
        if not merges:
            return None
        full = _Encoding.of(encoding)
        out = full.take([])
        for start, end in groups:
            if start not in merges:
                out.extend(full.take(range(start, end)))
                continue
            word = merges[start]
            out.extend(_Encoding([vocab[word]], [full.type_ids[start]], [word],
                                 [(full.offsets[start][0], full.offsets[end - 1][1])], [1], [0],
                                 [words[start]], [seqs[start]]))
        return out

    def _spelling(self, pieces: list) -> Optional[str]:
        """The split these tokens of one word were made of, or None when it cannot be told (unknown chars)."""
        info = self._model_info()
        if info["unk"] is not None and info["unk"] in pieces:
            return None
        pieces = list(pieces)
        if info["prefix"]:
            pieces[1:] = [p[len(info["prefix"]):] if p.startswith(info["prefix"]) else p for p in pieces[1:]]
        if info["suffix"] and pieces[-1].endswith(info["suffix"]):
            pieces[-1] = pieces[-1][:-len(info["suffix"])]
        if not info["byte_fallback"]:
            return "".join(pieces)
        out, run = [], bytearray()
        for piece in pieces + [""]:
            byte = _BYTE_TOKEN.fullmatch(piece)
            if byte:
                run.append(int(byte.group(1), 16))
                continue
            if run:
                try:
                    out.append(run.decode("utf-8"))
                except UnicodeDecodeError:
                    return None
                run = bytearray()
            out.append(piece)
        return "".join(out)

    def _model_info(self) -> dict:
        info = self._cache.get("model")
        if info is None:
            model = self._inner.model
            info = {"vocab": self._inner.get_vocab(with_added_tokens=False), "unk": getattr(model, "unk_token", None),
                    "prefix": getattr(model, "continuing_subword_prefix", None),
                    "suffix": getattr(model, "end_of_word_suffix", None),
                    "byte_fallback": bool(getattr(model, "byte_fallback", False))}
            self._cache["model"] = info
        return info


@contextlib.contextmanager
def _bare(inner: Any, truncation: Optional[dict], padding: Optional[dict]):
    """The inner tokenizer without truncation and padding for a while (only touched when set)."""
    if truncation is not None:
        inner.no_truncation()
    if padding is not None:
        inner.no_padding()
    try:
        yield
    finally:
        if truncation is not None:
            inner.enable_truncation(**truncation)
        if padding is not None:
            inner.enable_padding(**padding)


def _with_spaces(item: tuple, shifts: tuple) -> Any:
    texts = tuple(" " + text if shift else text for text, shift in zip(item, shifts))
    return texts[0] if texts[1] is None else texts


def _unshift(offsets: tuple) -> tuple:
    """Offsets in the text without the space put in front: that space stands for the first char, as the
    replacement 0.20 prepends is aligned with it."""
    start, end = offsets
    return max(start - 1, 0), (max(end - 1, 1) if end else 0)


@dataclass
class _Encoding:
    """Stands for a tokenizers ``Encoding`` whose tokens the emulation changed (0.14 cannot make one): what
    transformers reads of an encoding and the look-ups ``BatchEncoding`` forwards to it."""

    ids: list
    type_ids: list
    tokens: list
    offsets: list
    attention_mask: list
    special_tokens_mask: list
    word_ids: list
    sequence_ids: list
    overflowing: list = field(default_factory=list)

    _ROWS = ("ids", "type_ids", "tokens", "offsets", "attention_mask", "special_tokens_mask", "word_ids",
             "sequence_ids")

    @classmethod
    def of(cls, encoding: Any) -> _Encoding:
        rows = {row: list(getattr(encoding, row)) for row in cls._ROWS}
        return cls(**rows, overflowing=[cls.of(o) for o in encoding.overflowing])

    def take(self, positions) -> _Encoding:
        positions = list(positions)
        return _Encoding(*([getattr(self, row)[i] for i in positions] for row in self._ROWS))

    def extend(self, other: _Encoding) -> None:
        for row in self._ROWS:
            getattr(self, row).extend(getattr(other, row))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def words(self) -> list:
        return self.word_ids

    @property
    def n_sequences(self) -> int:
        return max(1, len({s for s in self.sequence_ids if s is not None}))

    def token_to_sequence(self, token: int) -> Optional[int]:
        return self.sequence_ids[token] if 0 <= token < len(self) else None

    def token_to_word(self, token: int) -> Optional[int]:
        return self.word_ids[token] if 0 <= token < len(self) else None

    def token_to_chars(self, token: int) -> Optional[tuple]:
        return self.offsets[token] if self.token_to_sequence(token) is not None else None

    def word_to_tokens(self, word: int, sequence_index: int = 0) -> Optional[tuple]:
        found = [i for i, (w, s) in enumerate(zip(self.word_ids, self.sequence_ids))
                 if w == word and s == sequence_index]
        return (found[0], found[-1] + 1) if found else None

    def word_to_chars(self, word: int, sequence_index: int = 0) -> Optional[tuple]:
        span = self.word_to_tokens(word, sequence_index)
        return (self.offsets[span[0]][0], self.offsets[span[1] - 1][1]) if span else None

    def char_to_token(self, char_pos: int, sequence_index: int = 0) -> Optional[int]:
        for i, ((start, end), seq) in enumerate(zip(self.offsets, self.sequence_ids)):
            if seq == sequence_index and start <= char_pos < end:
                return i
        return None

    def char_to_word(self, char_pos: int, sequence_index: int = 0) -> Optional[int]:
        token = self.char_to_token(char_pos, sequence_index)
        return None if token is None else self.word_ids[token]


def _truncate(encoding: _Encoding, params: dict) -> _Encoding:
    """tokenizers' truncation of one sequence (``truncate_encodings``, ``Encoding.truncate``), applied to its
    tokens between the post-processor's, which every part keeps, as tokenizers adds them to each part."""
    content = [i for i, seq in enumerate(encoding.sequence_ids) if seq is not None]
    if not content:
        return encoding
    if len({encoding.sequence_ids[i] for i in content}) > 1:
        raise TokenizerError("truncating a pair of texts is not supported by this tokenizer (its ignore_merges or "
                             "Metaspace 'first' scheme is emulated)")
    first, last, total = content[0], content[-1] + 1, len(encoding)
    max_len = params["max_length"] - (total - len(content))
    if len(content) <= max_len:
        return encoding
    if params["strategy"] == "only_second":
        raise TokenizerError("Truncation error: Second sequence not provided")
    parts = _parts(len(content), max(max_len, 0), params["stride"], params["direction"])
    pieces = [encoding.take([*range(first), *range(first + a, first + b), *range(last, total)]) for a, b in parts]
    pieces[0].overflowing = pieces[1:]
    return pieces[0]


def _parts(n: int, max_len: int, stride: int, direction: str) -> list:
    """(start, stop) of the kept part then of each overflowing one, as ``Encoding.truncate`` cuts them."""
    if max_len == 0:
        return [(0, 0), (0, n)]
    if stride >= max_len:
        raise TokenizerError(f"Truncation error: stride ({stride}) must be strictly less than max_length minus the "
                             f"special tokens ({max_len})")
    step, parts = max_len - stride, []
    if direction == "right":
        for start in range(0, n, step):
            parts.append((start, min(start + max_len, n)))
            if parts[-1][1] == n:
                break
    else:
        for stop in range(n, 0, -step):
            parts.append((max(stop - max_len, 0), stop))
            if parts[-1][0] == 0:
                break
    return parts


def _pad(encodings: list, params: dict) -> None:
    """tokenizers' ``pad_encodings``: to the longest (or the given length), rounded up to a multiple; the
    overflowing parts too."""
    length = params["length"] or max((len(e) for e in encodings), default=0)
    multiple = params.get("pad_to_multiple_of")
    if multiple and length % multiple:
        length += multiple - length % multiple
    for encoding in encodings:
        _pad_one(encoding, length, params)


def _pad_one(encoding: _Encoding, length: int, params: dict) -> None:
    for part in encoding.overflowing:
        _pad_one(part, length, params)
    missing = length - len(encoding)
    if missing <= 0:
        return
    pad = _Encoding([params["pad_id"]] * missing, [params["pad_type_id"]] * missing, [params["pad_token"]] * missing,
                    [(0, 0)] * missing, [0] * missing, [1] * missing, [None] * missing, [None] * missing)
    if params["direction"] == "left":
        pad.extend(encoding)
        for row in _Encoding._ROWS:
            setattr(encoding, row, getattr(pad, row))
    else:
        encoding.extend(pad)
