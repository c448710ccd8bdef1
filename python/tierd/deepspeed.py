"""tierd.deepspeed: DeepSpeed ZeRO-3 / ZeRO-Infinity offload through tierd, with one line.

    import deepspeed, tierd.deepspeed
    tierd.deepspeed.install("job1")          # before deepspeed.initialize; config unchanged
    engine, *_ = deepspeed.initialize(model=model, config=cfg)   # offload device: nvme

DeepSpeed's NVMe swappers (deepspeed/runtime/swap_tensor/) do every read, write and pinned
allocation through one handle class, `AsyncIOBuilder().load().aio_handle`. install() makes that
class tierd's `AioHandle`: a swap file is a tensor of the pool, named from its path below
`nvme_path` (from its `zero_stage_3/` component on; the whole path otherwise), whose bytes live in
tierd's RAM tier, spill to its NVMe tier by tierd's policy (a plan registered from the swap order
once it repeats step after step), checksummed there and NUMA-placed; the pinned swap buffers
DeepSpeed asks for (`new_cpu_locked_tensor`) are tensors of the same pool held under a write
lease, so all ranks of a node draw them from one pool quota. libaio is then not needed.

Semantics follow DeepSpeed's aio handle (deepspeed/ops/csrc/aio/py_lib/deepspeed_py_io_handle.cpp):
async_* return 0 and the next wait() returns how many operations completed; sync_* and
pread/pwrite(async=False) return the count at once; a write extends the file; a read must lie
within what was written. Unlike DeepSpeed's handle, which returns -1 or asserts, a failed
operation raises: a `SwapError` naming the swap path and the pool, or the tierd error (with the
path and pool added to its message), from the call or from the wait() that collects it.

A swap file exists for the process that wrote it (as DeepSpeed empties its swap folders when it
starts, a new process never reads a previous one's files); the tensors stay in the pool, reused
by the next process that writes the same path. With `checkpoints=True` engine.save_checkpoint
and load_checkpoint store every file in tierd too (TierCheckpointEngine, below), including the
optimizer's swap files, which DeepSpeed copies with shutil.copytree: install() routes those
copies through the pool.
"""
from __future__ import annotations

from typing import List, Optional

from tierd import _ds_checkpoint, _ds_swap
from tierd._ds_checkpoint import TierCheckpointEngine, checkpoint_name  # noqa: F401
from tierd._ds_swap import (LEASE_TIMEOUT_S, AioHandle, SwapError, _Store, store,  # noqa: F401
                            swap_name)

__all__ = ["install", "uninstall", "AioHandle", "TierCheckpointEngine", "SwapError", "store"]


# -- install ------------------------------------------------------------------------------------
_saved: List[tuple] = []  # (object, attribute, original value) to restore by uninstall()


def _patch(obj, attr: str, value) -> None:
    _saved.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, value)


def install(pool: str, *, socket: Optional[str] = None, ram_quota: Optional[int] = None,
            nvme_quota: Optional[int] = None, checkpoints=False) -> None:
    """Makes DeepSpeed's NVMe offload go through tierd's pool `pool` (created with the quotas,
    bytes, when it does not exist). Call once per process, before deepspeed.initialize.

    socket: tierd's socket (default $TIERD_SOCKET, else /run/tierd/tierd.sock); raises
    tierd.Unavailable saying where it looked when no tierd answers there.
    checkpoints: True makes TierCheckpointEngine every engine's checkpoint engine; "snapshot"
    also takes a tierd snapshot of the pool at each checkpoint's commit."""
    current = _ds_swap.current()
    if current is not None:
        if current.pool != pool:
            raise SwapError(f"tierd.deepspeed is already installed with pool {current.pool}")
        return
    if checkpoints not in (False, True, "snapshot"):
        raise ValueError(f"checkpoints must be False, True or 'snapshot', not {checkpoints!r}")
    import deepspeed  # noqa: F401  (the accelerator is chosen on import)
    import deepspeed.ops.op_builder as op_builder
    import deepspeed.runtime.engine as ds_engine
    _ds_swap.set_store(_Store(pool, socket, ram_quota, nvme_quota))
    builder = op_builder.AsyncIOBuilder
    _patch(builder, "load", lambda self, verbose=True: _ds_swap._AioOp)
    _patch(builder, "is_compatible", lambda self, verbose=False: True)
    engine_cls = ds_engine.DeepSpeedEngine
    _patch(engine_cls, "save_checkpoint", _ds_checkpoint._with_copy_mode("save", engine_cls.save_checkpoint))
    _patch(engine_cls, "load_checkpoint", _ds_checkpoint._with_copy_mode("load", engine_cls.load_checkpoint))
    _patch(engine_cls, "step", _ds_checkpoint._with_end_of_step(engine_cls.step))
    if checkpoints:
        snap = checkpoints == "snapshot"
        factory = lambda *a, **k: TierCheckpointEngine(pool, k.get("config_params"), snapshot=snap)  # noqa: E731
        _ds_checkpoint.set_factory(factory)
        _patch(ds_engine, "create_checkpoint_engine", factory)


def uninstall() -> None:
    """Restores DeepSpeed's own handle and checkpoint engine (for engines built afterwards) and
    closes the connection; pinned buffers still in use stay valid until their process exits."""
    while _saved:
        obj, attr, value = _saved.pop()
        setattr(obj, attr, value)
    _ds_checkpoint.set_factory(None)
    current = _ds_swap.current()
    if current is not None:
        current.executor.shutdown(wait=True)
        _ds_swap.set_store(None)
