"""ZeRO-3 with parameters and optimizer state offloaded to NVMe (ZeRO-Infinity), through tierd.

The DeepSpeed config is the usual one (`device: nvme`, any `nvme_path`); the one line that
changes is `tierd.deepspeed.install(...)` before `deepspeed.initialize`. Run with the deepspeed
launcher, on GPUs:

    deepspeed --num_gpus 2 python/examples/deepspeed_zero3.py --pool job1 --steps 50

or on the CPU (DeepSpeed's CPU accelerator, gloo; what the deepspeed test suite runs):

    DS_ACCELERATOR=cpu deepspeed --num_accelerators 1 --bind_cores_to_rank \
        python/examples/deepspeed_zero3.py --pool job1 --steps 20
    DS_ACCELERATOR=cpu RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python python/examples/deepspeed_zero3.py --steps 20        # without the launcher

With --save DIR checkpoints go to tierd too (engine.save_checkpoint / load_checkpoint), and a
second run with --resume DIR continues from the last one. tierd must be running ($TIERD_SOCKET or
/run/tierd/tierd.sock, or --socket).
"""
import argparse
import os

import torch
from torch import nn

import deepspeed
import tierd.deepspeed


class GPT(nn.Module):
    def __init__(self, vocab=2048, dim=256, layers=2, ctx=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, x, y):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        for b in self.blocks:
            h = b(h, src_mask=mask, is_causal=True)
        logits = self.head(self.ln(h)).float()
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pool", default="deepspeed-example")
    p.add_argument("--socket", default=None)
    p.add_argument("--nvme-path", default="/tmp/deepspeed-example-nvme")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save", default=None, help="checkpoint directory (its bytes go to tierd)")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--resume", default=None, help="load the latest checkpoint of this directory")
    p.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    args = p.parse_args()

    # The one line: DeepSpeed's NVMe swap I/O, its pinned buffers and its checkpoints go to tierd.
    tierd.deepspeed.install(args.pool, socket=args.socket, checkpoints=bool(args.save or args.resume))

    config = {
        "train_micro_batch_size_per_gpu": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "sub_group_size": 1 << 18,
            "offload_param": {"device": "nvme", "nvme_path": args.nvme_path, "buffer_count": 6,
                              "buffer_size": 1 << 20},
            "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme_path},
        },
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
    }
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        # gloo does the collectives; DeepSpeed would otherwise JIT-build its shared-memory
        # all-reduce op first (minutes of compiling).
        import deepspeed.ops
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo" if os.environ.get("DS_ACCELERATOR") == "cpu" else "nccl")
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    start = 0
    if args.resume:
        path, client = engine.load_checkpoint(args.resume)
        start = client["step"] if path else 0
    rank, world = engine.global_rank, engine.world_size
    gen = torch.Generator().manual_seed(1)
    for step in range(1, args.steps + 1):
        batch = torch.randint(0, 2048, (4 * world, 33), generator=gen)
        if step <= start:
            continue
        x = batch[rank * 4:(rank + 1) * 4].to(engine.device)
        loss = engine(x[:, :-1], x[:, 1:])
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if args.save and step % args.save_every == 0:
            engine.save_checkpoint(args.save, tag=f"step{step}", client_state={"step": step})


if __name__ == "__main__":
    main()
