"""What the reference computes for a checkpoint: tokenizations and greedy continuations.

stdin: {"path": DIR, "texts": [STR], "add_special_tokens": true, "messages": [[{role, content}]],
        "generate": [[ids]], "max_new_tokens": 16}
stdout: {"ids": [[ids] per text], "chat_ids": [[ids] per conversation], "generated": [[new ids] per prompt],
         "generated_text": [their text, special tokens skipped]}
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def greedy(model, prompts, max_new_tokens: int, pad_token_id) -> list:
    """The reference's greedy continuation of each prompt (token ids), new tokens only."""
    generated = []
    for ids in prompts:
        with torch.no_grad():
            result = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    pad_token_id=pad_token_id)
        generated.append(result[0, len(ids):].tolist())
    return generated


def main() -> None:
    args = json.loads(sys.stdin.read())
    out = {}
    tokenizer = AutoTokenizer.from_pretrained(args["path"])
    add = args.get("add_special_tokens", True)
    out["ids"] = [tokenizer(text, add_special_tokens=add)["input_ids"] for text in args.get("texts", [])]
    out["chat_ids"] = [tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                       for messages in args.get("messages", [])]
    if args.get("generate"):
        model = AutoModelForCausalLM.from_pretrained(args["path"], torch_dtype=torch.float32)
        model.eval()
        out["generated"] = greedy(model, args["generate"], args.get("max_new_tokens", 16), tokenizer.eos_token_id)
        out["generated_text"] = [tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                                 for new in out["generated"]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
