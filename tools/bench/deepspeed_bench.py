"""The body of tools/bench-deepspeed (see there): tierd.deepspeed vs DeepSpeed's libaio handle.
Prints one table per part, the baseline measured in the same run, alternating with tierd."""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import ds_testutil as dt
import tierd_testutil as tu


def load_avg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def daemon_cpu(d):
    """tierd's user + system CPU seconds so far."""
    with open(f"/proc/{d.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_step(d, work, rounds):
    variants = {
        "tierd": ["--offload", "nvme", "--handle", "tierd", "--socket", d.socket, "--pool", "bench_step",
                  "--nvme-path", os.path.join(work, "step-tierd")],
        "aio": ["--offload", "nvme", "--handle", "aio", "--nvme-path", os.path.join(work, "step-aio")],
        "cpu": ["--offload", "cpu"],
    }
    times = {k: [] for k in variants}
    cpus = {k: [] for k in variants}
    mem = {}
    for r in range(rounds):
        for name, args in variants.items():
            rss = os.path.join(work, f"rss-{name}")
            before = daemon_cpu(d)
            job = dt.Job([*args, "--steps", 20, "--rss", rss], tmp=work).wait().check(name)
            # tierd's CPU time over the whole job (start-up included) / 20: an upper bound per step
            extra = (daemon_cpu(d) - before) / 20 if name == "tierd" else 0.0
            times[name].append(float(dt.field(job.out(), "done")))
            cpus[name].append(float(dt.field(job.out(), "cpu")) + extra)
            with open(rss + ".0") as f:
                mem[name] = json.load(f)
            if name == "tierd":
                mem[name]["pool_pinned"] = int(dt.field(job.out(), "pinned"))
    print(f"\n## step: small GPT, ZeRO-3, params+optimizer offloaded, 20 steps, {rounds} round(s); load {load_avg()}")
    print("| variant | s/step (median of rounds) | rounds | ratio aio/variant |")
    print("| --- | --- | --- | --- |")
    base = statistics.median(times["aio"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {' '.join(f'{t:.3f}' for t in ts)} | {base / med:.2f} |")
    per_round = [a / t for a, t in zip(times["aio"], times["tierd"])]
    print(f"per-round wall ratio aio/tierd (>= 1: tierd at least as fast): {' '.join(f'{x:.2f}' for x in per_round)}")
    print("\n| variant | CPU s/step (job process; tierd's added for tierd) | rounds | ratio aio/variant |")
    print("| --- | --- | --- | --- |")
    base = statistics.median(cpus["aio"])
    for name, cs in cpus.items():
        med = statistics.median(cs)
        print(f"| {name} | {med:.3f} | {' '.join(f'{c:.3f}' for c in cs)} | {base / med:.2f} |")
    print("\n| variant | RssAnon MiB | RssFile MiB | RssShmem MiB | VmLck MiB | pinned buffers in the tierd pool MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, m in mem.items():
        mib = lambda k: f"{m.get(k, 0) / 2**20:.1f}"  # noqa: E731
        print(f"| {name} | {mib('RssAnon')} | {mib('RssFile')} | {mib('RssShmem')} | {mib('VmLck')} | "
              f"{mib('pool_pinned') if 'pool_pinned' in m else '-'} |")


def bench_io(d, work, rounds, sizes):
    import torch
    import tierd.deepspeed as tds
    from deepspeed.ops.op_builder import AsyncIOBuilder
    aio_cls = AsyncIOBuilder().load().aio_handle  # DeepSpeed's, before install
    tds.install("bench_io", socket=d.socket)
    ours = tds.AioHandle(block_size=1 << 20, queue_depth=32, intra_op_parallelism=1)
    theirs = aio_cls(1 << 20, 32, False, True, 1)
    folder = os.path.join(work, "io", "zero_stage_3", "bench")
    os.makedirs(folder, exist_ok=True)
    print(f"\n## io: swap write/read, GB/s, best of {rounds}; aio files in {folder}; load {load_avg()}")
    print("| MiB | tierd write | aio write | ratio | tierd read | aio read | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mib in sizes:
        n = mib << 20
        bufs = {"tierd": ours.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8)),
                "aio": theirs.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))}
        for b in bufs.values():
            b.fill_(1)
        handles = {"tierd": ours, "aio": theirs}
        best = {(h, op): 0.0 for h in handles for op in ("w", "r")}
        for _ in range(rounds):
            for op in ("w", "r"):
                for h, handle in handles.items():
                    path = os.path.join(folder, f"{h}-{mib}.swp")
                    t0 = time.perf_counter()
                    if op == "w":
                        handle.async_pwrite(bufs[h], path, 0)
                    else:
                        handle.async_pread(bufs[h], path, 0)
                    assert handle.wait() == 1
                    best[(h, op)] = max(best[(h, op)], n / (time.perf_counter() - t0) / 1e9)
        print(f"| {mib} | {best[('tierd', 'w')]:.2f} | {best[('aio', 'w')]:.2f} | "
              f"{best[('tierd', 'w')] / best[('aio', 'w')]:.2f} | {best[('tierd', 'r')]:.2f} | "
              f"{best[('aio', 'r')]:.2f} | {best[('tierd', 'r')] / best[('aio', 'r')]:.2f} |")
        ours.free_cpu_locked_tensor(bufs["tierd"])
        theirs.free_cpu_locked_tensor(bufs["aio"])
    tds.uninstall()


def bench_ckpt(d, work, rounds, mib=256):
    import torch
    import tierd
    import tierd.deepspeed as tds
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    engines = {"tierd": tds.TierCheckpointEngine("bench_ckpt", client=tierd.connect(d.socket)),
               "torch": TorchCheckpointEngine()}
    engines["tierd"].client.create_pool("bench_ckpt", exist_ok=True)
    state = {f"w{i}": torch.randn((mib << 20) // 4 // 8) for i in range(8)}
    best = {(e, op): 0.0 for e in engines for op in ("save", "load")}
    for _ in range(rounds):
        for op in ("save", "load"):
            for e, eng in engines.items():
                path = os.path.join(work, "ckpt", e, "model_states.pt")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                t0 = time.perf_counter()
                if op == "save":
                    eng.save(state, path)
                else:
                    back = eng.load(path, map_location="cpu")
                    assert torch.equal(back["w7"], state["w7"])
                best[(e, op)] = max(best[(e, op)], (mib << 20) / (time.perf_counter() - t0) / 1e9)
    print(f"\n## ckpt: {mib} MiB state dict, GB/s, best of {rounds}; torch.save/load to {work}; load {load_avg()}")
    print("| op | TierCheckpointEngine | TorchCheckpointEngine (disk) | ratio |")
    print("| --- | --- | --- | --- |")
    for op in ("save", "load"):
        print(f"| {op} | {best[('tierd', op)]:.2f} | {best[('torch', op)]:.2f} | "
              f"{best[('tierd', op)] / best[('torch', op)]:.2f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("parts", nargs="*", default=["step", "io", "ckpt"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sizes", default="1,4,16,64,256")
    p.add_argument("--dir", default=None, help="where DeepSpeed's files go (default: a temporary dir)")
    args = p.parse_args()
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-deepspeed.", dir=args.dir)
    d = tu.Daemon(ram="3G")
    print(f"tools/bench-deepspeed {' '.join(sys.argv[1:])}: tierd {d.socket}, files in {work}, "
          f"{os.cpu_count()} CPUs, load {load_avg()}")
    try:
        if "step" in args.parts:
            bench_step(d, work, args.rounds)
        if "io" in args.parts:
            bench_io(d, work, max(args.rounds, 3), [int(s) for s in args.sizes.split(",")])
        if "ckpt" in args.parts:
            bench_ckpt(d, work, max(args.rounds, 3))
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
