"""Hugging Face models for the benchmarks of docs/performance.md ("Hugging
Face models"), and PyTorch's side of them.

  python bench/hf_peers.py make OUT
      OUT/llama1b: a random model shaped as Llama-3.2-1B (1.24 B parameters,
      tied embeddings, llama3 RoPE), OUT/smol135m: one shaped as
      SmolLM2-135M; both made by transformers in bfloat16 and saved with
      save_pretrained (its default shards).
  torchrun --standalone --nproc-per-node 2 bench/hf_peers.py load DIR from_pretrained|dcp
      loads DIR's model at world 2 in bfloat16, as PyTorch users do:
      from_pretrained: AutoModelForCausalLM.from_pretrained on every rank,
        then fully_shard on each decoder layer and the root;
      dcp: the model built on the meta device, fully_shard, to_empty, then
        torch.distributed.checkpoint.load with HuggingFaceStorageReader
        (each rank asks for its shards).
      Prints one JSON line per rank: seconds (from before the load to after
      the sharded model holds the weights, synchronised), peak_rss_mib
      (ru_maxrss), base_rss_mib (before the load: Python and torch).
  torchrun --standalone --nproc-per-node 2 bench/hf_peers.py train DIR CONTEXT BATCH STEPS
      transformers' model of DIR in float32 under fully_shard (each layer,
      then the root), torch.optim.AdamW (betas 0.9/0.95), BATCH x CONTEXT
      tokens per rank per step; prints tokens_per_s over the steps after
      the first two (rank 0).
"""
import json
import os
import resource
import sys
import time

import torch


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def make(out):
    from transformers import LlamaConfig, LlamaForCausalLM
    shapes = {
        "llama1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}),
        "smol135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    }
    for name, shape in shapes.items():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16)
        model.save_pretrained(os.path.join(out, name))
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n / 1e6:.1f} M parameters")
        del model


def init():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    return dist


def shard(model):
    from torch.distributed.fsdp import fully_shard
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def load(d, how):
    dist = init()
    from transformers import AutoConfig, AutoModelForCausalLM
    base = rss_mib()
    dist.barrier()
    t = time.perf_counter()
    if how == "from_pretrained":
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        shard(model)
    elif how == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.bfloat16)
        shard(model)
        model.to_empty(device="cpu")
        state = get_model_state_dict(model)
        state.pop("lm_head.weight", None)  # tied: the files hold only the embedding
        dcp.load(state, storage_reader=HuggingFaceStorageReader(d))  # into the shards, in place
    else:
        raise SystemExit(f"unknown load {how}")
    dist.barrier()
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peer": how, "rank": dist.get_rank(), "seconds": round(seconds, 2),
                      "peak_rss_mib": round(peak), "base_rss_mib": round(base)}), flush=True)
    dist.destroy_process_group()


def train(d, context, batch, steps):
    dist = init()
    from transformers import AutoModelForCausalLM
    context, batch, steps = int(context), int(batch), int(steps)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(dist.get_rank())
    vocab = model.config.vocab_size
    times = []
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, context + 1), generator=g)
        dist.barrier()
        t = time.perf_counter()
        logits = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dist.barrier()
        times.append(time.perf_counter() - t)
    timed = times[2:]
    if dist.get_rank() == 0:
        tps = batch * context * dist.get_world_size() * len(timed) / sum(timed)
        print(json.dumps({"peer": "torch fully_shard", "tokens_per_s": round(tps),
                          "step_s": round(sum(timed) / len(timed), 3)}), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        return make(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "load":
        return load(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 6 and sys.argv[1] == "train":
        return train(*sys.argv[2:6])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
