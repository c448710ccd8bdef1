"""One rank of the torch2 suites (test_fsdp2_offload.py, test_dcp.py): an FSDP2 model on the
CPU with gloo, trained with OffloadAdamW or torch.optim.AdamW, checkpointed through tierd.

    python fsdp2_worker.py JSON        JSON: {"rank", "world", "init" (a FileStore path), "socket",
                                        "pool", "mode", "out" (a file for this rank's results), ...}

Every rank appends one JSON line per result to its `out` file and flushes it, so a rank killed
with SIGKILL leaves the lines it wrote. Batches depend only on (seed, step, rank): a resumed run
sees the same ones as an uninterrupted run.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from tierd.torch import OffloadAdamW
from tierd.torch.checkpoint import TierdReader, TierdWriter

DIM_IN, HIDDEN, DIM_OUT = 13, 37, 5  # odd sizes: FSDP2 shards them unevenly


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.Tanh(), torch.nn.Linear(HIDDEN, DIM_OUT))


def shard(model: torch.nn.Module, world: int, offload: bool) -> torch.nn.Module:
    mesh = init_device_mesh("cpu", (world,))
    kw = dict(mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False)) if offload else dict(mesh=mesh)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, DIM_IN, generator=g), torch.randn(8, DIM_OUT, generator=g)


def train_step(model, opt, step: int, rank: int) -> float:
    x, y = batch(step, rank)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def local_state(model) -> dict:
    return {k: v.to_local().detach().clone().tolist() for k, v in model.state_dict().items()}


def full_state(model) -> dict:
    return {k: v.full_tensor().detach().clone().tolist() for k, v in model.state_dict().items()}


class Out:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, **kw):
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()


def make_opt(args, model, resume=False):
    if args.get("optim", "offload") == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=False)
    return OffloadAdamW(model.parameters(), pool=args["pool"], socket=args["socket"], lr=3e-3, weight_decay=0.1,
                        resume=resume)


def run_train(args, out):
    """Trains to args["steps"] (resuming with args["resume"]); one line per step."""
    model = shard(make_model(7), args["world"], args.get("offload", False))
    opt = make_opt(args, model, resume=args.get("resume", False))
    start = getattr(opt, "resumed_step", 0)
    out(resumed=start)
    for step in range(start + 1, args["steps"] + 1):
        out(step=step, loss=train_step(model, opt, step, args["rank"]))


def run_compare(args, out):
    """Three FSDP2 models from the same initialization, trained side by side on the same
    batches: OffloadAdamW, torch.optim.AdamW, and OffloadAdamW under CPUOffloadPolicy (pool
    args["pool"] + "-cpuoff"); one line per step with the three losses."""
    runs = []
    for optim, offload, pool in (("offload", False, args["pool"]), ("adamw", False, None),
                                 ("offload", True, args["pool"] + "-cpuoff")):
        model = shard(make_model(7), args["world"], offload)
        runs.append((model, make_opt(dict(args, optim=optim, pool=pool), model)))
    for step in range(1, args["steps"] + 1):
        losses = [train_step(model, opt, step, args["rank"]) for model, opt in runs]
        out(step=step, loss=losses[0], adamw=losses[1], cpu_offload=losses[2])


def run_save(args, out):
    """Trains 3 steps with AdamW, saves through TierdWriter (or as args["ckpt"] says), and
    writes the local shards and the full state it saved."""
    model = shard(make_model(7), args["world"], False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    for step in range(1, 4):
        train_step(model, opt, step, args["rank"])
    out(local=local_state(model), full=full_state(model))
    dcp.save(model.state_dict(), storage_writer=TierdWriter(args["pool"], socket=args["socket"]),
             checkpoint_id=args["ckpt"])
    out(saved=args["ckpt"])


def run_load(args, out):
    """Loads args["ckpt"] into a fresh (differently initialized) FSDP2 model on this many ranks."""
    model = shard(make_model(99), args["world"], False)
    sd = model.state_dict()
    dcp.load(sd, storage_reader=TierdReader(args["pool"], socket=args["socket"]), checkpoint_id=args["ckpt"])
    model.load_state_dict(sd)
    out(local=local_state(model))


def run_async(args, out):
    """async_save at step 3 on a checkpoint process group while steps 4..6 go on, then a load."""
    ckpt_pg = dist.new_group(backend="gloo")
    model = shard(make_model(7), args["world"], False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    writer = TierdWriter(args["pool"], socket=args["socket"])
    fut = None
    for step in range(1, 7):
        train_step(model, opt, step, args["rank"])
        if step == 3:
            out(at3=local_state(model))
            fut = dcp.async_save(model.state_dict(), storage_writer=writer, checkpoint_id="async3",
                                 process_group=ckpt_pg)
            out(overlapped=not fut.done())
    fut.result()
    writer.close()
    fresh = shard(make_model(99), args["world"], False)
    sd = fresh.state_dict()
    dcp.load(sd, storage_reader=TierdReader(args["pool"], socket=args["socket"]), checkpoint_id="async3")
    fresh.load_state_dict(sd)
    out(loaded=local_state(fresh), now=local_state(model))


MODES = {"train": run_train, "compare": run_compare, "save": run_save, "load": run_load, "async": run_async}


def main():
    args = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args['init']}", rank=args["rank"],
                            world_size=args["world"])
    try:
        MODES[args["mode"]](args, Out(args["out"]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
