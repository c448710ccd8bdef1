"""One small-GPT ZeRO-3 training job under DeepSpeed on the CPU (its CPU accelerator, gloo), the
workload of the deepspeed suite and its benchmarks. Prints `loss STEP HEX` per step (the float's
exact value), then `cpu` (the process's CPU seconds) and `done` (wall seconds) per step over steps
2.. at the end; run as a process of its own per job:

    python ds_gpt.py --offload {none,cpu,nvme} --handle {aio,tierd} --nvme-path DIR --steps 20
                     [--socket S --pool P --ram-quota BYTES] [--save DIR --save-at N]
                     [--load DIR] [--checkpoints] [--kill-at N] [--rss FILE]

Ranks: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment (default one rank).
Every rank draws the same batches from seed 1 and takes its slice, so the losses depend only on
the world size.
"""
import argparse
import os
import signal
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, DIM, LAYERS, CTX, BATCH = 2048, 256, 2, 32, 4


class GPT(nn.Module):
    """Token and position embeddings, pre-norm causal transformer blocks, a vocabulary head:
    every weight matrix is at least 1 MiB in float32, so ZeRO-3 swaps each one (DeepSpeed keeps
    smaller partitions in memory)."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(CTX, DIM)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x, y):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        for b in self.blocks:
            h = b(h, src_mask=mask, is_causal=True)
        logits = self.head(self.ln(h)).float()  # a float32 loss: every bit of the logits counts
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def config(args):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 1 << 18}
    if args.offload != "none":
        zero["offload_param"] = {"device": args.offload, "nvme_path": args.nvme_path,
                                 "buffer_count": 6, "buffer_size": 1 << 20}
        zero["offload_optimizer"] = {"device": args.offload, "nvme_path": args.nvme_path}
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False,
            "bf16": {"enabled": True}, "steps_per_print": 1 << 30, "wall_clock_breakdown": False,
            "aio": {"block_size": 1 << 20, "queue_depth": 8, "intra_op_parallelism": 1,
                    "single_submit": False, "overlap_events": True}}


def rss_figures():
    """This process's resident memory: anonymous, shared (file and shmem) and locked, bytes."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem", "VmLck", "VmRSS"):
                fields[key] = int(val.split()[0]) * 1024
    return fields


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--offload", choices=["none", "cpu", "nvme"], default="nvme")
    p.add_argument("--handle", choices=["aio", "tierd"], default="tierd")
    p.add_argument("--nvme-path", default="/tmp/ds_gpt_nvme")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--socket")
    p.add_argument("--pool", default="ds_gpt")
    p.add_argument("--ram-quota", type=int, default=0)
    p.add_argument("--checkpoints", action="store_true", help="TierCheckpointEngine")
    p.add_argument("--save")
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--load")
    p.add_argument("--kill-at", type=int, default=0, help="SIGKILL itself after this step")
    p.add_argument("--rss", help="write this rank's memory figures (JSON) to RSS.RANK after the run")
    args = p.parse_args()

    import deepspeed
    import deepspeed.ops
    # gloo does the collectives: DeepSpeed's CPU accelerator would otherwise JIT-build its
    # shared-memory all-reduce op (minutes of compiling) for the first run of every clone.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if args.handle == "tierd" and args.offload == "nvme" or args.checkpoints:
        import tierd.deepspeed
        tierd.deepspeed.install(args.pool, socket=args.socket, ram_quota=args.ram_quota or None,
                                checkpoints=args.checkpoints)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config(args))
    start = 0
    if args.load:
        path, client = engine.load_checkpoint(args.load)
        if path is None:
            sys.exit(f"no checkpoint in {args.load}")
        start = client["step"]
    gen = torch.Generator().manual_seed(1)
    t0, timed = None, 0
    for step in range(1, args.steps + 1):
        batch = torch.randint(0, VOCAB, (BATCH * world, CTX + 1), generator=gen)
        if step <= start:
            continue
        if step == start + 2:
            t0 = time.perf_counter()  # the first step (and its warm-up) is not timed
            c0 = time.process_time()
        x = batch[rank * BATCH:(rank + 1) * BATCH]
        loss = engine(x[:, :-1], x[:, 1:])
        engine.backward(loss)
        engine.step()
        if t0 is not None:
            timed += 1
        print(f"loss {step} {loss.item().hex()}", flush=True)
        if args.save and step == args.save_at:
            engine.save_checkpoint(args.save, tag=f"step{step}", client_state={"step": step})
            print(f"saved {step}", flush=True)
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    per_step = (time.perf_counter() - t0) / timed if timed else 0.0
    cpu_per_step = (time.process_time() - c0) / timed if timed else 0.0
    if args.rss:
        import json
        with open(f"{args.rss}.{rank}", "w") as f:
            json.dump(rss_figures(), f)
    if "tierd.deepspeed" in sys.modules and sys.modules["tierd._ds_swap"].current() is not None:
        s = sys.modules["tierd.deepspeed"].store()
        info = s.client.open_pool(s.pool)
        pinned = sum(e[2] for e in s.pinned.values())
        print(f"pool ram_used {info.ram_used} nvme_used {info.nvme_used} pinned {pinned} "
              f"swap_files {len(s.files)} swap_bytes {sum(f.size for f in s.files.values())} "
              f"plan {len(s.plan)}", flush=True)
    print(f"cpu {cpu_per_step:.6f}", flush=True)  # this process's CPU seconds per timed step
    print(f"done {per_step:.6f}", flush=True)


if __name__ == "__main__":
    main()
