#!/usr/bin/env python3
"""A small GPT in plain PyTorch, trained with tierd.torch.OffloadAdamW.

    python3 python/examples/train_gpt.py --pool gpt-demo --steps 50            # a new job
    python3 python/examples/train_gpt.py --pool gpt-demo --steps 50 --resume   # after a crash

The optimizer's master parameters and moments live in tierd's pool, and each step commits, so
a run killed at any point continues with --resume from the last committed step and produces the
same losses as a run that was never interrupted. One JSON line per step on stdout:
{"step": N, "loss": L, "lr": LR, "ms": T}; with --resume a first line {"resumed_step": K}; at the
end {"done": true, "param_sum": S} (S: the sum of every parameter, in float64).

Data: a byte-level corpus (--data FILE, or a built-in text); batch i is drawn by a generator
seeded with (--seed, i), so every run sees the same batches at the same steps.

Several processes (torchrun --nproc-per-node 2 python/examples/train_gpt.py ...): each rank
takes its share of every batch's rows, OffloadAdamW averages the gradients and keeps only the
rank's slice of the state (ZeRO-2), and rank 0 prints the loss averaged over the ranks. Gloo
on the CPU; NCCL when --backend nccl.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from tierd.torch import OffloadAdamW

BUILTIN_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be "
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered the rightful property of some one or other of "
    "their daughters. "
) * 16


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x):                                      # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)        # (B, T, C) each
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)           # (B, NH, T, T)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, seq, vocab=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for m in self.modules():                               # GPT-2's initialization
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):                           # idx, targets: (B, T)
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()            # tied head: (B, T, vocab)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(step, lr, warmup, total):
    """Linear warmup, then cosine to lr/10 (step is 1-based)."""
    if step <= warmup:
        return lr * step / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def batch(data, step, seed, b, t):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - t - 1, (b,), generator=g)
    x = torch.stack([data[s:s + t] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + t + 1] for s in starts.tolist()])
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", required=True, help="the tierd pool of this job")
    ap.add_argument("--socket", default=None, help="tierd's socket (default $TIERD_SOCKET or /run/tierd/tierd.sock)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--resume", action="store_true", help="continue from the last committed step")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=None, help="a text file (default: a built-in paragraph)")
    ap.add_argument("--step-delay-ms", type=float, default=0, help="sleep after each step (for kill tests)")
    ap.add_argument("--backend", default="gloo", help="torch.distributed backend with several ranks (default gloo)")
    a = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group(a.backend)
        if a.batch % world:
            ap.error(f"--batch {a.batch} is not a multiple of the {world} ranks")
    say = (lambda obj: print(json.dumps(obj), flush=True)) if rank == 0 else (lambda obj: None)

    raw = open(a.data, "rb").read() if a.data else BUILTIN_TEXT.encode()
    data = torch.tensor(list(raw), dtype=torch.long)
    torch.manual_seed(a.seed)
    model = GPT(a.layers, a.dim, a.heads, a.seq)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = OffloadAdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                       pool=a.pool, socket=a.socket, lr=a.lr, betas=(0.9, 0.95), resume=a.resume)
    if a.resume:
        say({"resumed_step": opt.resumed_step})
    for step in range(opt.resumed_step + 1, a.steps + 1):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.warmup, a.steps)
        x, y = batch(data, step, a.seed, a.batch, a.seq)
        rows = slice(rank * a.batch // world, (rank + 1) * a.batch // world)  # this rank's share
        loss = model(x[rows], y[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        shown = loss.detach().clone()
        if world > 1:
            torch.distributed.all_reduce(shown)
            shown /= world
        say({"step": step, "loss": shown.item(), "lr": opt.param_groups[0]["lr"],
             "ms": round((time.perf_counter() - t0) * 1000, 3)})
        if a.step_delay_ms:
            time.sleep(a.step_delay_ms / 1000)
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    say({"done": True, "param_sum": total})
    if world > 1:
        # Every rank past its last collective before any tears its connections down: a gloo
        # rank whose peer has already closed may abort in its own teardown.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
