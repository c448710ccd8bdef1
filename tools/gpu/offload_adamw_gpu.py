#!/usr/bin/env python3
"""offload_adamw_gpu.py --socket SOCK [--steps N] [--params M]: tierd.torch.OffloadAdamW with
CUDA parameters against torch.optim.AdamW(fused=True) on the GPU and against OffloadAdamW's
own run on CPU parameters; the `python-adamw` step of the GPU bundle (tools/gpu/run).

Every run starts from the same parameters (M million fp32 values in eight tensors) and takes
the same N steps with the same gradients (fixed random tensors mixed by step, independent of
the parameters, so the runs never diverge through their losses: a difference in the
parameters is the optimizers' arithmetic alone), weight decay 0.1, lr 1e-3, betas (0.9, 0.95).
One JSON line per run (name, step_ms: the median over the steps after the first two, timed
from the gradient being in place to the updated parameters being usable, with the device
synchronized on both sides) and per comparison (max_abs, max_rel: the largest
|a - b| / max(|b|, 1e-3) over all elements, and rel_norm: ||a - b|| / ||b||).

Without a CUDA device the CPU comparison (OffloadAdamW on CPU parameters against
torch.optim.AdamW on the CPU) still runs and the script prints "no CUDA device: the CUDA runs
are skipped" on stderr (the run step's status is then no_device). Exit status: 0 done, 1 a
comparison outside its bound, 2 usage.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

import tierd  # noqa: F401  (the extension built for this python: tools/gpu/build-python)
from tierd.torch import OffloadAdamW

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
# OffloadAdamW's update and torch's agree to an ulp or so per element per step (the kernels
# group the operations differently: tests/python/test_offload_adamw.py); the same gradients
# feed every run, so the differences stay per-step rounding and do not feed back.
# After N <= 50 steps of lr 1e-3 a parameter of size ~1 has moved by at most N * lr.
# rel_norm bound: the same 1e-5 the CPU test holds OffloadAdamW to against torch.
REL_NORM_BOUND = 1e-5
SOCKET = [""]  # tierd's socket (--socket)


def shapes(millions: float) -> List[tuple]:
    """Eight 2-D tensors of about `millions` M values together (a transformer's matrices)."""
    cols = 1024
    rows = max(1, int(millions * 1e6 / 8 / cols))
    return [(rows, cols)] * 8


def initial(shp: List[tuple]) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(s, generator=g) * 0.02 for s in shp]


class Gradients:
    """Step s's gradient of every tensor: a * c1(s) + b * c2(s) for two fixed random tensors a,
    b, computed on the CPU (one multiply, one multiply, one add: the same bits for every run)
    and copied to the run's device; cheap enough to make afresh each step."""

    def __init__(self, shp: List[tuple]):
        g = torch.Generator().manual_seed(1000)
        self.a = [torch.randn(s, generator=g) * 1e-2 for s in shp]
        self.b = [torch.randn(s, generator=g) * 1e-2 for s in shp]

    def at(self, step: int, device: torch.device) -> List[torch.Tensor]:
        c1, c2 = 1.0 / (step + 1) ** 0.5, math.sin(0.7 * step)
        return [(a * c1 + b * c2).to(device) for a, b in zip(self.a, self.b)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(name: str, make_opt: Callable, device: torch.device, steps: int, shp: List[tuple], grads: Gradients,
        pool: Optional[str] = None) -> Dict:
    """`steps` steps of make_opt(params) from initial(shp) on `device`; `pool`: its tierd pool,
    dropped after the run so the runs after it get the RAM."""
    params = [torch.nn.Parameter(t.clone().to(device)) for t in initial(shp)]
    opt = make_opt(params)
    times = []
    for s in range(steps):
        for p, g in zip(params, grads.at(s, device)):
            p.grad = g
        sync(device)
        t0 = time.perf_counter()
        opt.step()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    if pool is not None:
        opt.close()
        tierd.connect(SOCKET[0], name="offload_adamw_gpu").drop_pool(pool)
    steady = times[2:] if len(times) > 3 else times
    row = {"name": name, "device": str(device), "steps": steps, "params": sum(p.numel() for p in params),
           "step_ms": statistics.median(steady), "first_step_ms": times[0]}
    print(json.dumps(row), flush=True)
    return {"row": row, "params": [p.detach().to("cpu", torch.float32) for p in params]}


def compare(name: str, a: List[torch.Tensor], b: List[torch.Tensor]) -> Dict:
    max_abs = max_rel = 0.0
    diff2 = ref2 = 0.0
    for x, y in zip(a, b):
        d = (x - y).abs()
        max_abs = max(max_abs, d.max().item())
        max_rel = max(max_rel, (d / y.abs().clamp_min(1e-3)).max().item())
        diff2 += float(d.double().pow(2).sum())
        ref2 += float(y.double().pow(2).sum())
    rel_norm = (diff2 ** 0.5) / max(ref2 ** 0.5, 1e-30)
    row = {"name": name, "max_abs": max_abs, "max_rel": max_rel, "rel_norm": rel_norm,
           "rel_norm_bound": REL_NORM_BOUND, "ok": rel_norm <= REL_NORM_BOUND}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="tierd's socket")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--params", type=float, default=64.0, help="millions of fp32 parameters")
    a = ap.parse_args()
    if a.steps < 1 or a.params <= 0:
        ap.error("--steps and --params must be positive")
    shp = shapes(a.params)
    SOCKET[0] = a.socket
    tag = f"{os.getpid()}"

    def offload(pool: str):
        return lambda ps: OffloadAdamW(ps, pool=pool, socket=a.socket, lr=LR, betas=BETAS, eps=EPS,
                                       weight_decay=WD)

    cpu = torch.device("cpu")
    ok = True
    grads = Gradients(shp)
    off_cpu = run("offload_adamw_cpu_params", offload(f"adamw-cpu-{tag}"), cpu, a.steps, shp, grads,
                  f"adamw-cpu-{tag}")
    torch_cpu = run("torch_adamw_cpu", lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS, eps=EPS,
                                                                   weight_decay=WD), cpu, a.steps, shp, grads)
    ok &= compare("offload_cpu_params_vs_torch_cpu", off_cpu["params"], torch_cpu["params"])["ok"]
    if not torch.cuda.is_available():
        print("no CUDA device: the CUDA runs are skipped (torch.cuda.is_available() is false)", file=sys.stderr)
        return 0 if ok else 1
    dev = torch.device("cuda", torch.cuda.current_device())
    off_gpu = run("offload_adamw_cuda_params", offload(f"adamw-cuda-{tag}"), dev, a.steps, shp, grads,
                  f"adamw-cuda-{tag}")
    fused = run("torch_adamw_fused_cuda", lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS, eps=EPS,
                                                                      weight_decay=WD, fused=True),
                dev, a.steps, shp, grads)
    ok &= compare("offload_cuda_params_vs_torch_fused", off_gpu["params"], fused["params"])["ok"]
    ok &= compare("offload_cuda_params_vs_offload_cpu_params", off_gpu["params"], off_cpu["params"])["ok"]
    print(json.dumps({"name": "step_time_ratio",
                      "offload_cuda_over_torch_fused": off_gpu["row"]["step_ms"] / fused["row"]["step_ms"],
                      "offload_cuda_over_offload_cpu": off_gpu["row"]["step_ms"] / off_cpu["row"]["step_ms"]}),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
