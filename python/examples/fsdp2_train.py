#!/usr/bin/env python3
"""The small GPT of train_gpt.py sharded with FSDP2, its optimizer state in tierd, and
checkpoints through torch.distributed.checkpoint into tierd. PyTorch >= 2.4.

    torchrun --nproc-per-node 2 python/examples/fsdp2_train.py --pool fsdp-demo --steps 40
    torchrun --nproc-per-node 2 python/examples/fsdp2_train.py --pool fsdp-demo --steps 40 --resume

fully_shard() shards every block and the root (add --cpu-offload for CPUOffloadPolicy);
tierd.torch.OffloadAdamW keeps each rank's master shards and moments in the node's tierd and
commits every step, so after a crash --resume continues from the last step every rank committed,
bit-identically. Every --ckpt-every steps, dcp.async_save writes the model's sharded state dict
and the step through TierdWriter (staged straight into tierd, so the loop blocks only for that
copy), keeping the newest --keep checkpoints; --snapshot also takes a tierd snapshot so they
survive a reboot. --load CKPT starts from a DCP checkpoint's weights instead (with fresh moments).

Rank 0 prints JSON lines: {"resumed_step": K} with --resume, {"step", "loss", "ms"} per step
(the loss averaged over the ranks), {"checkpoint": ID, "blocked_ms": T} per checkpoint, and at
the end {"done": true, "checkpoints": [...]}. Gloo on the CPU; NCCL with --backend nccl.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import BUILTIN_TEXT, GPT, batch, lr_at  # noqa: E402

from tierd.torch import OffloadAdamW  # noqa: E402
from tierd.torch.checkpoint import TierdReader, TierdWriter, list_checkpoints  # noqa: E402


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool", required=True, help="the tierd pool of this job")
    ap.add_argument("--socket", default=None, help="tierd's socket (default $TIERD_SOCKET or /run/tierd/tierd.sock)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--resume", action="store_true", help="continue from the last committed step")
    ap.add_argument("--load", default=None, help="start from this DCP checkpoint's weights")
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--keep", type=int, default=2)
    ap.add_argument("--snapshot", action="store_true", help="take a tierd snapshot after each checkpoint")
    ap.add_argument("--cpu-offload", action="store_true", help="fully_shard(..., offload_policy=CPUOffloadPolicy())")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", default="gloo")
    return ap.parse_args()


def main():
    args = parse()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cuda" if args.backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.set_num_threads(1)
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(args.seed)
    model = GPT(args.layers, args.dim, args.heads, args.seq).to(device)
    kw = dict(mesh=mesh, offload_policy=CPUOffloadPolicy()) if args.cpu_offload else dict(mesh=mesh)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    if args.load:
        sd = model.state_dict()
        dcp.load({"model": sd}, storage_reader=TierdReader(args.pool, socket=args.socket), checkpoint_id=args.load)
        model.load_state_dict(sd)
    opt = OffloadAdamW(model.parameters(), pool=args.pool, socket=args.socket, lr=args.lr, weight_decay=0.1,
                       resume=args.resume)
    say = (lambda **kw: print(json.dumps(kw), flush=True)) if rank == 0 else (lambda **kw: None)
    if args.resume:
        say(resumed_step=opt.resumed_step)
    data = torch.tensor(list(BUILTIN_TEXT.encode()), dtype=torch.long)
    ckpt_pg = dist.new_group(backend="gloo")  # async_save's collectives run beside training's
    writer = TierdWriter(args.pool, socket=args.socket, keep=args.keep, snapshot=args.snapshot)
    pending = None
    for step in range(opt.resumed_step + 1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = batch(data, step * world + rank, args.seed, args.batch, args.seq)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.lr, args.warmup, args.steps)
        loss = model(x.to(device), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        say(step=step, loss=avg.item() / world, ms=round(1000 * (time.perf_counter() - t0), 2))
        if step % args.ckpt_every == 0 or step == args.steps:
            if pending is not None:
                pending.result()  # one checkpoint in flight at a time
            t1 = time.perf_counter()
            pending = dcp.async_save({"model": model.state_dict(), "step": step}, storage_writer=writer,
                                     checkpoint_id=f"step{step}", process_group=ckpt_pg)
            say(checkpoint=f"step{step}", blocked_ms=round(1000 * (time.perf_counter() - t1), 2))
    if pending is not None:
        pending.result()
    writer.close()
    dist.barrier()
    say(done=True, checkpoints=[c.checkpoint_id for c in list_checkpoints(args.pool, socket=args.socket)])
    opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
