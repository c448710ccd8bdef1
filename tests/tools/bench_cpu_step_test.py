"""tools/bench-cpu-step end to end on this build's tier-train, at a shape small enough for CI (its
"tiny" shape, one round): both sides must train the same model on the same batches from the
same parameters, so every step's loss of tier-train and of both PyTorch runs must agree (fp32
on both sides: relative 1e-4); the summary must carry positive step times and their ratio. Bad
options are refused with exit code 2. No timing is asserted.

Usage: bench_cpu_step_test.py BUILD_DIR, run with the tools/py-env python (PyTorch 2). Exits 77
(skipped) without PyTorch 2 or without a built tier-train."""
import json
import os
import subprocess
import sys

from torch2_bench_support import require

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench-cpu-step")


def main():
    build = sys.argv[1]
    require(build, "tier-train", "the bench needs PyTorch 2")
    bad = subprocess.run([sys.executable, TOOL, "--shapes", "nonesuch"], capture_output=True, text=True)
    assert bad.returncode == 2, f"an unknown shape: exit {bad.returncode}, want 2\n{bad.stderr}"
    r = subprocess.run([sys.executable, TOOL, "--build", build, "--shapes", "tiny", "--rounds", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"bench-cpu-step exited {r.returncode}:\n{r.stderr}"
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    runs = {x["side"]: x for x in lines if x["name"] == "train.cpu_step.run"}
    assert set(runs) == {"tier-train", "pytorch-default", "pytorch-passive"}, sorted(runs)
    ref = runs["tier-train"]["loss"]
    assert len(ref) == 3, ref
    for side, run in runs.items():
        for step, (a, b) in enumerate(zip(ref, run["loss"]), 1):
            assert abs(a - b) <= 1e-4 * abs(a), f"step {step}: tier-train loss {a}, {side} {b}"
    (summary,) = [x for x in lines if x["name"] == "train.cpu_step"]
    for key in ("tier_ms", "pytorch_ms", "ratio"):
        assert summary[key] > 0, f"{key} = {summary[key]}"
    # CPU times come in clock ticks (10 ms): a tiny step may read 0, and then has no ratio.
    assert summary["tier_cpu_ms"] >= 0 and summary["pytorch_cpu_ms"] >= 0, summary
    assert (summary["cpu_ratio"] is None) == (summary["tier_cpu_ms"] == 0), summary
    assert abs(summary["ratio"] - summary["pytorch_ms"] / summary["tier_ms"]) < 1e-3 * summary["ratio"], summary
    print("bench-cpu-step: losses agree on all sides;", json.dumps(summary))


if __name__ == "__main__":
    main()
