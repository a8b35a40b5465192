#!/usr/bin/env python3
"""A Hugging Face checkpoint of a published shape with random bf16 weights and a real tokenizer.

For runs that need text in and out (the server load run): `synthetic:NAME` models have no
tokenizer. The shape comes from bench/peers/hf_transformers.py (published config values), the
vocabulary and tokenizer files from the embedded default model (models/default: 4096 tokens),
so every id the model can produce detokenizes. transformers builds the model on the GPU
(from_config) and writes it with save_pretrained.

  python3 bench/make_checkpoint.py llama3.2-1b OUT_DIR
"""
import json
import os
import shutil
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "peers"))
from hf_transformers import SHAPES, make_config  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        print(f"usage: make_checkpoint.py {'|'.join(SHAPES)} OUT_DIR", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM

    name, out = sys.argv[1], sys.argv[2]
    default = os.path.join(here, "..", "models", "default")
    dcfg = json.load(open(os.path.join(default, "config.json")))
    cfg = make_config(SHAPES[name])
    cfg.vocab_size = dcfg["vocab_size"]
    cfg.bos_token_id, cfg.eos_token_id = dcfg["bos_token_id"], dcfg["eos_token_id"]
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(default, f), out)
    print(f"{out}: {name} shape, vocabulary {cfg.vocab_size}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
