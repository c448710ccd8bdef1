#!/usr/bin/env python3
"""summary.py OUT PEAK MODEL BATCH STEPS: OUT/summary.json from what DIR/run has written so far.

Rewritten after every step, so a run cut short still leaves the figures it reached. Fields:
steps (every step's status), gpu_steps / cpu_steps (status counts), h2d (per size: arena GB/s,
cudaMallocHost GB/s, ratio; target >= 0.95), train (median step ms, TFLOP/s and MFU against
PEAK for --state resident and tier, their ratio; target <= 1.05), bench_pipeline, machine.
"""
import json
import os
import statistics
import sys


def lines(out, name):
    rows = []
    path = os.path.join(out, name)
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def train(out, name, peak):
    rows = [r for r in lines(out, name + ".out") if "step" in r and "ms" in r]
    steady = rows[2:] if len(rows) > 3 else rows  # the first steps warm allocators and caches
    if not steady:
        return None
    ms = statistics.median(r["ms"] for r in steady)
    tf = statistics.median(r.get("tflops", 0.0) for r in steady)
    return {"steps": len(rows), "median_ms": ms, "median_tflops": tf, "mfu": tf / peak,
            "final_loss": rows[-1].get("loss")}


def main():
    out, peak, model, batch, steps = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    step_rows = lines(out, "steps.jsonl")
    counts = {}
    for r in step_rows:
        group = "cpu_steps" if r.get("kind") == "cpu" else "gpu_steps"
        counts.setdefault(group, {}).setdefault(r["status"], 0)
        counts[group][r["status"]] += 1
    bench = lines(out, "bench-h2d.out")
    h2d = [{"bytes": b["bytes"], "arena_gbps": b["value"], "pinned_gbps": b["baseline"],
            "ratio": b["ratio"]} for b in bench if b.get("name") == "gpu_h2d_arena"]
    d2h = [{"bytes": b["bytes"], "arena_gbps": b["value"], "pinned_gbps": b["baseline"],
            "ratio": b["ratio"]} for b in bench if b.get("name") == "gpu_d2h_arena"]
    res, tier = train(out, "train-resident", peak), train(out, "train-tier", peak)
    host = train(out, "train-host", peak)
    machine = None
    try:
        machine = json.load(open(os.path.join(out, "machine.json")))
    except (OSError, ValueError):
        pass
    summary = {
        "steps": step_rows,
        **counts,
        "all_ok": bool(step_rows) and all(r["status"] == "ok" for r in step_rows),
        "machine": machine,
        "h2d": h2d,
        "d2h": d2h,
        "h2d_ratio_min": min((b["ratio"] for b in h2d), default=None),
        "h2d_target": 0.95,
        "register": next((b for b in bench if b.get("name") == "gpu_register_arena"), None),
        "bench_pipeline": lines(out, "bench-pipeline.out"),
        "train": {"model": model, "batch": int(batch), "steps": int(steps), "peak_tflops": peak,
                  "resident": res, "tier": tier,
                  "tier_over_resident": tier["median_ms"] / res["median_ms"] if res and tier else None,
                  "target": 1.05,
                  "host_collectives": host,
                  "nccl_over_host": res["median_ms"] / host["median_ms"] if res and host else None},
    }
    with open(os.path.join(out, "summary.json.tmp"), "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(os.path.join(out, "summary.json.tmp"), os.path.join(out, "summary.json"))


if __name__ == "__main__":
    main()
