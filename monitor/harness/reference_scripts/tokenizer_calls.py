"""What a checkpoint's tokenizer answers to a list of calls: the reference's answers, which ours must equal.

stdin: {"path": DIR, "calls": [CALL]}; stdout: {"results": [RESULT per call]}. A call is one of
  {"op": "call", "text": STR | [STR], "pair": STR?, "kwargs": {...}, "set": {ATTRIBUTE: VALUE}?}
      -> tokenizer(text[, pair], **kwargs) as plain lists, plus "tokens" and "word_ids" of each row
      (BatchEncoding.tokens(i) / word_ids(i)); "set" sets tokenizer attributes (pad_token, padding_side,
      truncation_side) for this call only
  {"op": "encode", "text": STR, "kwargs": {...}}        -> tokenizer.encode(text, **kwargs)
  {"op": "chat", "messages": [{role, content}], "kwargs": {...}}
      -> tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
  {"op": "decode", "ids": [INT], "kwargs": {...}}        -> tokenizer.decode(ids, **kwargs)
  {"op": "tokens", "ids": [INT]}                         -> tokenizer.convert_ids_to_tokens(ids)
  {"op": "tokenize", "text": STR}                        -> tokenizer.tokenize(text)
  {"op": "attributes"}  -> len, special tokens and their ids, chat_template, clean-up flag, model_max_length
A call that raises answers {"error": EXCEPTION TYPE}. ``answer`` is imported by the specs too, so both
sides answer through the same code; only ``main`` needs the reference on the path.
"""

import json
import sys

ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "pad_token", "bos_token_id", "eos_token_id", "unk_token_id",
              "pad_token_id", "chat_template", "clean_up_tokenization_spaces", "model_max_length",
              "all_special_ids", "all_special_tokens")


def _plain(value):
    """JSON-ready: tuples become lists, tensors are never asked for."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _call(tokenizer, call: dict):
    op, kwargs = call["op"], call.get("kwargs", {})
    if call.get("set"):
        saved = {name: getattr(tokenizer, name) for name in call["set"]}
        try:
            for name, value in call["set"].items():
                setattr(tokenizer, name, value)
            return _call(tokenizer, {**call, "set": None})
        finally:
            for name, value in saved.items():
                setattr(tokenizer, name, value)
    if op == "call":
        args = (call["text"],) if call.get("pair") is None else (call["text"], call["pair"])
        batch = tokenizer(*args, **kwargs)
        out = _plain(dict(batch))
        rows = len(batch["input_ids"]) if isinstance(call["text"], list) or kwargs.get("return_overflowing_tokens") \
            else 1
        out["tokens"] = [batch.tokens(i) for i in range(rows)]
        out["word_ids"] = [batch.word_ids(i) for i in range(rows)]
        return out
    if op == "encode":
        return tokenizer.encode(call["text"], **kwargs)
    if op == "chat":
        return _plain(tokenizer.apply_chat_template(call["messages"], add_generation_prompt=True, tokenize=True,
                                                    **kwargs))
    if op == "decode":
        return tokenizer.decode(call["ids"], **kwargs)
    if op == "tokens":
        return tokenizer.convert_ids_to_tokens(call["ids"])
    if op == "tokenize":
        return tokenizer.tokenize(call["text"])
    if op == "attributes":
        return {"len": len(tokenizer), **{name: _plain(getattr(tokenizer, name)) for name in ATTRIBUTES}}
    raise ValueError(f"unknown op {op!r}")


def answer(tokenizer, calls: list) -> list:
    results = []
    for call in calls:
        try:
            results.append(_call(tokenizer, call))
        except Exception as e:  # noqa: BLE001 - both sides must refuse the same calls
            results.append({"error": type(e).__name__})
    return results


def main() -> None:
    from transformers import AutoTokenizer

    args = json.loads(sys.stdin.read())
    tokenizer = AutoTokenizer.from_pretrained(args["path"])
    print(json.dumps({"results": answer(tokenizer, args["calls"])}))


if __name__ == "__main__":
    main()
