"""What the reference computes inside a Llama checkpoint: its rotary inverse frequencies, the hidden
state after every block for given input embeddings, and greedy continuations — optionally also with
the config's rope scaling removed (to show what the scaling changes).

stdin: {"path": DIR, "inputs_embeds": [[[float] per position]] (one sequence), "generate": [[ids]],
        "max_new_tokens": 16, "unscaled": false}
stdout: {"transformers": VERSION, "rope_type": STR, "inv_freq": [float],
         "hidden_states": [[[float]] per entry of output_hidden_states], "last_block": [[float]],
         "generated": [[new ids] per prompt], "unscaled": {the same keys, rope_scaling=None}}
``hidden_states`` is the model's ``output_hidden_states=True`` (the input, then each block's output,
the last one after the final norm); ``last_block`` is the last block's own output (before the norm).
Runs only with the reference first on PYTHONPATH (monitor.harness.reference.run).
"""

import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from reference import greedy  # (this folder's: the one greedy continuation)


def compute(path: str, args: dict, *, unscaled: bool) -> dict:
    config = AutoConfig.from_pretrained(path)
    if unscaled:
        config.rope_scaling = None
    model = AutoModelForCausalLM.from_pretrained(path, config=config, torch_dtype=torch.float32)
    model.eval()
    rotary = model.model.rotary_emb
    out = {"rope_type": rotary.rope_type, "inv_freq": rotary.inv_freq.tolist()}
    if args.get("inputs_embeds") is not None:
        captured = {}
        hook = model.model.layers[-1].register_forward_hook(
            lambda module, inputs, output: captured.setdefault("last", output[0]))
        embeds = torch.tensor(args["inputs_embeds"], dtype=torch.float32)
        with torch.no_grad():
            result = model.model(inputs_embeds=embeds, output_hidden_states=True, use_cache=False)
        hook.remove()
        out["hidden_states"] = [state[0].tolist() for state in result.hidden_states]
        out["last_block"] = captured["last"][0].tolist()
    if args.get("generate"):
        out["generated"] = greedy(model, args["generate"], args.get("max_new_tokens", 16), config.eos_token_id)
    return out


def main() -> None:
    args = json.loads(sys.stdin.read())
    out = {"transformers": transformers.__version__, **compute(args["path"], args, unscaled=False)}
    if args.get("unscaled"):
        out["unscaled"] = compute(args["path"], args, unscaled=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
