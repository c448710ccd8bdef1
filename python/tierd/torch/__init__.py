"""tierd.torch: tierd as the offload store of an ordinary PyTorch training loop.

    from tierd.torch import OffloadAdamW
    opt = OffloadAdamW(model.parameters(), pool="job1", lr=3e-4, weight_decay=0.1, resume=True)
    start = opt.resumed_step            # 0 for a new job; the last committed step after a crash
    for step in range(start + 1, steps + 1):
        loss = model(batch(step)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()                      # updates the parameters, then commits the step

The optimizer state does not live in the process. tierd's pool holds, twice (buffers 0 and 1),
the fp32 master copy and both AdamW moments of every parameter: a float32 tensor of shape
(3, n) whose rows are master, exp_avg and exp_avg_sq. A step reads the committed buffer through
read leases and writes the other one through overwrite leases, then writes a commit record
(tensor "commit"); until that record is written the previous step stays intact, so a process
killed at any instant loses at most the step in flight. A new process that builds the same
model and passes resume=True gets the parameters of the last committed step copied into its
model and opt.resumed_step set; training from there is bit-identical to a run that was never
interrupted (given the same batches and learning rates).

One process: a tensor per parameter, "g<group>.p<index>.<buffer>", named by the parameter's
position in the param groups. With torch.distributed initialized and more than one rank
(ZeRO-2): the parameters are one flat partition, and each rank keeps and updates only its
1/world slice, in "zero.r<rank>of<world>.<buffer>" and "commit.r<rank>of<world>". Gradients
are averaged across ranks and reduce-scattered (all-reduced where the backend has no
reduce-scatter, as gloo), each rank updates its slice, and the new parameters are all-gathered
into every rank's model. Do not also wrap the model in DistributedDataParallel: the optimizer
does the gradient averaging. Ranks on one node share that node's tierd.

FSDP2 (torch.distributed.fsdp.fully_shard, parameters as DTensors; PyTorch 2): FSDP2 has
already reduce-scattered and averaged each gradient, so each rank updates the local shards of
its parameters as one process would, in "fsdp.r<rank>of<world>.g<group>.p<index>.<buffer>" and
"commit.r<rank>of<world>" (tierd/torch/_fsdp.py). With CPUOffloadPolicy the shards are in host
memory and are updated in place; on a GPU they take the copies described below.

The update is tier-train's AdamW (tierd.adamw_step: vectorized, OpenMP threads, no GIL), with
the arithmetic of torch.optim.AdamW: decoupled weight decay, bias correction.

Host float32 parameters of one process live in the pool (params_in_pool=True, the default):
each parameter's storage is the master row of the committed buffer, mapped zero-copy under a
read lease that this optimizer holds between steps. A step then moves what an in-place AdamW
moves (master, moments and gradient read; the other buffer's rows written), with no copy into
the model; after the commit the parameters are re-pointed at the new buffer (`p.data`), and the
old buffer's lease is released. Keep no view of a parameter's storage across a step (a
state_dict held without copying it): the next step must overwrite that buffer, and refuses with
an error naming the parameter while such a view lives. params_in_pool=False keeps parameters in
process memory and copies each new master into them.

Parameters on a GPU work through copies: the gradient is copied to host memory as float32 and
the updated master copy back into the parameter (any floating dtype), synchronously.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import warnings
from typing import Any, Iterable, List, Optional

import torch

import tierd
from tierd.torch import _fsdp

__all__ = ["OffloadAdamW"]

# The commit record: two slots of int64 [step, check, layout, buffer], written alternately, so
# that a record torn by a kill in the middle of its write leaves the other one intact. The
# valid slot with the larger step is the committed state; a sharded job resumes at the largest
# step every rank still holds (a rank may be one step ahead of another).
_SLOT_WORDS = 4
_MASK63 = (1 << 63) - 1

# A fault-injection point for the crash tests (tests/python/test_offload_adamw.py):
# TIERD_TORCH_KILL_AT="STEP:WHERE" kills this process with SIGKILL inside step() number STEP:
# WHERE a number INDEX: right after the new state of unit INDEX (a parameter; the rank's slice
# when sharded) was written; "INDEX:leased": the same, while its leases are still held;
# WHERE "commit": after every update (and the all-gather) and just
# before the commit record. TIERD_TORCH_KILL_RANK=R limits it to rank R.
_KILL_AT = os.environ.get("TIERD_TORCH_KILL_AT", "")
_KILL_RANK = os.environ.get("TIERD_TORCH_KILL_RANK", "")


def _kill_point(rank: int, step: int, where) -> None:
    if _KILL_AT and _KILL_AT == f"{step}:{where}" and _KILL_RANK in ("", str(rank)):
        os.kill(os.getpid(), signal.SIGKILL)


def _check_word(step: int, layout: int, buffer: int) -> int:
    """A value no torn or zeroed slot matches by accident."""
    return ((step * 0x9E3779B97F4A7C15) ^ (layout * 0xC2B2AE3D27D4EB4F) ^ (buffer + 0x165667B1)) & _MASK63


@dataclasses.dataclass
class _Segment:
    """Elements [param_off, param_off + length) of parameter `param` (its index in the flat
    list of all parameters) at elements [unit_off, unit_off + length) of a unit's rows."""
    param: int
    param_off: int
    unit_off: int
    length: int


def _flat_f32(t: torch.Tensor, device=None) -> torch.Tensor:
    """`t` as one flat float32 tensor (on `device`; default: where it is). No copy when it
    already is one."""
    return t.detach().reshape(-1).to(device=device or t.device, dtype=torch.float32)


def _host_grad(p: torch.Tensor) -> torch.Tensor:
    """p's gradient on the host, flat and contiguous: as it is for a bf16 parameter with a bf16
    gradient (the mixed-precision update reads it so), float32 otherwise."""
    if p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16 and not p.grad.is_cuda:
        return p.grad.detach().reshape(-1).contiguous()
    return _flat_f32(p.grad, "cpu").contiguous()


@dataclasses.dataclass
class _Unit:
    """A pair of tier tensors (buffers 0 and 1) of shape (3, n) and what they hold."""
    tensors: list
    n: int
    segments: List[_Segment]

    @property
    def covered(self) -> int:
        """The segments tile [0, covered); the rest (a last rank's padding) holds no parameter."""
        return sum(s.length for s in self.segments)


class _GpuGrad:
    """A gradient whose copy to pinned host memory is in flight on the side stream."""

    def __init__(self, host: torch.Tensor, done):
        self.host, self.done = host, done

    def wait(self):
        self.done.synchronize()
        return self.host.numpy()


class _GpuPath:
    """Parameters on a GPU (one process). At the start of a step every gradient is queued for
    copy to its pinned host buffer on a side stream (after the backward pass on the current
    stream), each with an event, so the update of parameter i waits only for gradient i while
    the later ones are still copying. Each updated master row goes from the lease into a pinned
    buffer and back to the device on the same side stream, overlapping the next parameter's
    update; the current stream waits for the side stream at the end of the step, so the next
    forward pass sees every new parameter.

    The staging buffers are pinned with torch (pin_memory=True), 8 bytes a parameter: the
    lease's rows themselves are not registered, so a tierd eviction can never leave the device
    reading stale pages. A pinned buffer is rewritten only after the side stream has passed its
    previous copy to the device has completed (an event per buffer)."""

    def __init__(self, params):
        self.stream = torch.cuda.Stream()
        self.grad_host = {}
        self.param_host = {}
        self.param_done = {}  # per staging buffer: its last copy to the device
        self.params = params

    def _pinned(self, table, i, n):
        buf = table.get(i)
        if buf is None or buf.numel() != n:
            buf = table[i] = torch.empty(n, dtype=torch.float32, pin_memory=True)
        return buf

    def gradients_to_host(self, params):
        out = []
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for i, p in enumerate(params):
                if p.grad is None:
                    out.append(None)
                elif not p.is_cuda:
                    out.append(_flat_f32(p.grad).contiguous())
                else:
                    host = self._pinned(self.grad_host, i, p.numel())
                    host.copy_(_flat_f32(p.grad), non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(self.stream)
                    out.append(_GpuGrad(host, done))
        return out

    def parameter_to_device(self, i, p, master_row):
        host = self._pinned(self.param_host, i, p.numel())
        if i in self.param_done:
            self.param_done[i].synchronize()  # the buffer's previous copy has left it
        host.numpy()[:] = master_row
        with torch.cuda.stream(self.stream):
            p.copy_(host.view_as(p), non_blocking=True)
            done = self.param_done[i] = torch.cuda.Event()
            done.record(self.stream)

    def finish_step(self):
        torch.cuda.current_stream().wait_stream(self.stream)


class OffloadAdamW(torch.optim.Optimizer):
    """AdamW whose fp32 master parameters and moments live in a tierd pool.

    Args:
        params: parameters or parameter groups, as for torch.optim.AdamW.
        pool: the tierd pool of this job (created when missing).
        socket: tierd's socket (default $TIERD_SOCKET, else /run/tierd/tierd.sock).
        lr, betas, eps, weight_decay: as torch.optim.AdamW (per group where groups set them).
        resume: continue from the last step committed in `pool` (its parameters are copied
            into the model); with nothing committed there yet, start fresh with a warning.
        ram_quota, nvme_quota: the pool's quotas in bytes when it is created (None: tierd's
            defaults).
        process_group: the torch.distributed group to shard over (default: the world when
            torch.distributed is initialized; one process otherwise).
        params_in_pool: host float32 parameters of one process (no sharding, no GPU) become
            views of their master rows in the pool (see the module's text); False keeps them
            in process memory.

    Attributes:
        resumed_step: the number of steps already taken when this optimizer was built (0 for
            a fresh start); the training loop continues from there.
        committed_step: the number of steps committed so far.
    """

    def __init__(self, params: Iterable[Any], *, pool: str, socket: Optional[str] = None, lr: float = 1e-3,
                 betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 resume: bool = False, ram_quota: Optional[int] = None, nvme_quota: Optional[int] = None,
                 process_group=None, params_in_pool: bool = True):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError("lr, eps and weight_decay must be >= 0")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._params = [p for g in self.param_groups for p in g["params"]]
        self._dparams = self._params  # as given; under FSDP2 DTensors, and _params their local shards
        self._fsdp = _fsdp.local_views(self._params) is not None
        if self._fsdp:
            self._params = _fsdp.local_views(self._dparams)
        self._group_of = [gi for gi, g in enumerate(self.param_groups) for _ in g["params"]]
        for i, p in enumerate(self._params):
            if not p.is_floating_point():
                raise TypeError(f"parameter {i} has dtype {p.dtype}; AdamW needs floating point")
        self._gpu = _GpuPath(self._params) if any(p.is_cuda for p in self._params) else None
        dist = torch.distributed
        self._pg = process_group
        ranks = dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1
        sharded = self._zero = ranks and not self._fsdp  # ZeRO-2: this optimizer partitions
        self._world = dist.get_world_size(process_group) if ranks else 1
        self._rank = dist.get_rank(process_group) if ranks else 0
        self._pool = pool
        self._client = tierd.connect(socket, name="OffloadAdamW")
        self._client.create_pool(pool, ram_quota=ram_quota or 0, nvme_quota=nvme_quota or 0, exist_ok=True)

        layout = [(self._group_of[i], tuple(p.shape)) for i, p in enumerate(self._params)]
        if sharded:
            self._units = [self._shard_unit()]
            suffix = f".r{self._rank}of{self._world}"
            layout.append(("shard", self._rank, self._world))
        else:  # a unit per parameter (under FSDP2: per local shard, named with the rank)
            prefix = f"fsdp.r{self._rank}of{self._world}." if self._world > 1 else ""
            self._units = [self._unit(f"{prefix}g{self._group_of[i]}.p{self._index_in_group(i)}", p.numel(),
                                      [_Segment(i, 0, 0, p.numel())]) for i, p in enumerate(self._params)]
            suffix = f".r{self._rank}of{self._world}" if self._world > 1 else ""
            if self._fsdp:
                layout.append(("fsdp", self._rank, self._world))
        digest = hashlib.blake2b(repr(layout).encode(), digest_size=8).digest()
        self._layout = int.from_bytes(digest, "little") & _MASK63
        self._commit = self._client.create_tensor(pool, "commit" + suffix, shape=(2, _SLOT_WORDS), dtype="int64",
                                                  exist_ok=True)

        # Host fp32 parameters of one process: their storage is the committed buffer's master
        # row (zero-copy, under the read leases in self._held). Set before any state is read.
        self._resident = params_in_pool and not sharded and not self._fsdp and self._gpu is None and all(
            p.dtype == torch.float32 and p.is_contiguous() and not p.is_cuda for p in self._params)
        self._held: list = []  # the read leases the parameters' storage lives in (resident mode)
        self._stale: list = []  # (unit, lease) of a buffer left behind whose release waits for a view
        self._bound: list = []  # per unit, the address its parameter was bound to
        committed = self._agreed(self._read_commit()) if resume else None
        if committed is not None:
            self._step, self._buffer, self._slot = committed
            self._load_params()
        else:
            if resume:
                warnings.warn(f"OffloadAdamW: pool '{pool}' holds no committed step of this model; "
                              "starting fresh", RuntimeWarning, stacklevel=2)
            self._init_state()
        self.resumed_step = self._step
        for p in self._dparams:
            self.state[p]["step"] = self._step

    # --- layout ------------------------------------------------------------------------------

    def _index_in_group(self, i: int) -> int:
        return i - sum(len(g["params"]) for g in self.param_groups[:self._group_of[i]])

    def _unit(self, name: str, n: int, segments: List[_Segment]) -> _Unit:
        tensors = []
        for b in (0, 1):
            try:
                t = self._client.create_tensor(self._pool, f"{name}.{b}", shape=(3, n), dtype="float32",
                                               exist_ok=True)
            except tierd.AlreadyExists:  # it exists with another size
                t = self._client.open_tensor(self._pool, f"{name}.{b}")
            if t.size != 3 * 4 * n:
                raise ValueError(f"pool '{self._pool}' holds tensor {name}.{b} of {t.size} bytes where "
                                 f"{3 * 4 * n} are needed: a different model; use another pool")
            tensors.append(t)
        return _Unit(tensors, n, segments)

    def _shard_unit(self) -> _Unit:
        """This rank's slice [rank * s, (rank + 1) * s) of the flat partition of all
        parameters, s = ceil(total / world); the last rank's slice may end in padding."""
        total = sum(p.numel() for p in self._params)
        self._shard = -(-total // self._world)
        lo, hi = self._rank * self._shard, min(total, (self._rank + 1) * self._shard)
        segments, start = [], 0
        for i, p in enumerate(self._params):
            a, b = max(lo, start), min(hi, start + p.numel())
            if a < b:
                segments.append(_Segment(i, a - start, a - lo, b - a))
            start += p.numel()
        return self._unit(f"zero.r{self._rank}of{self._world}", self._shard, segments)

    # --- leases ------------------------------------------------------------------------------

    def _leased(self, tensor, mode: str, fn, other=None, other_mode: str = "r"):
        """fn(rows) on a lease of `tensor` (rows: its numpy view), or fn(rows, other_rows) with a
        second lease. The views exist only inside fn: the binding releases a lease only once
        no view of it is left."""
        with self._client.lease(tensor, mode) as lease:
            if other is None:
                return fn(lease.numpy())
            with self._client.lease(other, other_mode) as second:
                return fn(lease.numpy(), second.numpy())

    # --- the commit record -------------------------------------------------------------------

    def _read_commit(self) -> dict:
        """{step: (buffer, slot)} of this rank's valid slots."""
        words = self._leased(self._commit, "r", lambda rows: rows.copy())
        valid = {}
        for slot in (0, 1):
            step, check, layout, buffer = (int(x) for x in words[slot])
            if step >= 0 and buffer in (0, 1) and layout == self._layout and \
                    check == _check_word(step, layout, buffer):
                valid[step] = (buffer, slot)
        return valid

    def _agreed(self, valid: dict):
        """(step, buffer, slot) to resume from: this rank's newest valid step, or with several
        ranks the newest step that every rank holds; None when there is none."""
        step = max(valid, default=-1)
        if self._world > 1:
            dist = torch.distributed
            t = torch.tensor([step], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._pg)
            step = int(t.item())
            ok = torch.tensor([1 if step in valid or step < 0 else 0], dtype=torch.int64)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._pg)
            if not ok.item():
                raise RuntimeError(f"OffloadAdamW: the ranks of pool '{self._pool}' hold no common committed "
                                   f"step (step {step} is missing on some rank); cannot resume consistently")
        if step < 0:
            return None
        return (step, *valid[step])

    def _write_commit(self, step: int, buffer: int) -> None:
        """Makes (step, buffer) the committed state by writing the slot not holding it now."""
        slot = 1 - self._slot

        def write(words):
            words[slot] = (step, _check_word(step, self._layout, buffer), self._layout, buffer)
        self._leased(self._commit, "w", write)
        self._step, self._buffer, self._slot = step, buffer, slot

    # --- state in the tier ---------------------------------------------------------------------

    def _flat(self, p: torch.Tensor) -> torch.Tensor:
        return _flat_f32(p, "cpu")

    @torch.no_grad()
    def _init_state(self) -> None:
        """Buffer 0 := (parameters, zeros, zeros), committed as step 0."""
        self._leased(self._commit, "o", lambda words: words.fill(0))  # both slots invalid
        for u in self._units:
            def fill(rows, u=u):
                rows.fill(0)
                for s in u.segments:
                    rows[0][s.unit_off:s.unit_off + s.length] = \
                        self._flat(self._params[s.param])[s.param_off:s.param_off + s.length].numpy()
            self._leased(u.tensors[0], "o", fill)
        self._step, self._buffer, self._slot = 0, 0, 1  # so that this commit writes slot 0
        self._write_commit(0, 0)
        if self._resident:
            self._bind(0)

    def _masters(self, buffer: int) -> List[torch.Tensor]:
        """Copies of this rank's master rows of `buffer`, one per unit."""
        return [torch.from_numpy(self._leased(u.tensors[buffer], "r", lambda rows: rows[0].copy()))
                for u in self._units]

    @torch.no_grad()
    def _set_params(self, masters: List[torch.Tensor]) -> None:
        """Writes the master copies (one per unit; with several ranks, this rank's slice) into
        every parameter, all-gathering the slices of the other ranks."""
        if not self._zero:
            for u, m in zip(self._units, masters):
                for s in u.segments:
                    p = self._params[s.param]
                    p.copy_(m[s.unit_off:s.unit_off + s.length].view_as(p))
            return
        dev = self._collective_device()
        gathered = [torch.empty(self._shard, dtype=torch.float32, device=dev) for _ in range(self._world)]
        torch.distributed.all_gather(gathered, masters[0].to(dev), group=self._pg)
        flat, start = torch.cat(gathered), 0
        for p in self._params:
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()

    def _load_params(self) -> None:
        if self._resident:
            self._bind(self._buffer)
        else:
            self._set_params(self._masters(self._buffer))

    # --- parameters that live in the pool (resident mode) --------------------------------------

    def _bind(self, buffer: int) -> None:
        """Every parameter's storage becomes the master row of `buffer`, which holds the
        committed state: zero-copy views under read leases held until the next _bind. The
        leases held before are then released (or kept in self._stale while a view of them
        lives on outside this optimizer)."""
        leases = self._client.lease_batch([u.tensors[buffer] for u in self._units], "r")
        for u, lease in zip(self._units, leases):
            p = self._params[u.segments[0].param]
            p.data = torch.from_dlpack(lease)[0].view_as(p)
        self._bound = [self._params[u.segments[0].param].data_ptr() for u in self._units]
        old, self._held = self._held, leases
        self._stale += [(ui, lease) for ui, lease in enumerate(old)]
        self._release_stale(None)

    def _release_stale(self, step: Optional[int]) -> None:
        """Releases the leases of a buffer the parameters no longer live in. One still viewed
        (a tensor of a parameter's old storage kept alive) stays in self._stale; before `step`
        overwrites that buffer, it is an error that names the parameter."""
        left = []
        for ui, lease in self._stale:
            try:
                lease.release()
            except BufferError:
                left.append((ui, lease))
        self._stale = left
        if left and step is not None:
            i = self._units[left[0][0]].segments[0].param
            raise RuntimeError(
                f"OffloadAdamW: parameter {i} (and {len(left) - 1} more) of step {step - 1} is still viewed "
                "outside the model (a state_dict or a parameter tensor kept across step()); step "
                f"{step} must overwrite that storage. Copy what you keep (tensor.clone(), "
                "copy.deepcopy(model.state_dict())) or build the optimizer with params_in_pool=False")

    # --- the step ------------------------------------------------------------------------------

    def _collective_device(self) -> torch.device:
        """Where the sharded path's flat buffers live: on the GPU for NCCL, else on the host."""
        nccl = torch.distributed.get_backend(self._pg) == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def _gradients(self) -> List[Optional[torch.Tensor]]:
        """Per unit, the float32 gradient of its elements on the host (None for a parameter
        without one), or a _GpuGrad whose copy is still in flight on the side stream. With
        several ranks: the rank's slice of the averaged flat gradient."""
        for p in self._params:
            if p.grad is not None and p.grad.is_sparse:
                raise RuntimeError("OffloadAdamW does not support sparse gradients")
        if not self._zero:
            if self._gpu is not None:
                return self._gpu.gradients_to_host(self._params)
            return [None if p.grad is None else _host_grad(p) for p in self._params]
        dist = torch.distributed
        dev = self._collective_device()
        flat = torch.zeros(self._shard * self._world, dtype=torch.float32, device=dev)
        start = 0
        for p in self._params:
            if p.grad is not None:
                flat[start:start + p.numel()] = _flat_f32(p.grad, dev)
            start += p.numel()
        try:
            mine = torch.empty(self._shard, dtype=torch.float32, device=dev)
            dist.reduce_scatter(mine, list(flat.chunk(self._world)), group=self._pg)
        except RuntimeError:  # the backend has no reduce-scatter (gloo): all-reduce, keep the slice
            dist.all_reduce(flat, group=self._pg)
            mine = flat[self._rank * self._shard:(self._rank + 1) * self._shard].clone()
        return [(mine / self._world).cpu()]

    def _hyper(self, param: int, t: int) -> dict:
        group = self.param_groups[self._group_of[param]]
        return dict(lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1], eps=group["eps"],
                    weight_decay=group["weight_decay"], step=t)

    def _update_in_one_pass(self, u: _Unit, g, a, b, t: int) -> bool:
        """One process, a host parameter: the update reads rows `a` and the gradient once and
        writes rows `b` and the model's parameter in the same pass (fp32: the new master;
        bf16: it rounded, the gradient read as bf16), so the step moves what an in-place
        optimizer's does plus the parameter's copy. False where that does not apply (a GPU
        parameter, a shard, another dtype): the caller updates and copies."""
        if self._zero or isinstance(g, _GpuGrad):
            return False
        i = u.segments[0].param
        p = self._params[i]
        if p.is_cuda or not p.is_contiguous() or p.dtype not in (torch.float32, torch.bfloat16):
            return False
        hyper = self._hyper(i, t)
        if p.dtype == torch.float32 and g.dtype == torch.float32:
            tierd.adamw_step(a[0], a[1], a[2], g.numpy(), b[0], b[1], b[2], p_copy=p.detach().view(-1).numpy(),
                             **hyper)
            return True
        if p.dtype == torch.bfloat16 and g.dtype == torch.bfloat16:
            tierd.adamw_step_bf16(a[0], a[1], a[2], g.view(torch.int16).numpy(), b[0], b[1], b[2],
                                  p.detach().view(-1).view(torch.int16).numpy(), **hyper)
            return True
        return False

    def _batched(self, grads) -> bool:
        """One process, every parameter with a gradient a contiguous host tensor, float32 with a
        float32 gradient or bf16 with a bf16 one: the whole update is one tierd.adamw_step_many
        call. With FSDP2 each unit is one parameter's local shard, so that holds there too."""
        if self._zero:
            return False
        for u, g in zip(self._units, grads):
            p = self._params[u.segments[0].param]
            if g is not None and (isinstance(g, _GpuGrad) or p.is_cuda or not p.is_contiguous() or
                                  p.dtype not in (torch.float32, torch.bfloat16) or g.dtype != p.dtype):
                return False
        return True

    def _update_batched(self, outs, ins, grads, t: int) -> None:
        """Rows `ins` (committed) and the gradients into rows `outs` and the parameters, in one
        call. The lease views live only in this frame, so the caller can release the leases."""
        jobs = []
        for u, g, out, inp in zip(self._units, grads, outs, ins):
            b, a = out.numpy(), inp.numpy()
            if g is None:  # no gradient: the state carries over unchanged
                b[:] = a
                continue
            i = u.segments[0].param
            h = self._hyper(i, t)
            p = self._params[i].detach().view(-1)
            if p.dtype == torch.bfloat16:  # bf16 bits: the kernel reads g and writes p as int16
                g, p = g.view(torch.int16), p.view(torch.int16)
            copy = None if self._resident else p.numpy()  # resident: b[0] becomes the parameter
            jobs.append((a[0], a[1], a[2], g.numpy(), b[0], b[1], b[2], copy, h["lr"], h["beta1"],
                         h["beta2"], h["eps"], h["weight_decay"]))
        tierd.adamw_step_many(jobs, step=t)

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter, then the commit. Returns closure()'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t = self._step + 1
        src, dst = self._buffer, 1 - self._buffer
        if self._fsdp:
            self._params = _fsdp.local_views(self._dparams)
            _fsdp.attach_grads(self._dparams, self._params)
        grads = self._gradients()
        if self._resident:
            self._release_stale(t)
        # Every unit's two leases in two round trips (not two per unit); each pair is released
        # right after its unit's update. Resident: the parameters' read leases are the inputs.
        outs = self._client.lease_batch([u.tensors[dst] for u in self._units], "o")
        ins = self._held if self._resident else self._client.lease_batch([u.tensors[src] for u in self._units], "r")
        masters = []
        batched = self._batched(grads)
        # Resident parameters are fp32 host tensors with fp32 host gradients: always one pass.
        assert batched or not self._resident, "resident parameters take the batched update"
        if batched:  # every host parameter in one pass of the threads
            with contextlib.ExitStack() as held:
                for lease in (*outs, *([] if self._resident else ins)):
                    held.enter_context(lease)
                self._update_batched(outs, ins, grads, t)
                for ui in range(len(self._units)):  # dying with every lease still held
                    _kill_point(self._rank, t, f"{ui}:leased")
            for ui in range(len(self._units)):
                _kill_point(self._rank, t, ui)
            outs = ins = []  # nothing left for the loop below
        for ui, (u, g) in enumerate(zip(self._units, grads) if outs else ()):
            def update(b, a, u=u, g=g):
                covered = u.covered
                if g is None:  # no gradient: the state carries over unchanged
                    b[:] = a
                else:
                    b[:, covered:] = a[:, covered:]  # the last rank's padding
                    if self._update_in_one_pass(u, g, a, b, t):
                        return None  # the kernel wrote the model's parameter too
                    gn = g.wait() if isinstance(g, _GpuGrad) else g.numpy()
                    for s in u.segments:
                        group = self.param_groups[self._group_of[s.param]]
                        lo, hi = s.unit_off, s.unit_off + s.length
                        tierd.adamw_step(a[0][lo:hi], a[1][lo:hi], a[2][lo:hi], gn[lo:hi],
                                         b[0][lo:hi], b[1][lo:hi], b[2][lo:hi], **self._hyper(s.param, t))
                _kill_point(self._rank, t, f"{ui}:leased")
                if not self._zero:  # straight from the lease into the parameter: no extra copy
                    p = self._params[u.segments[0].param]
                    if self._gpu is not None and p.is_cuda:
                        self._gpu.parameter_to_device(u.segments[0].param, p, b[0])
                    else:
                        p.copy_(torch.from_numpy(b[0]).view_as(p))
                    return None
                return torch.from_numpy(b[0].copy())  # this rank's slice, for the all-gather
            with outs[ui] as out, ins[ui] as inp:
                masters.append(update(out.numpy(), inp.numpy()))
            _kill_point(self._rank, t, ui)
        if self._zero:
            self._set_params(masters)
        if self._gpu is not None:
            self._gpu.finish_step()
        if self._fsdp:
            _fsdp.detach_grads(self._params)
        for p in self._dparams:
            self.state[p]["step"] = t
        _kill_point(self._rank, t, "commit")
        self._write_commit(t, dst)
        if self._resident:
            self._bind(dst)
        return loss

    @property
    def committed_step(self) -> int:
        return self._step

    # --- state_dict, for users who also save files ---------------------------------------------

    def _require_one_process(self, what: str) -> None:
        if self._world > 1:
            raise RuntimeError(f"OffloadAdamW.{what}() works in one process only; a sharded job's state "
                               "is its ranks' slices in tierd (resume=True continues it)")

    def state_dict(self) -> dict:
        """torch.optim.AdamW's layout: per parameter index step, exp_avg, exp_avg_sq."""
        self._require_one_process("state_dict")
        state = {}
        for i, (u, p) in enumerate(zip(self._units, self._params)):
            rows = self._leased(u.tensors[self._buffer], "r", lambda r: r[1:].copy())
            state[i] = {"step": torch.tensor(float(self._step)),
                        "exp_avg": torch.from_numpy(rows[0]).view_as(p),
                        "exp_avg_sq": torch.from_numpy(rows[1]).view_as(p)}
        groups, i = [], 0
        for group in self.param_groups:
            groups.append({k: v for k, v in group.items() if k != "params"} |
                          {"params": list(range(i, i + len(group["params"])))})
            i += len(group["params"])
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Takes hyperparameters and moments from `state_dict` (as saved by state_dict() or by
        torch.optim.AdamW); the master copies are the model's current parameters. Committed at
        the saved step."""
        self._require_one_process("load_state_dict")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or \
                any(len(s["params"]) != len(m["params"]) for s, m in zip(groups, self.param_groups)):
            raise ValueError("state_dict's param groups differ from this optimizer's")
        for mine, saved in zip(self.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    mine[k] = tuple(v) if k == "betas" else v
        keys = [k for g in groups for k in g["params"]]
        dst, step = 1 - self._buffer, 0
        for u, p, key in zip(self._units, self._params, keys):
            st = state_dict["state"].get(key, {})

            def fill(rows, p=p, st=st):
                rows[0] = self._flat(p).numpy()
                for row, name in ((1, "exp_avg"), (2, "exp_avg_sq")):
                    rows[row] = self._flat(st[name]).numpy() if name in st else 0
            self._leased(u.tensors[dst], "o", fill)
            if "step" in st:
                step = max(step, int(float(st["step"])))
        self._write_commit(step, dst)
        if self._resident:
            self._bind(dst)
        for p in self._dparams:
            self.state[p]["step"] = step

    def close(self) -> None:
        """Ends the connection to tierd (the state stays in the pool). Parameters that lived in
        the pool get copies of their values in process memory first."""
        if self._resident:
            with torch.no_grad():
                for u, ptr in zip(self._units, self._bound):
                    p = self._params[u.segments[0].param]
                    if p.data_ptr() == ptr:  # still ours (not re-pointed by the caller since)
                        p.data = p.data.clone()
            self._stale += list(enumerate(self._held))
            self._held = []
            self._release_stale(None)
            self._resident = False
        self._client.close()
