"""transformers' reading of a config.json's RoPE keys, for tests/models/llama_hostile_test.cpp
(issue 50 item 11): for each config of CASES.json (a list of config.json objects), the
standardized rope_parameters of AutoConfig.from_pretrained and LlamaRotaryEmbedding's cos and
sin (float32) at positions 0..T-1, as one JSON list on stdout.

    python rope_keys.py CASES.json T
"""
import json
import os
import sys
import tempfile

import torch
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def main():
    cases = json.load(open(sys.argv[1]))
    T = int(sys.argv[2])
    out = []
    for cfg in cases:
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            config = AutoConfig.from_pretrained(d)
        rotary = LlamaRotaryEmbedding(config=config)
        x = torch.zeros(1, T, config.hidden_size)
        cos, sin = rotary(x, torch.arange(T).unsqueeze(0))
        out.append({"rope_parameters": dict(config.rope_parameters), "cos": cos[0].tolist(), "sin": sin[0].tolist()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
