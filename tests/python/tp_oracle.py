#!/usr/bin/env python3
"""torch's own 2-D parallelism (tensor/sequence parallel + fully_shard) as the
reference for fsdp-cpp's (issue 52; design: docs/tensor-parallel.md).

    tp_oracle.py OUT.pt --world W --tp T [--sp|--no-sp] [--loss-parallel]
                 [--bf16] [--dtensor-residual] [--no-fsdp] [--steps N]

Starts W processes on Gloo (FileStore next to OUT), one thread each, and
builds on every rank the same tiny Llama-shaped model (transformers'
LlamaForCausalLM names and arithmetic: float32 RMSNorm, RoPE, GQA through
scaled_dot_product_attention, SwiGLU, untied lm_head) from deterministic
values (sin of an arange, as tests/python/fully_shard_oracle.py), then:

  mesh = init_device_mesh("cpu", (W // T, T), mesh_dim_names=("dp", "tp"))
  parallelize_module(model, mesh["tp"], plan)      # TorchTitan's parallelize_llama plan
  fully_shard(layer, mesh=mesh["dp"]) per layer; fully_shard(model, mesh=mesh["dp"])

and trains STEPS (3) AdamW steps on fixed batches (every tp rank of a dp group
reads its dp group's rows), clipping with clip_grad_norm_(max_norm=0.5) over
the DTensor gradients. Rank 0 writes OUT.pt (torch.save) with:
  losses[step], grad_norms[step] (float64 of the float32 value), params{name:
  full float32 tensor}, exp_avg{name}, exp_avg_sq{name}, opt_step{name}, and
  facts: what each rank saw of the layouts (placements, local shapes, which
  global rows a rank's local tensor holds, the placements of the gradients
  after the first backward) — the facts docs/tensor-parallel.md relies on.
Beside it, OUT-without-.pt + ".safetensors": loss, grad_norm (float32) and
param./exp_avg./exp_avg_sq.NAME full tensors, for the C++ side.

Options:
  --sp / --no-sp       sequence parallel on the norms (TorchTitan: SequenceParallel
                       on attention_norm/ffn_norm/norm, PrepareModuleInput on
                       attention and mlp, o/down_proj Rowwise with Shard(1) output).
                       Without it the norms are replicated on tp (TorchTitan's
                       NoParallel) so every parameter lies on the (dp, tp) mesh.
  --loss-parallel      lm_head keeps Shard(-1) logits; cross-entropy under
                       loss_parallel(); else lm_head gathers (Replicate output).
  --bf16               fully_shard MixedPrecisionPolicy(param_dtype=bf16,
                       reduce_dtype=float32).
  --dtensor-residual   o_proj/down_proj/embedding keep DTensor outputs
                       (use_local_output=False), so the residual add runs on
                       Shard(1) (with --sp) DTensors instead of local tensors.
  --trace              record in facts["trace"] every DTensor redistribution of
                       step 0 (phase forward/backward/clip/step, from, to,
                       global shape, local dtype):
                       the collectives and their order that fsdp-cpp must issue.
  --check-clip         before each clip, also compute the total norm by hand in
                       the order docs/tensor-parallel.md gives (and in the other
                       mesh-dim order): facts["clip_by_hand"] (needs fully_shard).
  --check-ops          first, check on mesh["tp"] the local formulas of the design
                       against DTensor's results, to the bit (Rowwise Linear with
                       bias, Rowwise Embedding, loss_parallel): facts["check_ops"].
  --tied               lm_head.weight re-tied to embed_tokens.weight after
                       parallelize_module (both Shard(0) on tp).
  --cases A,B,...      several cases in one launch (CI: one launch per world),
                       each flags joined by '+': sp nosp lp bf16 resid tied
                       nofsdp trace clip ops (e.g. "sp+lp,nosp+lp,sp+lp+bf16");
                       OUT is then a prefix: OUT.CASE.pt (+ .safetensors).
  --no-fsdp            skip fully_shard (the experiment: SP norm gradients stay
                       Partial). Needs --world == --tp.
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

# Tiny sizes: tp 2 divides heads, kv heads, vocab and the hidden sizes; dp 2
# then splits some tp-local dim-0 sizes unevenly (vocab 30 -> 15 -> 8 + 7,
# intermediate 20 -> 10 -> 5 + 5), so FSDP's padding is exercised too.
VOCAB, HIDDEN, HEADS, KV_HEADS, INTER, LAYERS = 30, 16, 4, 2, 20, 2
HEAD_DIM = HIDDEN // HEADS
GLOBAL_BATCH, SEQ, STEPS = 4, 8, 3
LR, WEIGHT_DECAY, MAX_NORM, EPS, ROPE_THETA = 0.01, 0.1, 0.5, 1e-5, 10000.0


def values_of(shape, a, b):
    """sin(arange * a + b) * 0.5, made in float64 and rounded to float32."""
    n = math.prod(shape)
    return torch.arange(n, dtype=torch.float64).mul(a).add(b).sin().mul(0.5).to(torch.float32).reshape(shape)


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm: float32 statistics, cast back before the weight."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + EPS)
        return self.weight * h.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        B, T = x.shape[0], x.shape[1]
        # Under TP q/k/v are local tensors with heads/tp (kv_heads/tp) heads: -1.
        q = self.q_proj(x).view(B, T, -1, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, HEAD_DIM).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = q.shape[1] // k.shape[1]  # GQA: heads / kv_heads, the same per tp rank
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTER, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTER, bias=False)
        self.down_proj = nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()
        self.mlp = MLP()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.post_attention_layernorm = RMSNorm(HIDDEN)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)

    def forward(self, tokens):
        h = self.embed_tokens(tokens)
        T = tokens.shape[1]
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM))
        freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.norm(h)


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Decoder()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        return self.lm_head(self.model(tokens))


def make_model():
    model = TinyLlama()
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            v = values_of(list(p.shape), 0.37 + 0.1 * i, 0.2 * i)
            p.copy_(1.0 + 0.2 * v if name.endswith("norm.weight") else v)
    return model


class NoParallel(ParallelStyle):
    """TorchTitan's NoParallel (torchtitan/distributed/tensor_parallel.py): the
    module's parameters Replicate on tp, local inputs wrapped as Replicate,
    outputs back to local. Puts the norms on the tp mesh without SP, so that
    clip_grad_norm_ sees every parameter on one (dp, tp) mesh."""

    def _apply(self, module, device_mesh):
        def partition(name, mod, mesh):
            for p_name, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(p_name, nn.Parameter(DTensor.from_local(p, mesh, [Replicate()], run_check=False)))

        def input_fn(mod, inputs, mesh):
            x = inputs[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            return (x, *inputs[1:])

        def output_fn(mod, outputs, mesh):
            return outputs.to_local() if isinstance(outputs, DTensor) else outputs

        from torch.distributed.tensor import distribute_module
        return distribute_module(module, device_mesh, partition, input_fn, output_fn)


def tp_plan(sp, lp, dtensor_residual):
    """TorchTitan's parallelize_llama plan, in our module names."""
    local_out = not dtensor_residual
    seq = Shard(1) if sp else Replicate()
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq, use_local_output=local_out),
        "model.norm": SequenceParallel() if sp else NoParallel(),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1) if lp else Replicate(),
                                   use_local_output=not lp),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        plan.update({
            p + "input_layernorm": SequenceParallel() if sp else NoParallel(),
            p + "self_attn.q_proj": ColwiseParallel(),
            p + "self_attn.k_proj": ColwiseParallel(),
            p + "self_attn.v_proj": ColwiseParallel(),
            p + "self_attn.o_proj": RowwiseParallel(output_layouts=seq, use_local_output=local_out),
            p + "post_attention_layernorm": SequenceParallel() if sp else NoParallel(),
            p + "mlp.gate_proj": ColwiseParallel(),
            p + "mlp.up_proj": ColwiseParallel(),
            p + "mlp.down_proj": RowwiseParallel(output_layouts=seq, use_local_output=local_out),
        })
        if sp:
            plan[p + "self_attn"] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                        desired_input_layouts=(Replicate(), None, None))
            plan[p + "mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def batch(step, dp_rank, dp):
    """Global batch `step`: dp group `dp_rank`'s rows; every tp rank reads the same."""
    i = torch.arange(GLOBAL_BATCH).reshape(-1, 1)
    j = torch.arange(SEQ + 1).reshape(1, -1)
    seq = (i * 7 + j * 3 + step * 5 + (i * j) % 4 + 1) % VOCAB
    n = GLOBAL_BATCH // dp
    rows = seq[dp_rank * n:(dp_rank + 1) * n]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def global_rows(local, full):
    """Where `local` lies in `full`: [(first global row, rows, first column)]
    runs of its rows (matched by value: the rows' values are distinct; -1
    where no match)."""
    w = local.shape[1] if local.dim() > 1 else None
    found = []
    for r in range(local.shape[0]):
        hit = (-1, -1)
        for g in range(full.shape[0]):
            if w is None:
                if torch.equal(full[g], local[r]):
                    hit = (g, 0)
                    break
                continue
            for c in range(full.shape[1] - w + 1):
                if torch.equal(full[g, c:c + w], local[r]):
                    hit = (g, c)
                    break
            if hit[0] >= 0:
                break
        found.append(hit)
    runs = []
    for g, c in found:
        if runs and runs[-1][2] == c and runs[-1][0] + runs[-1][1] == g:
            runs[-1][1] += 1
        else:
            runs.append([g, 1, c])
    return [tuple(r) for r in runs]


TRACE = {"on": False, "phase": "", "log": []}


def install_trace():
    """Wraps redistribute_local_tensor where DTensor calls it (explicit
    redistribute, op dispatch, autograd backward) to log each transition."""
    import torch.distributed.tensor._api as api
    import torch.distributed.tensor._dispatch as dispatch
    import torch.distributed.tensor._redistribute as redis
    orig = redis.redistribute_local_tensor

    def traced(local_tensor, current_spec, target_spec, **kw):
        if TRACE["on"] and current_spec.placements != target_spec.placements:
            TRACE["log"].append((TRACE["phase"], tuple(str(x) for x in current_spec.placements),
                                 tuple(str(x) for x in target_spec.placements), tuple(current_spec.shape),
                                 str(local_tensor.dtype).replace("torch.", "")))
        return orig(local_tensor, current_spec, target_spec, **kw)

    for mod in (api, dispatch, redis):
        mod.redistribute_local_tensor = traced


def clip_norm_by_hand(model, mesh, norm_type=2.0):
    """The total gradient norm computed as docs/tensor-parallel.md says torch
    computes it, with plain tensors and plain all-reduces: a norm per local
    gradient; divided by tp^(1/p) where the gradient is Replicate on tp; stacked;
    then the dp and the tp reductions, each x^p -> all-reduce sum -> x^(1/p)
    (`order` gives which mesh dim first); then the norm of the stack. Returns
    {"dp,tp": value, "tp,dp": value} (the other order, to see whether it matters)."""
    norms = []
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad
        n = torch.linalg.vector_norm(g.to_local(), norm_type)
        if isinstance(g.placements[mesh.mesh_dim_names.index("tp")], Replicate):
            n = n / math.pow(mesh["tp"].size(), 1 / norm_type)
        norms.append(n)
    out = {}
    for order in (("dp", "tp"), ("tp", "dp")):
        x = torch.stack(norms)
        for name in order:
            x = x ** norm_type
            dist.all_reduce(x, group=mesh[name].get_group())
            x = x ** (1.0 / norm_type)
        out[",".join(order)] = torch.linalg.vector_norm(x, norm_type).item()
    return out


class _AllReduceSum(torch.autograd.Function):
    """Partial -> Replicate: all-reduce forward, identity backward (a
    Partial target becomes Replicate in _redistribute_backward)."""

    @staticmethod
    def forward(ctx, t, group):
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None


class _PartitionReplicate(torch.autograd.Function):
    """Replicate -> Partial inside an op's dispatch: t / n forward, the
    gradient passes undivided (no autograd node in torch)."""

    @staticmethod
    def forward(ctx, t, n):
        return t / n

    @staticmethod
    def backward(ctx, g):
        return g, None


def check_ops(tp_mesh):
    """The local formulas docs/tensor-parallel.md gives, against DTensor's own
    results, to the bit: {check: True/False}."""
    tp, j, group = tp_mesh.size(), tp_mesh.get_local_rank(), tp_mesh.get_group()
    same = lambda a, b: bool(torch.equal(a.detach(), b.detach()))
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t
    out = {}
    # 1. RowwiseParallel Linear with bias: addmm(bias / tp) then all-reduce; bias grad undivided.
    lin = nn.Linear(4 * tp, 6)
    with torch.no_grad():
        lin.weight.copy_(values_of([6, 4 * tp], 0.31, 0.1))
        lin.bias.copy_(values_of([6], 0.7, 0.3))
    W, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    x = values_of([2, 3, 4 * tp], 0.53, 0.2)
    xl = x.chunk(tp, dim=-1)[j].contiguous()
    up = values_of([2, 3, 6], 0.11, 0.4)
    parallelize_module(lin, tp_mesh, RowwiseParallel())
    y = lin(xl)
    (y * up).sum().backward()
    Wl = W.chunk(tp, dim=1)[j].clone().requires_grad_()
    bl = b.clone().requires_grad_()
    yh = _AllReduceSum.apply(F.linear(xl, Wl, _PartitionReplicate.apply(bl, tp)), group)
    (yh * up).sum().backward()
    out["rowwise_bias_forward"] = same(y, yh)
    out["rowwise_bias_weight_grad"] = same(local(lin.weight.grad), Wl.grad)
    out["rowwise_bias_bias_grad"] = same(local(lin.bias.grad), bl.grad)
    # 2. RowwiseParallel Embedding: masked ids, zeroed rows, all-reduce; full-vocabulary backward.
    V, D = 5 * tp, 4
    emb = nn.Embedding(V, D)
    with torch.no_grad():
        emb.weight.copy_(values_of([V, D], 0.23, 0.5))
    E = emb.weight.detach().clone()
    ids = (torch.arange(12).reshape(2, 6) * 7 + 3) % V
    up = values_of([2, 6, D], 0.17, 0.6)
    parallelize_module(emb, tp_mesh, RowwiseParallel(input_layouts=Replicate()))
    y = emb(ids)
    (y * up).sum().backward()
    n = V // tp
    lo = j * n
    mask = (ids < lo) | (ids >= lo + n)
    m = ids.clone() - lo
    m[mask] = 0
    yl = F.embedding(m, E.chunk(tp, dim=0)[j])
    yl[mask] = 0.0
    yh = _AllReduceSum.apply(yl, group)
    g_full = torch.ops.aten.embedding_dense_backward(up, ids, V, -1, False)
    out["embedding_forward"] = same(y, yh)
    out["embedding_grad_full_vocab"] = same(local(emb.weight.grad), g_full)  # torch's grad is Replicate [V, D]
    # 3. loss_parallel: log_softmax + nll on Shard(-1) logits, and its fused backward.
    N, Vl = 6, 3
    logits = values_of([N, Vl * tp], 0.41, 0.7) * 4
    target = torch.tensor([0, 5, 2 * tp, Vl * tp - 1, 1, 3]) % (Vl * tp)
    xl = logits.chunk(tp, dim=-1)[j].contiguous()
    leaf = xl.clone().requires_grad_()
    xd = DTensor.from_local(leaf, tp_mesh, [Shard(-1)], run_check=False)
    with loss_parallel():
        loss = F.cross_entropy(xd, target)
        loss.backward()
    xg = leaf.grad
    xh = xl.clone()
    mx = torch.amax(xh, -1, keepdim=True)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=group)
    shifted = xh - mx
    se = torch.sum(torch.exp(shifted), -1, keepdim=True)
    dist.all_reduce(se, group=group)
    logp = shifted - torch.log(se)
    tmask = (target < j * Vl) | (target >= (j + 1) * Vl)
    t = target.clone() - j * Vl
    t[tmask] = 0
    picked = torch.gather(logp, 1, t.unsqueeze(1))
    picked[tmask.unsqueeze(1)] = 0.0
    dist.all_reduce(picked, group=group)
    lh = (-picked.squeeze(1)).sum() / torch.tensor(float(N))
    gi = torch.zeros_like(logp)
    gi[torch.arange(N), t] = tmask.to(gi.dtype) - 1.0
    gh = (gi + torch.exp(logp)) * (torch.ones(()) / torch.tensor(float(N)))
    out["loss_parallel_loss"] = same(local(loss), lh)
    out["loss_parallel_grad"] = xg is not None and same(xg, gh)
    return out


def describe(p):
    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        # torch_offset: what DCP records for this rank's chunk (ChunkStorageMetadata).
        return {"mesh": tuple(p.device_mesh.mesh_dim_names or ()), "placements": tuple(str(x) for x in p.placements),
                "local_shape": tuple(p.to_local().shape), "global_shape": tuple(p.shape),
                "torch_shape": tuple(shape), "torch_offset": tuple(offset)}
    return {"plain": tuple(p.shape)}


def run(rank, args):
    dp = args.world // args.tp
    mesh = init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    facts = {}
    if args.check_ops:
        facts["check_ops"] = check_ops(mesh["tp"])
    model = make_model()
    full_init = {n: p.detach().clone() for n, p in model.named_parameters()}
    parallelize_module(model, mesh["tp"], tp_plan(args.sp, args.loss_parallel, args.dtensor_residual))
    if args.tied:
        # parallelize_module re-registered both weights (a tie would be broken):
        # re-tie after it, as a user does; named_parameters then lists it once.
        model.lm_head.weight = model.model.embed_tokens.weight
    facts["after_tp"] = {n: describe(p) for n, p in model.named_parameters()}
    if not args.no_fsdp:
        kwargs = {"mesh": mesh["dp"]}
        if args.bf16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
    facts["after_fsdp"] = {}
    for n, p in model.named_parameters():
        d = describe(p)
        local = p.to_local() if isinstance(p, DTensor) else p
        if local.dim() >= 1 and local.shape[0] > 0:
            d["global_rows"] = global_rows(local.detach(), full_init[n])
        facts["after_fsdp"][n] = d
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses, norms = [], []
    TRACE["log"] = []
    if args.trace and not TRACE.get("installed"):
        install_trace()
        TRACE["installed"] = True
    for step in range(args.steps):
        TRACE["on"] = args.trace and step == 0
        opt.zero_grad()
        tokens, labels = batch(step, dp_rank, dp)
        TRACE["phase"] = "forward"
        if args.loss_parallel:
            with loss_parallel():
                logits = model(tokens)
                # TorchTitan's cross_entropy_loss: .float() on the Shard(-1) DTensor logits.
                loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
                TRACE["phase"] = "backward"
                loss.backward()
        else:
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
            TRACE["phase"] = "backward"
            loss.backward()
        if step == 0:
            facts["logits"] = describe(logits)
            facts["loss"] = describe(loss)
            facts["grads"] = {n: describe(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        # The dp group's mean loss: every rank of a dp group has the same loss.
        lv = loss.full_tensor() if isinstance(loss, DTensor) else loss
        lv = lv.detach().float().clone()
        dist.all_reduce(lv, group=mesh["dp"].get_group())
        losses.append((lv / dp).item())
        if args.check_clip:
            TRACE["on"] = False
            by_hand = clip_norm_by_hand(model, mesh)
            TRACE["on"] = args.trace and step == 0
        TRACE["phase"] = "clip"
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=MAX_NORM)
        if step == 0:
            facts["norm"] = describe(norm)
        norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).item())
        if args.check_clip:
            facts.setdefault("clip_by_hand", []).append({"torch": norms[-1], **by_hand})
        TRACE["phase"] = "step"
        opt.step()
    TRACE["on"] = False
    facts["trace"] = TRACE["log"]
    out = {"args": vars(args), "losses": losses, "grad_norms": norms, "params": {}, "exp_avg": {}, "exp_avg_sq": {},
           "opt_step": {}}
    gather = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().clone()
    for n, p in model.named_parameters():
        out["params"][n] = gather(p)
        st = opt.state[p]
        out["exp_avg"][n] = gather(st["exp_avg"])
        out["exp_avg_sq"][n] = gather(st["exp_avg_sq"])
        out["opt_step"][n] = float(st["step"])
    all_facts = [None] * args.world
    dist.all_gather_object(all_facts, facts)
    out["facts"] = all_facts
    if rank == 0:
        torch.save(out, args.out)
        # The same numbers as one flat safetensors file for the C++ tests
        # (fsdp/formats/safetensors.h): float32 "loss" and "grad_norm" [steps],
        # then "param.NAME", "exp_avg.NAME", "exp_avg_sq.NAME" (full tensors).
        from safetensors.torch import save_file
        flat = {"loss": torch.tensor(losses, dtype=torch.float32),
                "grad_norm": torch.tensor(norms, dtype=torch.float32)}
        for key in ("params", "exp_avg", "exp_avg_sq"):
            prefix = "param." if key == "params" else key + "."
            for n, t in out[key].items():
                flat[prefix + n] = t.contiguous()
        save_file(flat, os.path.splitext(args.out)[0] + ".safetensors")


def worker(rank, args, cases):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    store = args.out + ".store"
    dist.init_process_group("gloo", rank=rank, world_size=args.world, init_method="file://" + os.path.abspath(store))
    try:
        for case in cases:
            run(rank, case)
    finally:
        dist.destroy_process_group()


CASE_FLAGS = {"sp": ("sp", True), "nosp": ("sp", False), "lp": ("loss_parallel", True), "bf16": ("bf16", True),
              "resid": ("dtensor_residual", True), "tied": ("tied", True), "nofsdp": ("no_fsdp", True),
              "trace": ("trace", True), "clip": ("check_clip", True), "ops": ("check_ops", True)}


def cases_of(args):
    """--cases "sp+lp,nosp": one Namespace per case (the other flags at their
    defaults), writing OUT.CASE.pt; without --cases, the flags given."""
    if not args.cases:
        return [args]
    out = []
    for case in args.cases.split(","):
        c = argparse.Namespace(**vars(args))
        for attr, _ in CASE_FLAGS.values():
            setattr(c, attr, attr == "sp")  # the defaults: SP on, every other flag off
        for flag in case.split("+"):
            if flag not in CASE_FLAGS:
                raise SystemExit(f"tp_oracle.py: unknown case flag {flag!r} in {case!r}; known: {sorted(CASE_FLAGS)}")
            attr, value = CASE_FLAGS[flag]
            setattr(c, attr, value)
        c.out = f"{args.out}.{case}.pt"
        out.append(c)
    return out


def check_case(args):
    if args.check_clip and args.no_fsdp:
        raise SystemExit("tp_oracle.py: --check-clip needs fully_shard (without it the norm gradients are Partial)")
    if args.no_fsdp and args.world != args.tp:
        raise SystemExit("tp_oracle.py: --no-fsdp needs --world == --tp (no dp dimension to reduce over)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--sp", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--loss-parallel", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--dtensor-residual", action="store_true")
    ap.add_argument("--no-fsdp", action="store_true")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--check-clip", action="store_true")
    ap.add_argument("--check-ops", action="store_true")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--cases", default="", help="comma-separated cases run in one launch, each flags joined by '+' "
                    f"from {sorted(CASE_FLAGS)}; OUT is then a prefix (OUT.CASE.pt)")
    args = ap.parse_args()
    if args.world % args.tp:
        raise SystemExit(f"tp_oracle.py: --tp {args.tp} does not divide --world {args.world}")
    cases = cases_of(args)
    for case in cases:
        check_case(case)
    for size, name in ((HEADS, "heads"), (KV_HEADS, "kv heads"), (VOCAB, "vocab"), (INTER, "intermediate"),
                       (HIDDEN, "hidden"), (SEQ, "sequence")):
        if size % args.tp:
            raise SystemExit(f"tp_oracle.py: --tp {args.tp} does not divide the {name} size {size}")
    if GLOBAL_BATCH % (args.world // args.tp):
        raise SystemExit(f"tp_oracle.py: dp {args.world // args.tp} does not divide the batch {GLOBAL_BATCH}")
    if os.path.exists(args.out + ".store"):
        os.remove(args.out + ".store")
    mp.spawn(worker, args=(args, cases), nprocs=args.world, join=True)
    if os.path.exists(args.out + ".store"):
        os.remove(args.out + ".store")


if __name__ == "__main__":
    main()
