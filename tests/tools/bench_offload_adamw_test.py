"""tools/bench-offload-adamw end to end at a shape small enough for CI (4 parameters of 256 x 256,
one round, no DeepSpeed: its CPU Adam op is JIT-built on first use): every variant asked for
prints its runs and a summary with a positive step time and bandwidth; every variant but the
probes and the offload baseline carries a ratio that is its step over the baseline's; the
probes set the ceiling (the faster probe reads of_ceiling 1); OffloadAdamW's breakdown covers
its step; an unknown variant is refused with exit code 2. No timing is asserted.

Usage: bench_offload_adamw_test.py BUILD_DIR, run with the tools/py-env python (PyTorch 2).
Exits 77 (skipped) without PyTorch 2 or without a built tierd."""
import json
import os
import subprocess
import sys

from torch2_bench_support import require

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench-offload-adamw")
VARIANTS = ["offload", "offload-copy", "tier-kernel", "torch-fused", "offload-bf16", "triad", "copy"]


def main():
    build = sys.argv[1]
    require(build, "tierd", "the peers need PyTorch 2")
    bad = subprocess.run([sys.executable, TOOL, "--build", build, "--variants", "nonesuch"], capture_output=True,
                         text=True)
    assert bad.returncode == 2, f"an unknown variant: exit {bad.returncode}, want 2\n{bad.stderr}"
    r = subprocess.run([sys.executable, TOOL, "--build", build, "--dim", "256", "--tensors", "4", "--steps", "3",
                        "--rounds", "1", "--threads", "1", "--variants", ",".join(VARIANTS)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"bench-offload-adamw exited {r.returncode}:\n{r.stderr}"
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    runs = {x["name"] for x in lines if "name" in x and not x["name"].startswith("summary:")}
    assert runs == set(VARIANTS), sorted(runs)
    summary = {x["name"][len("summary:"):]: x for x in lines if x.get("name", "").startswith("summary:")}
    assert set(summary) == set(VARIANTS), sorted(summary)
    for v, s in summary.items():
        assert s["step_ms"] > 0 and s["gb_s"] > 0 and s["of_ceiling"] > 0, s
    assert max(summary[p]["of_ceiling"] for p in ("triad", "copy")) == 1.0, summary
    for v in ("offload-copy", "tier-kernel", "torch-fused"):
        s = summary[v]
        want = s["step_ms"] / summary["offload"]["step_ms"]
        assert abs(s["ratio"] - want) <= 0.01 * want + 0.002, (v, s, want)
    for v in ("offload", "offload-bf16", "triad", "copy"):
        assert "ratio" not in summary[v], summary[v]
    parts = summary["offload"]["breakdown_ms"]
    assert set(parts) == {"kernel", "leases", "commit", "rest"} and parts["kernel"] > 0, parts
    print("bench-offload-adamw: every variant reported;", json.dumps({v: s["step_ms"] for v, s in summary.items()}))


if __name__ == "__main__":
    main()
