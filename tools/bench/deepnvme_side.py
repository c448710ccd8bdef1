"""DeepNVMe's side of tools/bench-deepnvme: DeepSpeed's async I/O op on a directory.

Run with the virtual environment's python (tools/bench-deepnvme sets it up). For each size,
`total` bytes are moved as tensors of that size, one file per tensor, the way ZeRO-Infinity's
swapper moves them: async_pwrite (async_pread) of every tensor, then one wait(). The handle is
the one ZeRO-Infinity builds from its aio config, with block size 1 MiB and queue depth 32
(libaio, O_DIRECT), buffers from new_cpu_locked_tensor (page-aligned, mlocked), as the swapper's
pinned buffers are.

Per size, three figures, each one JSON line on stdout (GB/s = 1e9 bytes per second):
  deepnvme.write.first   the files' first write (created by this run: allocating writes)
  deepnvme.write         a rewrite of the same files (blocks already written: steady state);
                         the median of --samples rewrites, each followed by a read
  deepnvme.read          a read of them (the median of --samples)
Files are removed at the end of the run, not between sizes (on a filesystem mounted with
-o discard a removal makes the device discard in the background, slowing what follows).
Nothing is flushed: DeepNVMe's writes end at their completion. With --sync every file is
fdatasync'd after the wait, inside the timing (what the durability of a tierd spill would cost
this layout), and the write figures carry "synced": true.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

MiB = 1 << 20


def parse_size(s):
    units = {"K": 1 << 10, "M": MiB, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="directory on the device under test")
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M,1G")
    ap.add_argument("--total", default="512M", help="bytes moved per size (at least one tensor)")
    ap.add_argument("--block-size", type=int, default=MiB)
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--samples", type=int, default=1, help="rewrites and reads per size (their medians)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op parallelism (ZeRO-Infinity: 1)")
    ap.add_argument("--sync", action="store_true", help="fdatasync every file after its writes, timed")
    args = ap.parse_args()

    from deepspeed.ops.op_builder.async_io import AsyncIOBuilder  # built by tools/bench-deepnvme

    aio = AsyncIOBuilder().load(verbose=False)
    # (block_size, queue_depth, single_submit, overlap_events, thread_count): ZeRO-Infinity's
    # aio defaults except the queue depth.
    handle = aio.aio_handle(args.block_size, args.queue_depth, False, True, args.threads)
    work = os.path.join(args.dir, "deepnvme.%d" % os.getpid())
    os.makedirs(work, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    total = parse_size(args.total)
    biggest = max(max(total // s, 1) * s for s in sizes)
    import torch

    buf = handle.new_cpu_locked_tensor(biggest, torch.empty(0, dtype=torch.uint8))
    buf.copy_(torch.randint(0, 256, (biggest,), dtype=torch.uint8))
    keep = []
    try:
        for size in sizes:
            n = max(total // size, 1)
            paths = [os.path.join(work, "s%d-t%d.swp" % (size, i)) for i in range(n)]
            parts = [buf.narrow(0, i * size, size) for i in range(n)]
            # Kept alive to the end: the op's worker thread may drop its reference to a view
            # after wait() returned; if that were the last one it would need the GIL, which
            # wait() holds in this DeepSpeed version, and the next wait() would deadlock.
            keep.append(parts)

            def run(write):
                t0 = time.perf_counter()
                for p, path in zip(parts, paths):
                    rc = handle.async_pwrite(p, path) if write else handle.async_pread(p, path)
                    assert rc == 0, "aio submit failed for %s" % path
                done = handle.wait()
                assert done == n, "aio completed %d of %d" % (done, n)
                if write and args.sync:
                    for path in paths:
                        fd = os.open(path, os.O_RDONLY)
                        try:
                            os.fdatasync(fd)
                        finally:
                            os.close(fd)
                return n * size / (time.perf_counter() - t0) / 1e9

            first = run(True)
            writes, reads = [], []
            for _ in range(args.samples):  # a rewrite then a read, as tier-bench's spill then fetch
                writes.append(run(True))
                reads.append(run(False))
            for name, value in (("deepnvme.write.first", first), ("deepnvme.write", statistics.median(writes)),
                                ("deepnvme.read", statistics.median(reads))):
                fig = {"name": name, "bytes": size, "value": round(value, 4), "unit": "GB/s"}
                if args.sync and name != "deepnvme.read":
                    fig["synced"] = True
                print(json.dumps(fig), flush=True)
    finally:
        handle.free_cpu_locked_tensor(buf)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
