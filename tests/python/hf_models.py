"""Small random models of the Llama family made by transformers itself, and
transformers' results on them: the reference of tests/models/llama_test.cpp.

    hf_models.py make OUT     writes OUT/<name>/ (config.json, weights as
                              save_pretrained writes them) and
                              OUT/<name>.expected.safetensors for each model
    hf_models.py train DIR OUT
                              20 steps of torch.optim.AdamW (lr 1e-3, betas
                              0.9/0.95, weight decay 0.1) on DIR's model in
                              one process, on batches [6, 12] drawn from a
                              seeded generator: OUT holds "batches" [20, 6,
                              12] and "losses" [20]
    hf_models.py check-peft BASE ADAPTER OURS
                              loads BASE with transformers, the LoRA adapters
                              of ADAPTER onto it with peft, merges them
                              (merge_and_unload), and checks the logits for
                              OURS's "tokens" against OURS's "logits"
    hf_models.py check-export DIR OURS [DIR OURS ...]
                              loads each DIR with AutoModelForCausalLM.from_pretrained
                              (no missing or unexpected keys, or exit 1) and
                              checks its logits for OURS's "tokens" against
                              OURS's "logits" (max abs difference <= 1e-5)

Models (random weights, norms included, so that every parameter matters):
  llama    Llama with grouped-query attention and Llama 3's "llama3" RoPE
           scaling, sharded by save_pretrained into several files (an index)
  qwen2    Qwen2 (q/k/v biases) with a sliding window of 4 on its last layer
  tied     Llama with tie_word_embeddings, attention_bias, mlp_bias, a
           head_dim apart from hidden_size / heads, and a pad_token_id
  mistral  Mistral with a sliding window of 4
  legacy   a hand-written config.json with the keys hub checkpoints carry
           (torch_dtype, rope_theta, rope_scaling with "type": "linear"),
           weights saved in bfloat16

Expected values (float32): "tokens" [2, 12] int64 and their "logits"; "loss"
(mean next-token cross-entropy) and "grad.<name>" for every parameter after
one backward; "prompt" [1, 5] and "generated" [1, 37]: greedy generation of
32 tokens with stopping at eos turned off.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

transformers.logging.set_verbosity_error()
SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0) * 0.5)


def build(name):
    torch.manual_seed(0)
    if name == "llama":
        c = LlamaConfig(**SMALL, num_key_value_heads=2,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16})
        return LlamaForCausalLM(c), "20KB"
    if name == "qwen2":
        c = Qwen2Config(**SMALL, num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        return Qwen2ForCausalLM(c), "10MB"
    if name == "tied":
        c = LlamaConfig(**SMALL, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, attention_bias=True,
                        mlp_bias=True, pad_token_id=0)
        return LlamaForCausalLM(c), "10MB"
    if name == "mistral":
        c = MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=4)
        return MistralForCausalLM(c), "10MB"
    raise SystemExit(f"unknown model {name}")


def write_legacy(d):
    """A Llama as an older hub checkpoint has it: legacy keys, bfloat16 weights."""
    c = LlamaConfig(**SMALL, num_key_value_heads=2, rope_parameters={"rope_type": "linear", "rope_theta": 20000.0,
                                                                     "factor": 2.0})
    torch.manual_seed(0)
    model = LlamaForCausalLM(c)
    randomize(model, 5)
    os.makedirs(d, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
              os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 1, "eos_token_id": 2,
              "hidden_act": "silu", "initializer_range": 0.02, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
              "rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 20000.0, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "transformers_version": "4.44.0", "use_cache": True, **SMALL,
              "num_key_value_heads": 2}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def expected(d, out):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=g)
    model.train()  # dropout is 0: train() only lets gradients be what training sees
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
    loss.backward()
    result = {"tokens": tokens, "logits": logits.detach(), "loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        result["grad." + n] = p.grad.detach()
    model.eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=g)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert generated.shape == (1, 37), generated.shape
    result["prompt"] = prompt
    result["generated"] = generated
    save_file({k: v.contiguous() for k, v in result.items()}, out)


def check_export(d, ours_path):
    from safetensors.torch import load_file
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"{d}: from_pretrained reports {problems}")
    ours = load_file(ours_path)
    model.eval()
    with torch.no_grad():
        logits = model(ours["tokens"]).logits
    diff = (logits - ours["logits"]).abs().max().item()
    if not diff <= 1e-5:
        raise SystemExit(f"{d}: logits differ from fsdp-cpp's by {diff}")
    print(f"{d}: loads with no missing or unexpected keys; logits within {diff:.2e} of fsdp-cpp's")


def train(d, out):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.train()
    g = torch.Generator().manual_seed(2)
    batches = torch.randint(0, model.config.vocab_size, (20, 6, 12), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for tokens in batches:
        logits = model(tokens).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                 tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    save_file({"batches": batches, "losses": torch.stack(losses)}, out)


def check_peft(base_dir, adapter_dir, ours_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    ours = load_file(ours_path)
    with torch.no_grad():
        plain = base(ours["tokens"]).logits
    model = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    model.eval()
    with torch.no_grad():
        logits = model(ours["tokens"]).logits
    diff = (logits - ours["logits"]).abs().max().item()
    moved = (plain - ours["logits"]).abs().max().item()
    if not diff <= 1e-5:
        raise SystemExit(f"{adapter_dir}: merged logits differ from fsdp-cpp's by {diff}")
    if not moved > 1e-3:
        raise SystemExit(f"{adapter_dir}: the adapters change the logits by only {moved}: the check sees nothing")
    print(f"{adapter_dir}: peft loads the adapters; merged logits within {diff:.2e} of fsdp-cpp's "
          f"(the base model's differ by {moved:.2e})")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "check-peft":
        check_peft(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) >= 4 and len(sys.argv) % 2 == 0 and sys.argv[1] == "check-export":
        for d, ours in zip(sys.argv[2::2], sys.argv[3::2]):
            check_export(d, ours)
        return
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        raise SystemExit(__doc__)
    out = sys.argv[2]
    for name in ["llama", "qwen2", "tied", "mistral"]:
        model, shard = build(name)
        randomize(model, len(name))
        d = os.path.join(out, name)
        model.save_pretrained(d, max_shard_size=shard)
        expected(d, os.path.join(out, name + ".expected.safetensors"))
    write_legacy(os.path.join(out, "legacy"))
    expected(os.path.join(out, "legacy"), os.path.join(out, "legacy.expected.safetensors"))


if __name__ == "__main__":
    main()
