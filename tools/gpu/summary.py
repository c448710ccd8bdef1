#!/usr/bin/env python3
"""summary.py WORK PEAK MODEL BATCH STEPS BUFFERS: WORK/summary.json from what DIR/run has
written into its working folder so far.

Rewritten after every step, so a run cut short still leaves the figures it reached. PEAK is the
dense bf16 TFLOP/s to take MFU against; 0: the device's own (tier-bench-gpu --info, from its
compute capability, SM count and clock). Fields:
  steps, gpu_steps / cpu_steps    every step's status, and their counts
  why                             the last lines of stderr of each step that is not ok
  ldd                             per bundled binary: "ok" or the libraries ldd cannot find
  machine, peak_tflops            devices; the peak MFU is taken against (and where it came from)
  gemm                            cuBLAS bf16 GEMM TFLOP/s on the device, and its fraction of the peak
  register                        first copy of a 1 GiB lease (registers) vs cudaMallocHost + copy, ms
  h2d, d2h                        from 64 MiB up: arena GB/s, cudaMallocHost GB/s, ratio (>= 0.95)
  small_copies                    1-16 MiB: microseconds per copy, arena vs plain cudaMemcpyAsync
  train                           per run: median step ms, TFLOP/s, MFU, fraction of the cuBLAS
                                  rate, H2D GB/s, final loss; tier_over_resident (<= 1.05,
                                  same --buffers), reference_over_flash (attention),
                                  pipeline_over_host (device pipeline vs host staging: one rank
                                  runs no NCCL, so this is not an NCCL figure)
  offload_adamw                   python-adamw (offload_adamw_gpu.py): per run (OffloadAdamW on
                                  CUDA parameters, torch.optim.AdamW(fused=True), OffloadAdamW
                                  on CPU parameters, torch AdamW on CPU) the median step ms; per
                                  comparison max_abs, max_rel, rel_norm and whether it is within
                                  its bound; the step-time ratios
"""
import json
import os
import statistics
import sys


def lines(work, name):
    rows = []
    path = os.path.join(work, name)
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def tail(work, name, n=3):
    path = os.path.join(work, name)
    if not os.path.exists(path):
        return []
    return [l.rstrip() for l in open(path, errors="replace").readlines()[-n:]]


def train(work, name, peak, gemm_tflops):
    rows = [r for r in lines(work, name + ".out") if "step" in r and "ms" in r]
    steady = rows[2:] if len(rows) > 3 else rows  # the first steps warm allocators and caches
    if not steady:
        return None
    ms = statistics.median(r["ms"] for r in steady)
    tf = statistics.median(r.get("tflops", 0.0) for r in steady)
    h2d = [r["h2d_gbps"] for r in steady if isinstance(r.get("h2d_gbps"), (int, float))]
    return {"steps": len(rows), "median_ms": ms, "median_tflops": tf,
            "mfu": tf / peak if peak else None,
            "of_cublas_gemm": tf / gemm_tflops if gemm_tflops else None,
            "median_h2d_gbps": statistics.median(h2d) if h2d else None,
            "median_opt_ms": statistics.median(r.get("opt_ms", 0.0) for r in steady),
            "final_loss": rows[-1].get("loss")}


def ratio(a, b):
    return a["median_ms"] / b["median_ms"] if a and b and b["median_ms"] else None


def ldd_report(work):
    out = {}
    for line in tail(work, "ldd.txt", 10000):
        if line.startswith("ldd "):
            name, _, what = line[4:].partition(": ")
            out[name] = what
        elif line.startswith("lib ") or line.startswith("python3:"):
            out.setdefault("_found", []).append(line)
    return out


def main():
    work, peak_arg, model, batch, steps, buffers = sys.argv[1:7]
    step_rows = lines(work, "steps.jsonl")
    counts, why = {}, {}
    for r in step_rows:
        group = "cpu_steps" if r.get("kind") == "cpu" else "gpu_steps"
        counts.setdefault(group, {}).setdefault(r["status"], 0)
        counts[group][r["status"]] += 1
        if r["status"] not in ("ok", "no_device"):
            why[r["step"]] = tail(work, r["step"] + ".err")
    machine = None
    try:
        machine = json.load(open(os.path.join(work, "machine.json")))
    except (OSError, ValueError):
        pass
    gemm_row = next((b for b in lines(work, "gemm.out") if b.get("name") == "gpu_gemm_bf16"), None)
    peak, peak_from = float(peak_arg), "PEAK_TFLOPS"
    if not peak:
        devs = (machine or {}).get("devices") or [{}]
        peak, peak_from = float(devs[0].get("bf16_peak_tflops") or 0), "device 0 (tier-bench-gpu --info)"
    gemm_tf = gemm_row["value"] if gemm_row else None
    bench = lines(work, "bench-h2d.out")

    def by(name, unit_value, unit_base):
        return [{"bytes": b["bytes"], unit_value: b["value"], unit_base: b["baseline"], "ratio": b["ratio"]}
                for b in bench if b.get("name") == name]

    h2d = by("gpu_h2d_arena", "arena_gbps", "pinned_gbps")
    runs = {n: train(work, "train-" + n, peak, gemm_tf) for n in ("resident", "tier", "reference", "host")}
    summary = {
        "steps": step_rows,
        **counts,
        "all_ok": bool(step_rows) and all(r["status"] == "ok" for r in step_rows),
        "why": why,
        "ldd": ldd_report(work),
        "machine": machine,
        "peak_tflops": peak or None,
        "peak_from": peak_from if peak else "unknown device: MFU not computed",
        "gemm": {"tflops": gemm_tf, "of_peak": gemm_tf / peak if gemm_tf and peak else None,
                 "m_n_k": 8192} if gemm_row else None,
        "register": next((b for b in bench if b.get("name") == "gpu_register_first_copy"), None),
        "h2d": h2d,
        "d2h": by("gpu_d2h_arena", "arena_gbps", "pinned_gbps"),
        "h2d_ratio_min": min((b["ratio"] for b in h2d), default=None),
        "h2d_target": 0.95,
        "small_copies": {"h2d": by("gpu_h2d_small_us", "arena_us", "memcpy_us"),
                         "d2h": by("gpu_d2h_small_us", "arena_us", "memcpy_us")},
        "bench_pipeline": lines(work, "bench-pipeline.out"),
        "offload_adamw": {r["name"]: {k: v for k, v in r.items() if k != "name"}
                          for r in lines(work, "python-adamw.out") if "name" in r} or None,
        "train": {"model": model, "batch": int(batch), "steps": int(steps), "buffers": int(buffers),
                  **runs,
                  "tier_over_resident": ratio(runs["tier"], runs["resident"]),
                  "target": 1.05,
                  "reference_over_flash": ratio(runs["reference"], runs["resident"]),
                  "pipeline_over_host": ratio(runs["resident"], runs["host"])},
    }
    with open(os.path.join(work, "summary.json.tmp"), "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(os.path.join(work, "summary.json.tmp"), os.path.join(work, "summary.json"))


if __name__ == "__main__":
    main()
