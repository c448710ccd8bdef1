"""Tokens/s of the PyTorch reference (reference_test.py's model, float32, torch.optim.AdamW)
beside tier-train on the same shape, threads and batch: one line each (docs/benchmarks.md).

usage: reference_bench.py TIER_TRAIN LAYERS DIM HEADS SEQ BATCH STEPS THREADS
tier-train's first step is warm-up and not counted; PyTorch's mean is over all its steps."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_test as R  # noqa: E402
import torch  # noqa: E402


def main():
    exe, L, C, NH, T, B, steps, threads = sys.argv[1], *map(int, sys.argv[2:9])
    shape = {"layers": L, "dim": C, "heads": NH, "seq": T}
    r = subprocess.run([exe, *R.shape_args(shape), "--batch", str(B), "--steps", str(steps),
                        "--threads", str(threads), "--val-every", "-1", "--seed", "1",
                        # PyTorch's recipe below (reference_run), not tier-train's defaults
                        "--lr", "6e-4", "--grad-clip", "1", "--warmup", str(max(1, steps // 10))],
                       capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")][1:]
    ms = sum(x["ms"] for x in lines) / len(lines)
    opt = sum(x["opt_ms"] for x in lines) / len(lines)
    print(f"tier-train L={L} C={C} T={T} B={B} threads={threads}: {B * T / ms * 1e3:.0f} tokens/s "
          f"({ms:.0f} ms/step, optimizer {opt:.0f} ms = {opt / ms:.0%})")

    torch.set_num_threads(threads)
    P = {}
    for l, layer in enumerate(R.layer_shapes(L, C, 256, T)):
        for name, sh in layer:
            P[f"{l}.{name}"] = (torch.randn(sh) * 0.02) if len(sh) == 2 else torch.zeros(sh)
    with open("/usr/share/common-licenses/GPL-3", "rb") as f:
        data = f.read()
    t0 = time.perf_counter()
    R.reference_run(P, data, shape, steps, 1, B, 6e-4, 1.0)
    t = (time.perf_counter() - t0) / steps
    print(f"PyTorch {torch.__version__} same shape, threads={threads}: {B * T / t:.0f} tokens/s "
          f"({t * 1e3:.0f} ms/step)")


if __name__ == "__main__":
    main()
