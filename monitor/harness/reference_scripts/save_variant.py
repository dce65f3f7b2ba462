"""Save a variant of a checkpoint with the reference: the same weights and tokenizer, some config
fields changed (e.g. a Mixtral with a small ``sliding_window``), as the reference saves it.

stdin: {"path": DIR, "out": DIR, "config": {FIELD: VALUE, ...}}
stdout: {"config": {the saved config.json}, "transformers": VERSION}
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    args = json.loads(sys.stdin.read())
    model = AutoModelForCausalLM.from_pretrained(args["path"], torch_dtype=torch.float32)
    for field, value in args.get("config", {}).items():
        setattr(model.config, field, value)
    model.save_pretrained(args["out"], safe_serialization=True)
    AutoTokenizer.from_pretrained(args["path"]).save_pretrained(args["out"])
    saved = json.loads((Path(args["out"]) / "config.json").read_text())
    print(json.dumps({"config": saved, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
