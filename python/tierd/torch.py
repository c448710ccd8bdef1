"""tierd.torch: tierd as the offload store of an ordinary PyTorch training loop.

    from tierd.torch import OffloadAdamW
    opt = OffloadAdamW(model.parameters(), pool="job1", lr=3e-4, weight_decay=0.1, resume=True)
    start = opt.resumed_step            # 0 for a new job; the last committed step after a crash
    for step in range(start, steps):
        loss = model(batch(step)).mean()
        loss.backward()
        opt.step()                      # updates the parameters, then commits the step
        opt.zero_grad()

The optimizer state does not live in the process: for every parameter, tierd's pool holds its
fp32 master copy and both AdamW moments, twice (a tensor "g<group>.p<index>.<buffer>" of shape
(3, numel): rows master, exp_avg, exp_avg_sq), and a small tensor "commit" says which of the two
buffers holds the last committed step. A step reads buffer A through read leases and writes
buffer B through overwrite leases, then writes the commit record: until that record is written
the previous step stays intact, so a process killed at any instant loses at most the step in
flight. A new process that builds the same model and passes resume=True gets the parameters of
the last committed step copied into its model and opt.resumed_step set; training from there is
bit-identical to a run that was never interrupted (given the same batches and learning rates).

The update is tier-train's AdamW (tierd.adamw_step: vectorized, OpenMP threads, no GIL), with
the arithmetic of torch.optim.AdamW: decoupled weight decay, bias correction.

Parameters on a GPU work through a copy: the gradient is copied to host memory as float32 and
the updated master copy back into the parameter (any floating dtype). This path is synchronous;
see docs/python.md for what is and is not overlapped.
"""
from __future__ import annotations

import hashlib
import os
import signal
import warnings
from typing import Any, Iterable, Optional

import torch

import tierd

__all__ = ["OffloadAdamW"]

_COMMIT = "commit"
# The commit record: two slots of int64 [step, check, layout, buffer]; the valid slot with the
# larger step is the committed state. Two slots, written alternately, so that a record torn by
# a kill in the middle of its write leaves the other one intact.
_SLOT_WORDS = 4
_MASK63 = (1 << 63) - 1


# A fault-injection point for the crash tests (tests/python/test_offload_adamw.py):
# TIERD_TORCH_KILL_AT="STEP:INDEX" kills this process with SIGKILL inside step() number STEP,
# right after parameter INDEX's new state was written and before the commit.
_KILL_AT = tuple(int(x) for x in os.environ["TIERD_TORCH_KILL_AT"].split(":")) \
    if os.environ.get("TIERD_TORCH_KILL_AT") else None


def _check_word(step: int, layout: int, buffer: int) -> int:
    """A value no torn or zeroed slot matches by accident."""
    return ((step * 0x9E3779B97F4A7C15) ^ (layout * 0xC2B2AE3D27D4EB4F) ^ (buffer + 0x165667B1)) & _MASK63


class OffloadAdamW(torch.optim.Optimizer):
    """AdamW whose fp32 master parameters and moments live in a tierd pool.

    Args:
        params: parameters or parameter groups, as for torch.optim.AdamW.
        pool: the tierd pool of this job (created when missing). Tensor names come from each
            parameter's position in the param groups, so the same model finds its state again.
        socket: tierd's socket (default $TIERD_SOCKET, else /run/tierd/tierd.sock).
        lr, betas, eps, weight_decay: as torch.optim.AdamW (per group where groups set them).
        resume: continue from the last step committed in `pool` (its parameters are copied
            into the model); with nothing committed there yet, start fresh with a warning.
        ram_quota, nvme_quota: the pool's quotas in bytes when it is created (None: tierd's
            defaults).

    Attributes:
        resumed_step: the number of steps already taken when this optimizer was built (0 for
            a fresh start); the training loop continues from there.
        committed_step: the number of steps committed so far.
    """

    def __init__(self, params: Iterable[Any], *, pool: str, socket: Optional[str] = None, lr: float = 1e-3,
                 betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 resume: bool = False, ram_quota: Optional[int] = None, nvme_quota: Optional[int] = None):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError("lr, eps and weight_decay must be >= 0")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._pool = pool
        self._client = tierd.connect(socket, name="OffloadAdamW")
        self._client.create_pool(pool, ram_quota=ram_quota or 0, nvme_quota=nvme_quota or 0, exist_ok=True)
        self._slots = []  # (param, [TensorInfo buffer 0, buffer 1])
        layout = []
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if not p.is_floating_point():
                    raise TypeError(f"parameter {gi}.{pi} has dtype {p.dtype}; AdamW needs floating point")
                n = p.numel()
                bufs = []
                for b in (0, 1):
                    try:
                        t = self._client.create_tensor(pool, f"g{gi}.p{pi}.{b}", shape=(3, n), dtype="float32",
                                                       exist_ok=True)
                    except tierd.AlreadyExists:  # exists with another size
                        t = self._client.open_tensor(pool, f"g{gi}.p{pi}.{b}")
                    if t.size != 3 * 4 * n:
                        raise ValueError(f"pool '{pool}' holds tensor g{gi}.p{pi}.{b} of {t.size} bytes, but "
                                         f"parameter {gi}.{pi} needs {3 * 4 * n}: a different model; use another pool")
                    bufs.append(t)
                self._slots.append((p, bufs))
                layout.append((gi, pi, tuple(p.shape)))
        digest = hashlib.blake2b(repr(layout).encode(), digest_size=8).digest()
        self._layout = int.from_bytes(digest, "little") & _MASK63
        self._commit = self._client.create_tensor(pool, _COMMIT, shape=(2, _SLOT_WORDS), dtype="int64",
                                                  exist_ok=True)

        committed = self._read_commit()
        if resume and committed is not None:
            self._step, self._buffer, self._slot = committed
            self._load_params()
        else:
            if resume:
                warnings.warn(f"OffloadAdamW: pool '{pool}' holds no committed step of this model; "
                              "starting fresh", RuntimeWarning, stacklevel=2)
            self._step, self._buffer, self._slot = 0, 0, 1  # so the first commit writes slot 0
            self._init_state()
        self.resumed_step = self._step
        for p, _ in self._slots:
            self.state[p]["step"] = self._step

    # --- leases ------------------------------------------------------------------------------

    def _leased(self, tensor, mode: str, fn, other=None, other_mode: str = "r"):
        """fn(rows) on a lease of `tensor` (rows: its float32/int64 numpy view), or
        fn(rows, other_rows) with a second lease. The views exist only inside fn: a lease is
        released only once no view of it is left (the binding refuses otherwise)."""
        with self._client.lease(tensor, mode) as lease:
            if other is None:
                return fn(lease.numpy())
            with self._client.lease(other, other_mode) as second:
                return fn(lease.numpy(), second.numpy())

    # --- the commit record -------------------------------------------------------------------

    def _read_commit(self):
        """(step, buffer, slot) of the valid slot with the larger step, or None."""
        words = self._leased(self._commit, "r", lambda rows: rows.copy())
        best = None
        for slot in (0, 1):
            step, check, layout, buffer = (int(x) for x in words[slot])
            if step < 0 or buffer not in (0, 1) or layout != self._layout:
                continue
            if check != _check_word(step, layout, buffer):
                continue
            if best is None or step > best[0]:
                best = (step, buffer, slot)
        return best

    def _write_commit(self, step: int, buffer: int) -> None:
        """Makes (step, buffer) the committed state by writing the slot not holding it now."""
        slot = 1 - self._slot

        def write(words):
            words[slot] = (step, _check_word(step, self._layout, buffer), self._layout, buffer)
        self._leased(self._commit, "w", write)
        self._step, self._buffer, self._slot = step, buffer, slot

    # --- state in the tier ---------------------------------------------------------------------

    @torch.no_grad()
    def _init_state(self) -> None:
        """Buffer 0 := (parameters, zeros, zeros), committed as step 0."""
        self._leased(self._commit, "o", lambda words: words.fill(0))  # both slots invalid
        for p, bufs in self._slots:
            def fill(rows, p=p):
                rows[0] = p.detach().reshape(-1).to(device="cpu", dtype=torch.float32).numpy()
                rows[1:] = 0
            self._leased(bufs[0], "o", fill)
        self._slot = 1
        self._write_commit(0, 0)

    @torch.no_grad()
    def _load_params(self) -> None:
        """Copies the committed master parameters into the model."""
        for p, bufs in self._slots:
            master = torch.from_numpy(self._leased(bufs[self._buffer], "r", lambda rows: rows[0].copy()))
            p.copy_(master.view_as(p))

    # --- the step ------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter, then the commit. Returns closure()'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t = self._step + 1
        src, dst = self._buffer, 1 - self._buffer
        i = 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                param, bufs = self._slots[i]
                i += 1
                assert param is p, "param_groups changed after the optimizer was built"
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError("OffloadAdamW does not support sparse gradients")

                def update(b, a, p=p, group=group, beta1=beta1, beta2=beta2):
                    if p.grad is None:  # no gradient: the state carries over unchanged
                        b[:] = a
                        return
                    g = p.grad.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous().numpy()
                    tierd.adamw_step(a[0], a[1], a[2], g, b[0], b[1], b[2], lr=group["lr"], beta1=beta1,
                                     beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"], step=t)
                    p.copy_(torch.from_numpy(b[0]).view_as(p))
                self._leased(bufs[dst], "o", update, other=bufs[src], other_mode="r")
                self.state[p]["step"] = t
                if _KILL_AT == (t, i - 1):
                    os.kill(os.getpid(), signal.SIGKILL)
        self._write_commit(t, dst)
        return loss

    @property
    def committed_step(self) -> int:
        return self._step

    # --- state_dict, for users who also save files ---------------------------------------------

    def state_dict(self) -> dict:
        """torch.optim.AdamW's layout: per parameter index step, exp_avg, exp_avg_sq."""
        state = {}
        groups = []
        i = 0
        for group in self.param_groups:
            idx = []
            for p in group["params"]:
                _, bufs = self._slots[i]
                rows = self._leased(bufs[self._buffer], "r", lambda r: r[1:].copy())
                state[i] = {"step": torch.tensor(float(self._step)),
                            "exp_avg": torch.from_numpy(rows[0]).view_as(p),
                            "exp_avg_sq": torch.from_numpy(rows[1]).view_as(p)}
                idx.append(i)
                i += 1
            groups.append({k: v for k, v in group.items() if k != "params"} | {"params": idx})
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Takes hyperparameters and moments from `state_dict` (as saved by state_dict() or by
        torch.optim.AdamW); the master copies are the model's current parameters. Committed at
        the saved step."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} param groups, this optimizer {len(self.param_groups)}")
        for mine, saved in zip(self.param_groups, groups):
            if len(saved["params"]) != len(mine["params"]):
                raise ValueError("state_dict's param groups differ in size from this optimizer's")
            for k, v in saved.items():
                if k != "params":
                    mine[k] = tuple(v) if k == "betas" else v
        saved_state = state_dict["state"]
        dst = 1 - self._buffer
        step = 0
        i = 0
        for group, saved in zip(self.param_groups, groups):
            for p, key in zip(group["params"], saved["params"]):
                _, bufs = self._slots[i]
                i += 1
                st = saved_state.get(key, {})
                def fill(rows, p=p, st=st):
                    rows[0] = p.detach().reshape(-1).to(device="cpu", dtype=torch.float32).numpy()
                    for row, name in ((1, "exp_avg"), (2, "exp_avg_sq")):
                        if name in st:
                            rows[row] = st[name].detach().reshape(-1).to(device="cpu", dtype=torch.float32).numpy()
                        else:
                            rows[row] = 0
                self._leased(bufs[dst], "o", fill)
                if "step" in st:
                    step = max(step, int(float(st["step"])))
        self._write_commit(step, dst)
        for p, _ in self._slots:
            self.state[p]["step"] = step

    def close(self) -> None:
        """Ends the connection to tierd (the state stays in the pool)."""
        self._client.close()

