"""tierd.torch.checkpoint: torch.distributed.checkpoint (DCP) storage in node memory (tierd).

    import torch.distributed.checkpoint as dcp
    from tierd.torch.checkpoint import TierdWriter, TierdReader
    dcp.save(state_dict, storage_writer=TierdWriter("job1"), checkpoint_id="step100")
    dcp.load(state_dict, storage_reader=TierdReader("job1"), checkpoint_id="step100")
    dcp.async_save(state_dict, storage_writer=TierdWriter("job1"), checkpoint_id="step200",
                   process_group=checkpoint_group)      # stages straight into tierd memory

`checkpoint_id` names the checkpoint inside the pool. Each rank writes its items into one
tensor of its node's tierd; the coordinator stores DCP's metadata beside them in a commit
record, last, so a checkpoint is visible only once complete (the layout: tierd/torch/_store.py).
A save killed at any instant leaves the previous checkpoints loadable and its own tensors
unreferenced; the next save (or reclaim()) deletes them. Saving an existing checkpoint_id again
replaces it the same way: the old one stays loadable until the new one is committed.

Loading reshards as DCP does (saved by N ranks, loaded by M), provided every rank's tierd holds
what it reads: ranks on one node share a tierd; across nodes, load where the data was written.
Each item carries 64-bit checksums (tierd/torch/_store.py) that are verified on load: a mismatch raises
tierd.Corruption naming the item. Pools belong to one uid: tierd refuses other uids.

Needs PyTorch >= 2.4 (DCP's storage interfaces in their present form).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import signal
import time
import uuid
import warnings
from typing import Any, Dict, List, Optional

import numpy
import torch

if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 4):
    raise ImportError(f"tierd.torch.checkpoint needs PyTorch >= 2.4 (torch.distributed.checkpoint); "
                      f"this is PyTorch {torch.__version__}")

import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint import Metadata, StorageReader, StorageWriter  # noqa: E402
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,  # noqa: E402
                                                  SavePlanner, WriteItemType)
from torch.distributed.checkpoint.staging import AsyncStager  # noqa: E402
from torch.distributed.checkpoint.storage import WriteResult  # noqa: E402
from torch.futures import Future  # noqa: E402

import tierd  # noqa: E402
from tierd.torch import _store  # noqa: E402
from tierd.torch._store import CheckpointInfo, Store, Stored  # noqa: E402

__all__ = ["TierdWriter", "TierdReader", "CheckpointInfo", "CheckpointUnreadable", "list_checkpoints", "delete_checkpoint",
           "keep_newest", "reclaim"]

_ALIGN = 64
# A fault-injection point for the crash tests: TIERD_DCP_KILL_AT=data kills the process once its
# rank's data is written (before the commit record); =meta halfway through writing the record.
_KILL_AT = os.environ.get("TIERD_DCP_KILL_AT", "")


def _kill_point(where: str) -> None:
    if _KILL_AT == where:
        os.kill(os.getpid(), signal.SIGKILL)


def _new_id() -> str:
    return uuid.uuid4().hex[:16]


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _narrow(t: torch.Tensor, offsets, lengths) -> torch.Tensor:
    """The region [offsets, offsets + lengths) of `t`, dimension by dimension (a view)."""
    for dim, (off, n) in enumerate(zip(offsets, lengths)):
        if off != 0 or n != t.size(dim):
            t = t.narrow(dim, off, n)
    return t


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[...] = src. Between contiguous host tensors of one dtype, numpy's copy (memcpy
    without the GIL, about twice torch's copy_ on this path); otherwise copy_ (a GPU source's
    copy is asynchronous: stage() synchronizes)."""
    if dst.device.type == "cpu" and src.device.type == "cpu" and dst.dtype == src.dtype and \
            dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous() and dst.numel() and \
            not src.is_conj() and not src.is_neg():
        numpy.copyto(dst.reshape(-1).view(torch.uint8).numpy(), src.detach().reshape(-1).view(torch.uint8).numpy())
    else:
        dst.copy_(src, non_blocking=src.is_cuda)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes_view(lease) -> torch.Tensor:
    """The lease's bytes as a uint8 torch tensor (zero copy; read leases are not writable,
    which torch.frombuffer warns about: this module never writes through those)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.frombuffer(lease, dtype=torch.uint8) if lease.nbytes else torch.empty(0, dtype=torch.uint8)


def _rank_of(kwargs: dict) -> int:
    rank = kwargs.get("rank")
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return rank


class TierdWriter(StorageWriter, AsyncStager):
    """DCP's StorageWriter (and async_save's stager) into tierd pool `pool`.

    Args:
        pool: the job's tierd pool (created when missing).
        socket: tierd's socket (default $TIERD_SOCKET, else /run/tierd/tierd.sock).
        snapshot: after each commit, take a tierd snapshot of the pool so that the checkpoint
            survives a reboot of the node (tierd's snapshot: the pool's RAM written to NVMe).
        keep: after each commit, delete all but the newest `keep` checkpoints of the pool.
        threads: threads that copy and checksum (torch copies and zlib release the GIL).
        ram_quota, nvme_quota: the pool's quotas when this writer creates it.
    """

    _synchronize_after_execute = False  # stage() is complete when it returns

    def __init__(self, pool: str, *, socket: Optional[str] = None, snapshot: bool = False,
                 keep: Optional[int] = None, threads: int = 2, ram_quota: Optional[int] = None,
                 nvme_quota: Optional[int] = None):
        super().__init__()
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.pool, self._socket, self._snapshot, self._keep = pool, socket, snapshot, keep
        self._quotas = (ram_quota, nvme_quota)
        self._threads = max(1, threads)
        self._store: Optional[Store] = None
        self._checkpoint_id: Optional[str] = None
        self._save_id = _new_id()
        self._rank = 0
        self._coordinator = True
        self._locks: Dict[str, Any] = {}  # id -> its lock lease
        self._staged: Optional[dict] = None  # the last stage(): id, tensor name, lease, address, size

    # --- the connection and locks ------------------------------------------------------------

    def _connect(self) -> Store:
        if self._store is None:
            self._store = Store(self.pool, self._socket, "TierdWriter", *self._quotas)
        return self._store

    def _hold(self, ident: str) -> None:
        if ident not in self._locks:
            self._locks[ident] = self._connect().lock(ident, self._rank)

    def _release_locks(self, keep=()) -> None:
        for ident in [i for i in self._locks if i not in keep]:
            try:
                self._locks.pop(ident).release()
            except tierd.Error:
                pass

    def close(self) -> None:
        """Releases the locks and the staging lease, and ends the connection."""
        self._release_locks()
        if self._staged is not None:
            self._staged["lease"].release()
            self._staged = None
        if self._store is not None:
            self._store.close()
            self._store = None

    # --- StorageWriter -------------------------------------------------------------------------

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self._checkpoint_id = str(checkpoint_id)
        self._save_id = _new_id()
        self._connect()  # a refused pool raises PermissionDenied here, to the caller
        staged = self._staged["id"] if self._staged else None
        self._release_locks(keep=(staged,))

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not self._checkpoint_id:
            raise ValueError("TierdWriter needs a checkpoint_id (dcp.save(..., checkpoint_id='name'))")
        self._rank = _rank_of(kwargs)
        self._coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # The save is named by the coordinator's id (prepare_global_plan hands it to every rank),
        # and the coordinator's lock, held from here to the end of finish(), covers all of it.
        if self._coordinator:
            self._hold(self._save_id)
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # Every rank holds its lock now, so what reclaim() deletes belongs to dead saves.
        keep = (self._save_id, self._staged["id"] if self._staged else None)
        self._connect().reclaim(keep_ids=keep)
        return [dataclasses.replace(p, storage_data=(i, self._save_id)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        rank, save_id = plan.storage_data
        store = self._connect()
        blobs = {item.index: planner.resolve_data(item).getvalue()
                 for item in plan.items if item.type == WriteItemType.BYTE_IO}
        # After stage(), the items are views of the staged tensor: they take no room here.
        staged = {}
        if self._staged is not None:
            for item in plan.items:
                if item.type != WriteItemType.BYTE_IO:
                    t = planner.resolve_data(item).detach()
                    if self._staged_at(t) is not None:
                        staged[item.index] = t
        layout, total = {}, 0
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                n = len(blobs[item.index])
            elif item.index in staged:
                continue
            else:
                td = item.tensor_data
                n = td.chunk.sizes.numel() * torch.empty((), dtype=td.properties.dtype).element_size()
            layout[item.index] = (total, n)
            total = _align(total + n)
        data_name = _store.name(save_id, f"data.r{rank}")
        with store.mu:
            info = store.client.create_tensor(self.pool, data_name, size=max(total, 1), exist_ok=False)
            lease = store.client.lease(info.id, "o")
        results = []
        try:
            dst = _bytes_view(lease)
            with concurrent.futures.ThreadPoolExecutor(self._threads) as pool:
                jobs = [pool.submit(self._write_item, item, planner, blobs, staged, dst, layout, data_name)
                        for item in plan.items]
                results = [j.result() for j in jobs]
            del dst
        finally:
            lease.release()
        if self._staged is not None:  # written: the staged bytes are referenced or dropped
            self._staged["lease"].release()
            self._staged = None
        _kill_point("data")
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _write_item(self, item, planner, blobs, staged, dst, layout, data_name) -> WriteResult:
        if item.index in staged:  # async_save staged it into tierd already: nothing to copy
            t = staged[item.index]
            name, soff = self._staged_at(t)
            n = t.numel() * t.element_size()
            src = self._staged["view"][soff:soff + n]
            return WriteResult(item.index, n, Stored(name, soff, n, _dtype_name(t.dtype), tuple(t.shape),
                                                     _store.checksums(src.numpy())))
        off, n = layout[item.index]
        if item.type == WriteItemType.BYTE_IO:
            region = dst[off:off + n]
            region.copy_(torch.frombuffer(bytearray(blobs[item.index]), dtype=torch.uint8) if n else region)
            return WriteResult(item.index, n, Stored(data_name, off, n, None, None, _store.checksums(region.numpy())))
        t = planner.resolve_data(item).detach()
        dtype, shape = _dtype_name(t.dtype), tuple(t.shape)
        region = dst[off:off + n]
        if n:
            _copy(region.view(t.dtype).view(t.shape), t)
        return WriteResult(item.index, n, Stored(data_name, off, n, dtype, shape, _store.checksums(region.numpy())))

    def _staged_at(self, t: torch.Tensor):
        """(staging tensor name, offset) when `t` is a contiguous view of the staged bytes."""
        s = self._staged
        if s is None or t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            return None
        lo = t.data_ptr() - s["address"]
        if 0 <= lo and lo + t.numel() * t.element_size() <= s["size"]:
            return s["name"], lo
        return None

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        storage = {}
        for wr_list in results:
            storage.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage
        store = self._connect()
        payload = dict(checkpoint_id=self._checkpoint_id, save_id=self._save_id, time_ns=time.time_ns(),
                       world=len(results), nbytes=sum(wr.size_in_bytes for r in results for wr in r),
                       metadata=metadata)
        if _KILL_AT == "meta":
            raw = _store.encode_record(payload)
            t = store.client.create_tensor(self.pool, _store.name(self._save_id, "meta"), size=len(raw))
            with store.client.lease(t.id, "o") as lease:
                lease.numpy()[:len(raw) // 2] = memoryview(raw)[:len(raw) // 2]
            _kill_point("meta")
        store.write_record(self._save_id, payload)
        self._release_locks(keep=(self._staged["id"],) if self._staged else ())
        if self._keep is not None:
            keep_newest(self.pool, self._keep, _store_=store)
        if self._snapshot:
            with store.mu:
                store.client.snapshot(self.pool)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, str) and bool(checkpoint_id)

    def storage_meta(self):
        from torch.distributed.checkpoint.metadata import StorageMeta
        return StorageMeta(checkpoint_id=self._checkpoint_id, save_id=self._save_id)

    # --- AsyncStager: async_save copies the state dict into tierd, then returns ----------------

    def stage(self, state_dict: dict) -> dict:
        """A copy of `state_dict` whose tensors (DTensors: their local shards) are views of one
        tierd tensor of this rank, "dcp|<stage id>|stage.r<rank>"; write_data then records
        where they lie instead of copying them again. The copies leave the GPU or the
        parameters' memory before this returns, so training may go on."""
        if self._staged is not None:
            self._staged["lease"].release()
            self._staged = None
        self._rank = _rank_of({})
        leaves: list = []
        _walk(state_dict, leaves)
        total = 0
        spots = []
        for t in leaves:
            local = _local(t)
            spots.append(total)
            total = _align(total + local.numel() * local.element_size())
        ident = _new_id()
        store = self._connect()
        self._hold(ident)
        name = _store.name(ident, f"stage.r{self._rank}")
        with store.mu:
            info = store.client.create_tensor(self.pool, name, size=max(total, 1), exist_ok=False)
            lease = store.client.lease(info.id, "o")
        view = _bytes_view(lease)
        copies, pairs = {}, []
        for t, off in zip(leaves, spots):
            local = _local(t)
            n = local.numel() * local.element_size()
            dst = view[off:off + n].view(local.dtype).view(local.shape) if n else \
                torch.empty(local.shape, dtype=local.dtype)
            pairs.append((dst, local.detach()))
            copies[id(t)] = _like(t, dst)
        with concurrent.futures.ThreadPoolExecutor(self._threads) as pool:  # the copies drop the GIL
            list(pool.map(lambda pair: _copy(*pair), pairs))
        if torch.cuda.is_available() and any(_local(t).is_cuda for t in leaves):
            torch.cuda.synchronize()
        self._staged = dict(id=ident, name=name, lease=lease, view=view, address=view.data_ptr() if total else 0,
                            size=total)
        return _rebuild(state_dict, copies)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: stage() returns once its copies are done."""


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


def _like(t: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    if _is_dtensor(t):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape,
                                  stride=t.stride())
    return local


def _walk(obj, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _walk(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _walk(v, out)


def _rebuild(obj, copies: dict):
    if isinstance(obj, torch.Tensor):
        return copies[id(obj)]
    if isinstance(obj, dict):
        return {k: _rebuild(v, copies) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, copies) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, copies) for v in obj)
    return obj


class CheckpointUnreadable(BaseException):
    """TierdReader.read_metadata's error inside dcp.load (see there); dcp.load reports it in
    its CheckpointException. Outside DCP the tierd error itself is raised."""


class TierdReader(StorageReader):
    """DCP's StorageReader from tierd pool `pool`. With no checkpoint_id (neither here nor
    to dcp.load), the pool's newest checkpoint is loaded."""

    def __init__(self, pool: str, *, socket: Optional[str] = None, checkpoint_id: Optional[str] = None):
        super().__init__()
        self.pool, self._socket = pool, socket
        self._checkpoint_id = checkpoint_id
        self._store: Optional[Store] = None
        self._storage: Dict[Any, Stored] = {}
        self._verified: set = set()
        self._metadata: Optional[Metadata] = None

    def _connect(self) -> Store:
        if self._store is None:
            self._store = Store(self.pool, self._socket, "TierdReader")
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def reset(self, checkpoint_id=None) -> None:
        """Called by dcp.load with its checkpoint_id: the checkpoint is looked up here, so that
        a missing checkpoint or a refused pool raises its tierd error straight to the caller."""
        if checkpoint_id is not None:
            self._checkpoint_id = str(checkpoint_id)
        self._storage, self._verified = {}, set()
        self._metadata = self._find()

    def _find(self) -> Metadata:
        store = self._connect()
        newest = store.newest(store.records())
        if self._checkpoint_id is None:
            if not newest:
                raise tierd.NotFound(f"tierd pool '{self.pool}' holds no checkpoint")
            rec = max(newest.values(), key=lambda r: (r["time_ns"], r["save_id"]))
            self._checkpoint_id = rec["checkpoint_id"]
        else:
            rec = newest.get(self._checkpoint_id)
            if rec is None:
                raise tierd.NotFound(f"tierd pool '{self.pool}' holds no checkpoint '{self._checkpoint_id}' "
                                     f"(it holds: {sorted(newest) or 'none'})")
        return rec["metadata"]

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            try:
                self._metadata = self._find()
            except Exception as e:
                # DCP ignores an Exception from read_metadata (it then looks for per-rank
                # metadata and fails with "metadata is None"); this one carries the cause out.
                raise CheckpointUnreadable(str(e)) from e
        return self._metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._storage = metadata.storage_data
        self._metadata = None  # the next load looks again

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        store = self._connect()
        by_tensor: Dict[str, list] = {}
        for req in plan.items:
            by_tensor.setdefault(self._storage[req.storage_index].tensor, []).append(req)
        for tensor_name, reqs in by_tensor.items():
            with store.mu:
                try:
                    lease = store.client.lease(store.client.open_tensor(self.pool, tensor_name).id, "r")
                except tierd.NotFound:
                    raise tierd.NotFound(f"checkpoint '{self._checkpoint_id}': tensor {tensor_name} is missing "
                                         "from this node's tierd (was it saved on another node?)") from None
            try:
                view = _bytes_view(lease)
                for req in reqs:
                    self._read_item(req, planner, view)
                del view
            finally:
                lease.release()
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_item(self, req, planner: LoadPlanner, view: torch.Tensor) -> None:
        st = self._storage[req.storage_index]
        raw = view[st.offset:st.offset + st.length]
        if req.storage_index not in self._verified:
            got = _store.checksums(raw.numpy())
            if got != st.sums:
                idx = req.storage_index
                raise tierd.Corruption(f"checkpoint '{self._checkpoint_id}': item '{idx.fqn}' (offset "
                                       f"{list(idx.offset) if idx.offset is not None else 'whole'}) fails its "
                                       f"checksum in tensor {st.tensor}")
            self._verified.add(req.storage_index)
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(raw.numpy().tobytes()))
            return
        src = raw.view(getattr(torch, st.dtype)).view(st.shape) if st.length else \
            torch.empty(st.shape, dtype=getattr(torch, st.dtype))
        src = _narrow(src, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != src.size():
            raise ValueError(f"checkpoint item '{req.storage_index.fqn}': stored shape {tuple(src.size())} "
                             f"differs from the target's {tuple(target.size())}")
        _copy(target, src)
        planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, str) and bool(checkpoint_id)


# --- managing a pool's checkpoints --------------------------------------------------------------

def _with_store(pool: str, socket: Optional[str], fn, store: Optional[Store] = None):
    if store is not None:
        return fn(store)
    s = Store(pool, socket, "tierd.torch.checkpoint")
    try:
        return fn(s)
    finally:
        s.close()


def list_checkpoints(pool: str, *, socket: Optional[str] = None) -> List[CheckpointInfo]:
    """The pool's visible checkpoints, oldest first."""
    return _with_store(pool, socket, lambda s: s.infos())


def delete_checkpoint(pool: str, checkpoint_id: str, *, socket: Optional[str] = None) -> bool:
    """Deletes checkpoint `checkpoint_id` (its record, then its data); False when absent."""
    def run(s: Store) -> bool:
        found = s.delete_records(checkpoint_id) > 0
        s.reclaim()
        return found
    return _with_store(pool, socket, run)


def keep_newest(pool: str, n: int, *, socket: Optional[str] = None, _store_: Optional[Store] = None) -> List[str]:
    """Deletes all but the newest `n` checkpoints; returns the deleted checkpoint_ids."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")

    def run(s: Store) -> List[str]:
        infos = s.infos()
        gone = [i.checkpoint_id for i in infos[:max(0, len(infos) - n)]]
        for cid in gone:
            s.delete_records(cid)
        s.reclaim()
        return gone
    return _with_store(pool, socket, run, _store_)


def reclaim(pool: str, *, socket: Optional[str] = None) -> int:
    """Deletes what saves that died left behind; returns the number of tensors deleted."""
    return _with_store(pool, socket, lambda s: s.reclaim())
