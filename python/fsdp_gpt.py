"""fsdp-cpp's GPT (include/fsdp/models/gpt.h, src/models/gpt.cpp) in PyTorch.

Same module names, so the state-dict keys and the parameter order are those of
the C++ model, and the same math (pre-norm blocks, causal attention, exact
GELU, output projection tied to the token embedding), so a checkpoint trained
in one continues with the same losses in the other:

    model = fsdp_gpt.GPT(fsdp_gpt.GPTConfig(**config))
    model.load_state_dict(torch.load("full.pt", weights_only=True)["model"])
    loss = fsdp_gpt.gpt_loss(model(inputs), targets)

The initialisation draws from the C++ model's distributions (GPT-2's), not
its values: weights come from checkpoints. Dropout is not modelled (the C++
default is 0).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 256
    context: int = 128
    dim: int = 256
    layers: int = 4
    heads: int = 4


class GPTBlock(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)); modules registered in the C++ order."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        if c.heads <= 0 or c.dim % c.heads:
            raise ValueError(f"GPT: heads={c.heads} must divide dim={c.dim}")
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.dim, eps=1e-5)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)
        self.ln2 = nn.LayerNorm(c.dim, eps=1e-5)
        self.fc = nn.Linear(c.dim, 4 * c.dim)
        self.fc_proj = nn.Linear(4 * c.dim, c.dim)
        for layer in (self.qkv, self.proj, self.fc, self.fc_proj):  # GPT-2's: N(0, 0.02), residuals scaled down
            nn.init.normal_(layer.weight, 0.0, 0.02)
            nn.init.zeros_(layer.bias)
        for layer in (self.proj, self.fc_proj):
            nn.init.normal_(layer.weight, 0.0, 0.02 / (2.0 * c.layers) ** 0.5)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)  # [3, B, H, T, C/H]
        q, k, v = qkv[0], qkv[1], qkv[2]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab_size, c.dim)
        self.pos = nn.Embedding(c.context, c.dim)
        self.blocks = nn.Sequential(*[GPTBlock(c) for _ in range(c.layers)])
        self.ln_f = nn.LayerNorm(c.dim, eps=1e-5)
        nn.init.normal_(self.tok.weight, 0.0, 0.02)
        nn.init.normal_(self.pos.weight, 0.0, 0.02)

    def forward(self, tokens):
        T = tokens.size(1)
        if T > self.config.context:
            raise ValueError(f"GPT: sequence of {T} tokens is longer than the context {self.config.context}")
        x = self.tok(tokens) + self.pos(torch.arange(T, device=tokens.device))
        return F.linear(self.ln_f(self.blocks(x)), self.tok.weight)  # tied output projection


def gpt_loss(logits, targets):
    """Mean next-token cross-entropy of logits [B, T, V] against targets [B, T], in float32."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
