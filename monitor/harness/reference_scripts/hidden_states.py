"""The reference's hidden states of a checkpoint: what each decoder layer gives for one input.

stdin: {"path": DIR, "ids": [[ids]] | "inputs_embeds": [[[floats]]], "attn_implementation": "sdpa" | "eager"}
stdout: {"hidden_states": [...]  (output_hidden_states=True: the input, then after each layer, the
         last one after the final norm), "layer_outputs": [...]  (each decoder layer's output, the
         last one before the final norm), "attn_implementation": STR, "transformers": VERSION}
"""

import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def main() -> None:
    args = json.loads(sys.stdin.read())
    model = AutoModelForCausalLM.from_pretrained(args["path"], torch_dtype=torch.float32,
                                                 attn_implementation=args.get("attn_implementation", "sdpa"))
    model.eval()
    layer_outputs = []
    for layer in model.model.layers:
        layer.register_forward_hook(lambda _module, _inputs, output: layer_outputs.append(output[0].tolist()))
    if "ids" in args:
        inputs = {"input_ids": torch.tensor(args["ids"])}
    else:
        inputs = {"inputs_embeds": torch.tensor(args["inputs_embeds"], dtype=torch.float32)}
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, use_cache=False)
    print(json.dumps({"hidden_states": [state.tolist() for state in out.hidden_states],
                      "layer_outputs": layer_outputs,
                      "attn_implementation": model.config._attn_implementation,
                      "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
