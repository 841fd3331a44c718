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
    hf_models.py resume-cpp DIR CKPT BATCHES OUT
                              a run that fsdp-cpp trained and saved (CKPT: a
                              DCP directory of {"model", "optimizer", "step"})
                              continued in PyTorch: transformers' model of DIR
                              and torch.optim.AdamW (as in train) load CKPT
                              with torch.distributed.checkpoint; OUT gets the
                              loaded weights and moments ("w.", "m.", "v."
                              prefixes, "step"), the weights after one step
                              on fixed gradients ("one."), and the losses of
                              20 steps on BATCHES[3:23] ("losses")
    hf_models.py train-save DIR BATCHES OUTDIR
                              the other way: 3 steps on BATCHES[0:3] from DIR,
                              dcp.save into OUTDIR/py_dcp, the saved state as
                              whole tensors into OUTDIR/py_state.safetensors
                              (prefixes as above), then 20 steps on
                              BATCHES[3:23]: OUTDIR/py_losses.safetensors
    hf_models.py make-tuneable OUT
                              OUT/base: a small random Llama (float32, an
                              index of several files) with a byte-level BPE
                              tokenizer in Llama 3's pipeline
                              (tests/python/make_tokenizers.py: tokenizer.json,
                              tokenizer_config.json), its vocab_size the
                              tokenizer's, BOS and EOS the tokenizer's
                              <|begin_of_text|> and <|eot_id|>; OUT/corpus.txt:
                              English-like text to fine-tune on
    hf_models.py generate-text DIR PROMPT N
                              greedy generate(do_sample=False) of at most N
                              new tokens (stopping at the model's eos) by the
                              model and tokenizer of DIR, the prompt encoded
                              with its special tokens; prints the text
                              (decoded skipping special tokens) between
                              lines "<<<" and ">>>"
    hf_models.py check-tuned BASE TUNED MAX
                              loads TUNED with from_pretrained (no missing or
                              unexpected keys, or exit 1) and checks that its
                              weights moved off BASE's, by at most MAX each
                              (they were fine-tuned from BASE, not trained
                              from another start); MAX 0: equal to BASE's
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
    check_legacy_keys(d)
    print(f"{d}: loads with no missing or unexpected keys; logits within {diff:.2e} of fsdp-cpp's")


def check_legacy_keys(d):
    """The exported config.json names the transformers release it was written for (the one
    installed here, requirements.txt's pin) and carries the legacy keys (rope_theta,
    rope_scaling, torch_dtype) that a transformers 4.x reader knows, agreeing with
    rope_parameters and dtype: read with only the legacy keys, transformers builds the
    same RoPE and dtype."""
    import tempfile
    from transformers import AutoConfig
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    if config.get("transformers_version") != transformers.__version__:
        raise SystemExit(f"{d}: transformers_version is {config.get('transformers_version')!r}, "
                         f"expected {transformers.__version__!r} (the release emulated)")
    for key in ("rope_theta", "rope_scaling", "torch_dtype", "rope_parameters", "dtype"):
        if key not in config:
            raise SystemExit(f"{d}: config.json has no {key!r}")
    legacy = {k: v for k, v in config.items() if k not in ("rope_parameters", "dtype")}
    full = AutoConfig.from_pretrained(d)
    with tempfile.TemporaryDirectory() as t:
        with open(os.path.join(t, "config.json"), "w") as f:
            json.dump(legacy, f)
        old = AutoConfig.from_pretrained(t)
    if dict(old.rope_parameters) != dict(full.rope_parameters) or old.dtype != full.dtype:
        raise SystemExit(f"{d}: the legacy keys say {old.rope_parameters} {old.dtype}, "
                         f"rope_parameters and dtype say {full.rope_parameters} {full.dtype}")


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


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)


def step_on(model, opt, tokens):
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def state_tensors(model, opt, step):
    """Weights, AdamW's moments and step, as whole tensors by name."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    out = {"w." + k: v.detach().clone() for k, v in msd.items()}
    for k, fields in osd["state"].items():
        out["m." + k] = fields["exp_avg"].clone()
        out["v." + k] = fields["exp_avg_sq"].clone()
        out["step." + k] = torch.tensor([float(fields["step"])], dtype=torch.float64)
    out["step"] = torch.tensor([step], dtype=torch.int64)
    return out


def init_dist():
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)


def load_cpp(d, ckpt):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.train()
    opt = adamw(model)
    msd, osd = get_state_dict(model, opt)  # initialises AdamW's state, for its layout
    state = {"model": msd, "optimizer": osd, "step": 0}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return model, opt, state["step"]


def resume_cpp(d, ckpt, batches_path, out):
    from safetensors.torch import load_file
    init_dist()
    batches = load_file(batches_path)["batches"]
    model, opt, step = load_cpp(d, ckpt)
    result = state_tensors(model, opt, step)
    # One step on fixed gradients (the same on both sides).
    for i, (_, p) in enumerate(sorted(model.named_parameters())):
        p.grad = torch.sin(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) * 0.01 * (i + 1) + 0.3)
    opt.step()
    for k, v in model.state_dict().items():
        result["one." + k] = v.detach().clone()
    model, opt, step = load_cpp(d, ckpt)
    result["losses"] = torch.stack([step_on(model, opt, batches[i]) for i in range(3, 23)])
    save_file({k: v.contiguous() for k, v in result.items()}, out)


def train_save(d, batches_path, outdir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from safetensors.torch import load_file
    init_dist()
    batches = load_file(batches_path)["batches"]
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.train()
    opt = adamw(model)
    for i in range(3):
        step_on(model, opt, batches[i])
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optimizer": osd, "step": 3}, checkpoint_id=os.path.join(outdir, "py_dcp"))
    save_file({k: v.contiguous() for k, v in state_tensors(model, opt, 3).items()},
              os.path.join(outdir, "py_state.safetensors"))
    losses = torch.stack([step_on(model, opt, batches[i]) for i in range(3, 23)])
    save_file({"losses": losses}, os.path.join(outdir, "py_losses.safetensors"))


def make_tuneable(out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tokenizers
    d = os.path.join(out, "base")
    os.makedirs(d, exist_ok=True)
    tok = make_tokenizers.make_llama3()
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab = max(ids.values()) + 1
    c = LlamaConfig(**dict(SMALL, vocab_size=vocab), num_key_value_heads=2, bos_token_id=ids["<|begin_of_text|>"],
                    eos_token_id=ids["<|eot_id|>"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(c)
    randomize(model, 11)
    model.save_pretrained(d, max_shard_size="100KB")
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(make_tokenizers.TRAIN * 4) + "\n")


def generate_text(d, prompt, n):
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([tok(prompt).input_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=int(n), do_sample=False, pad_token_id=model.config.eos_token_id)
    print("<<<\n" + tok.decode(out[0].tolist(), skip_special_tokens=True) + "\n>>>")


def check_tuned(base_dir, tuned_dir, most):
    tuned, info = AutoModelForCausalLM.from_pretrained(tuned_dir, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"{tuned_dir}: from_pretrained reports {problems}")
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).state_dict()
    moved = 0.0
    for k, v in tuned.state_dict().items():
        moved = max(moved, (v - base[k]).abs().max().item())
    if float(most) == 0:
        if moved != 0:
            raise SystemExit(f"{tuned_dir}: its weights differ from {base_dir}'s by up to {moved}; expected equal")
        print(f"{tuned_dir}: loads with no missing or unexpected keys; its weights equal {base_dir}'s")
        return
    if not 0 < moved <= float(most):
        raise SystemExit(f"{tuned_dir}: its weights moved off {base_dir}'s by up to {moved}; expected (0, {most}]")
    print(f"{tuned_dir}: loads with no missing or unexpected keys; weights moved off the base's by up to {moved:.2e}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make-tuneable":
        make_tuneable(sys.argv[2])
        return
    if len(sys.argv) == 5 and sys.argv[1] == "generate-text":
        generate_text(*sys.argv[2:5])
        return
    if len(sys.argv) == 5 and sys.argv[1] == "check-tuned":
        check_tuned(*sys.argv[2:5])
        return
    if len(sys.argv) == 6 and sys.argv[1] == "resume-cpp":
        resume_cpp(*sys.argv[2:6])
        return
    if len(sys.argv) == 5 and sys.argv[1] == "train-save":
        train_save(*sys.argv[2:5])
        return
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
