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

import concurrent.futures as _futures
import io
import os
import shutil
import socket as _socket
import threading
import warnings
from typing import Dict, List, Optional

import torch

import tierd

__all__ = ["install", "uninstall", "AioHandle", "TierCheckpointEngine", "SwapError", "store"]

# torch.frombuffer warns once on a read-only buffer (a read lease); the views made here of read
# leases are only read.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

# Seconds an operation waits for a conflicting lease of the same file (another operation in
# flight on it) before it fails.
LEASE_TIMEOUT_S = 120.0
_PINNED = "pinned"
_CKPT = "ckpt"


class SwapError(RuntimeError):
    """A swap or checkpoint operation DeepSpeed asked for that tierd cannot do as asked."""


def _escape(part: str) -> str:
    """A path as one tensor name component: '/' is not allowed in tensor names."""
    return part.replace("%", "%25").replace("|", "%7C").replace("/", "|")


def _limit(name: str) -> str:
    """Tensor names are at most 255 bytes: a longer one keeps its tail and gains a digest."""
    if len(name.encode()) <= 255:
        return name
    import hashlib
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{digest}~{name.encode()[-200:].decode(errors='ignore')}"


def swap_name(path: str) -> str:
    """The pool tensor of swap file `path`: from its `zero_stage_3` component on, so the same
    job with another nvme_path finds the same tensors; else the whole absolute path."""
    parts = os.path.abspath(os.fspath(path)).split(os.sep)
    if "zero_stage_3" in parts:
        rel = "/".join(parts[len(parts) - 1 - parts[::-1].index("zero_stage_3"):])
        return _limit("swap|" + _escape(rel))
    return _limit("file|" + _escape(os.path.abspath(os.fspath(path))))


def checkpoint_name(path: str) -> str:
    """The pool tensor of checkpoint file `path` (its absolute path)."""
    return _limit(f"{_CKPT}|" + _escape(os.path.abspath(os.fspath(path))))


def _bytes_of(t: torch.Tensor, what: str, path: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise SwapError(f"{what} {path}: the buffer is on {t.device}; tierd's handle moves host "
                        "buffers only (gds is not supported)")
    if not t.is_contiguous():
        raise SwapError(f"{what} {path}: the buffer is not contiguous")
    return t.reshape(-1).view(torch.uint8)


def _reraise(e: Exception, context: str):
    """The tierd error `e` again, its message prefixed with `context`."""
    if isinstance(e, tierd.Error):
        new = type(e)(f"{context}: {e}")
        for attr in ("code", "code_value"):
            if hasattr(e, attr):
                setattr(new, attr, getattr(e, attr))
        new.message = f"{context}: {getattr(e, 'message', e)}"
        raise new from e
    raise e


class _File:
    __slots__ = ("info", "size")

    def __init__(self, info, size: int):
        self.info, self.size = info, size


class _Store:
    """The process's tierd side: one client, one pool, the swap files this process wrote, its
    pinned buffers, the worker threads of asynchronous operations and the swap order (plan)."""

    def __init__(self, pool: str, socket: Optional[str], ram_quota, nvme_quota, workers: int = 4):
        self.pool = pool
        try:
            self.client = tierd.connect(socket, name=f"deepspeed-{os.getpid()}")
        except tierd.Error as e:
            where = socket or os.environ.get("TIERD_SOCKET") or tierd.default_socket_path()
            _reraise(e, f"tierd.deepspeed: no tierd at {where} (pool {pool})")
        self.client.create_pool(pool, ram_quota=int(ram_quota or 0), nvme_quota=int(nvme_quota or 0),
                                exist_ok=True)
        self.lock = threading.Lock()
        self.files: Dict[str, _File] = {}
        self.paths: Dict[str, None] = {}  # the path of every file written (a name keeps less)
        self.pinned: Dict[int, tuple] = {}  # data_ptr -> (lease, info, nbytes, tensor name)
        self.pinned_seq = 0
        self.host = _socket.gethostname().replace("|", "_")
        self.executor = _futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tierd-aio")
        # The swap order: the files DeepSpeed asked for in this step, in its order (names), the
        # tensor ids of the step before and the registered plan.
        self.order: List[str] = []
        self.last_order: List[int] = []
        self.plan: List[int] = []
        self.plan_supported = True
        self._drop_dead_pinned()

    def where(self, path: str, name: str) -> str:
        return f"swap file {path} (tierd pool {self.pool}, tensor {name})"

    # -- files --------------------------------------------------------------------------------
    def _create(self, name: str, size: int, path: str):
        try:
            try:
                info = self.client.open_tensor(self.pool, name)
                if info.size == size:
                    return info
                self.client.delete_tensor(self.pool, name)
            except tierd.NotFound:
                pass
            return self.client.create_tensor(self.pool, name, size=size)
        except tierd.Error as e:
            _reraise(e, f"creating {self.where(path, name)} of {size} bytes")

    def _grow(self, name: str, f: Optional[_File], size: int, path: str) -> _File:
        """The file made `size` bytes long, keeping the bytes it had."""
        old = None
        if f is not None and f.size > 0:
            old = torch.empty(f.size, dtype=torch.uint8)
            self._copy_out(f, name, path, old, 0)
            self.client.delete_tensor(self.pool, name)
        nf = _File(self._create(name, size, path), size)
        if old is not None:
            self._copy_in(nf, name, path, old, 0)
        return nf

    def _lease(self, info, mode: str, path: str, name: str):
        try:
            lease = self.client.lease(info, mode, timeout=LEASE_TIMEOUT_S)
        except tierd.Error as e:
            _reraise(e, f"{'reading' if mode == 'r' else 'writing'} {self.where(path, name)}")
        return lease

    def _copy_in(self, f: _File, name: str, path: str, src: torch.Tensor, offset: int):
        n = src.numel()
        mode = "o" if offset == 0 and n == f.size else "w"
        with self._lease(f.info, mode, path, name) as lease:
            dst = torch.frombuffer(lease, dtype=torch.uint8)
            dst[offset:offset + n].copy_(src)
            del dst

    def _copy_out(self, f: _File, name: str, path: str, dst: torch.Tensor, offset: int):
        n = dst.numel()
        with self._lease(f.info, "r", path, name) as lease:
            src = torch.frombuffer(lease, dtype=torch.uint8)
            dst.copy_(src[offset:offset + n])
            del src

    def write(self, buf: torch.Tensor, path: str, offset: int) -> None:
        src = _bytes_of(buf, "write of", path)
        name = swap_name(path)
        end = offset + src.numel()
        if offset < 0:
            raise SwapError(f"write of {self.where(path, name)} at a negative offset {offset}")
        with self.lock:
            f = self.files.get(name)
            if f is None:
                f = _File(self._create(name, end, path), end)
                self.files[name] = f
            elif end > f.size:
                f = self._grow(name, f, end, path)
                self.files[name] = f
        self._copy_in(f, name, path, src, offset)
        with self.lock:
            self.paths[os.path.abspath(path)] = None

    def read(self, buf: torch.Tensor, path: str, offset: int) -> None:
        dst = _bytes_of(buf, "read of", path)
        name = swap_name(path)
        with self.lock:
            f = self.files.get(name)
        if f is None:
            raise SwapError(f"read of {self.where(path, name)}: no such swap file (this process "
                            "never wrote it)")
        end = offset + dst.numel()
        if offset < 0 or end > f.size:
            raise SwapError(f"read of bytes [{offset}, {end}) of {self.where(path, name)}: beyond "
                            f"the {f.size} bytes written")
        self._copy_out(f, name, path, dst, offset)

    def files_below(self, directory: str) -> List[str]:
        """The paths of the swap files this process wrote below `directory`."""
        prefix = os.path.abspath(directory) + os.sep
        return sorted(p for p in self.paths if p.startswith(prefix))

    def read_all(self, path: str) -> torch.Tensor:
        name = swap_name(path)
        with self.lock:
            f = self.files.get(name)
        if f is None:
            raise SwapError(f"read of {self.where(path, name)}: no such swap file")
        out = torch.empty(f.size, dtype=torch.uint8)
        self._copy_out(f, name, path, out, 0)
        return out

    # -- pinned buffers -----------------------------------------------------------------------
    def _drop_dead_pinned(self) -> None:
        """Pinned buffers of this host's processes that are gone (killed) are deleted."""
        try:
            tensors = self.client.list_tensors(self.pool)
        except tierd.Error:
            return
        for t in tensors:
            parts = t.name.split("|")
            if len(parts) != 4 or parts[0] != _PINNED or parts[1] != self.host:
                continue
            try:
                os.kill(int(parts[2]), 0)
                continue
            except ProcessLookupError:
                pass
            except (PermissionError, ValueError):
                continue
            try:
                self.client.delete_tensor(self.pool, t.name)
            except tierd.Error:
                pass

    def new_pinned(self, num_elem: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = int(num_elem) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(0, dtype=dtype)
        with self.lock:
            self.pinned_seq += 1
            name = f"{_PINNED}|{self.host}|{os.getpid()}|{self.pinned_seq}"
        try:
            info = self.client.create_tensor(self.pool, name, size=nbytes)
            lease = self.client.lease(info, "o", timeout=LEASE_TIMEOUT_S)
        except tierd.Error as e:
            _reraise(e, f"pinned swap buffer of {nbytes} bytes (tierd pool {self.pool}, tensor {name})")
        t = torch.frombuffer(lease, dtype=dtype, count=int(num_elem))
        with self.lock:
            self.pinned[t.data_ptr()] = (lease, info, nbytes, name)
        return t

    def free_pinned(self, t: torch.Tensor) -> bool:
        with self.lock:
            entry = self.pinned.pop(t.data_ptr(), None)
        if entry is None:
            return False
        lease, _info, _nbytes, name = entry
        try:
            lease.release()
            self.client.delete_tensor(self.pool, name)
        except (tierd.Error, BufferError):
            pass  # the pool keeps it until a later install sees this process gone
        return True

    def is_pinned(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu":
            return False
        ptr = t.data_ptr()
        with self.lock:
            for base, (_l, _i, nbytes, _n) in self.pinned.items():
                if base <= ptr < base + nbytes:
                    return True
        return bool(t.is_pinned())

    # -- plan ---------------------------------------------------------------------------------
    def end_of_step(self) -> None:
        """Called after each optimizer step: once two steps leased the same tensors in the same
        order, that order is registered with tierd as this process's plan (Belady eviction and
        prefetch on it when the daemon has an NVMe tier)."""
        names, self.order = self.order, []
        with self.lock:
            order = [self.files[n].info.id for n in names if n in self.files]
        if order and order == self.last_order and order != self.plan and self.plan_supported:
            try:
                self.client.set_plan(self.pool, order)
                self.plan = order
            except tierd.Unsupported:
                self.plan_supported = False  # no NVMe tier: nothing to plan
            except tierd.Error as e:
                warnings.warn(f"tierd.deepspeed: set_plan on pool {self.pool} failed: {e}")
                self.plan_supported = False
        self.last_order = order


_store: Optional[_Store] = None


def store() -> _Store:
    """The process's tierd side, made by install()."""
    if _store is None:
        raise SwapError("tierd.deepspeed.install(pool) has not been called in this process")
    return _store


class AioHandle:
    """DeepSpeed's aio_handle over tierd (the constructor takes DeepSpeed's arguments; they are
    reported back by the getters and otherwise unused: tierd does the I/O)."""

    def __init__(self, block_size: int = 1024 * 1024, queue_depth: int = 128, single_submit: bool = False,
                 overlap_events: bool = False, intra_op_parallelism: int = 1):
        self._store = store()
        self._args = (int(block_size), int(queue_depth), bool(single_submit), bool(overlap_events),
                      int(intra_op_parallelism))
        self._pending: List[_futures.Future] = []
        self._lock = threading.Lock()

    def get_block_size(self): return self._args[0]
    def get_queue_depth(self): return self._args[1]
    def get_single_submit(self): return self._args[2]
    def get_overlap_events(self): return self._args[3]
    def get_intra_op_parallelism(self): return self._args[4]

    def get_alignment(self) -> int:
        """DeepSpeed's value (O_DIRECT alignment 512 × intra_op_parallelism): its swappers size
        buffers by it, and the same sizes keep the swap layout the same as with libaio."""
        return self._args[4] * 512

    # -- I/O --------------------------------------------------------------------------------
    def _submit(self, fn, buffer, filename, offset, is_async: bool) -> int:
        path = os.fspath(filename)
        if isinstance(path, bytes):
            path = path.decode()
        self._store.order.append(swap_name(path))  # in DeepSpeed's order, not the workers'
        if is_async:
            fut = self._store.executor.submit(fn, buffer, path, int(offset))
            with self._lock:
                self._pending.append(fut)
            return 0
        fn(buffer, path, int(offset))
        return 1

    def async_pwrite(self, buffer, filename, file_offset: int = 0) -> int:
        if isinstance(filename, int):
            raise SwapError("tierd's aio handle writes to paths, not file descriptors "
                            "(DeepSpeed's fast checkpoint writer: use TierCheckpointEngine)")
        return self._submit(self._store.write, buffer, filename, file_offset, True)

    def async_pread(self, buffer, filename, file_offset: int = 0) -> int:
        return self._submit(self._store.read, buffer, filename, file_offset, True)

    def sync_pwrite(self, buffer, filename, file_offset: int = 0) -> int:
        return self._submit(self._store.write, buffer, filename, file_offset, False)

    def sync_pread(self, buffer, filename, file_offset: int = 0) -> int:
        return self._submit(self._store.read, buffer, filename, file_offset, False)

    def pwrite(self, buffer, filename, validate=False, async_op=False, file_offset: int = 0, **kw) -> int:
        return self._submit(self._store.write, buffer, filename, file_offset, bool(kw.get("async", async_op)))

    def pread(self, buffer, filename, validate=False, async_op=False, file_offset: int = 0, **kw) -> int:
        return self._submit(self._store.read, buffer, filename, file_offset, bool(kw.get("async", async_op)))

    def write(self, buffer, filename, validate=False, file_offset: int = 0) -> int:
        return self.sync_pwrite(buffer, filename, file_offset)

    def read(self, buffer, filename, validate=False, file_offset: int = 0) -> int:
        return self.sync_pread(buffer, filename, file_offset)

    def wait(self) -> int:
        """Waits for every operation submitted so far; returns how many completed. If any
        failed, raises the first failure once all have finished."""
        with self._lock:
            pending, self._pending = self._pending, []
        first = None
        for fut in pending:
            err = fut.exception()
            if err is not None and first is None:
                first = err
        if first is not None:
            raise first
        return len(pending)

    # -- pinned buffers ---------------------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        return self._store.new_pinned(num_elem, example_tensor.dtype)

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        return self._store.free_pinned(tensor)

    def is_pinned(self, buffer: torch.Tensor) -> bool:
        return self._store.is_pinned(buffer)


class _AioOp:
    """What AsyncIOBuilder().load() returns once installed."""
    aio_handle = AioHandle

    @staticmethod
    def aio_read(*_a, **_k):
        raise SwapError("tierd.deepspeed: aio_read (DeepSpeed's basic benchmark) is not provided; use aio_handle")

    aio_write = aio_read


# -- checkpoints --------------------------------------------------------------------------------
# A checkpoint file in the pool: this header, then the bytes torch.save wrote.
_MAGIC = b"TIERCKP1"
_HEADER = 16  # magic, little-endian u64 payload length
_PLACEHOLDER = "tierd checkpoint file: its bytes are in tierd,"


def _put_bytes(client, pool: str, name: str, payload, what: str) -> None:
    """Tensor `name` made to hold header + payload (a bytes-like object or uint8 tensor)."""
    src = payload if isinstance(payload, torch.Tensor) else torch.frombuffer(payload, dtype=torch.uint8)
    n = src.numel()
    size = _HEADER + n
    try:
        try:
            info = client.open_tensor(pool, name)
            if info.size != size:
                client.delete_tensor(pool, name)
                info = client.create_tensor(pool, name, size=size)
        except tierd.NotFound:
            info = client.create_tensor(pool, name, size=size)
        with client.lease(info, "o", timeout=LEASE_TIMEOUT_S) as lease:
            dst = torch.frombuffer(lease, dtype=torch.uint8)
            dst[:8].copy_(torch.frombuffer(bytearray(_MAGIC), dtype=torch.uint8))
            dst[8:16].copy_(torch.frombuffer(bytearray(n.to_bytes(8, "little")), dtype=torch.uint8))
            dst[_HEADER:].copy_(src)
            del dst
    except tierd.Error as e:
        _reraise(e, f"{what} (tierd pool {pool}, tensor {name})")


class _TooSmall(Exception):
    pass


class _MemWriter(io.RawIOBase):
    """A write-only file over a memoryview; _TooSmall past its end."""

    def __init__(self, mv):
        super().__init__()
        self.mv, self.pos = mv, 0

    def writable(self):
        return True

    def write(self, b):
        b = memoryview(b).cast("B")
        end = self.pos + len(b)
        if end > len(self.mv):
            raise _TooSmall()
        self.mv[self.pos:end] = b
        self.pos = end
        return len(b)

    def tell(self):
        return self.pos


class _MemReader(io.RawIOBase):
    """A seekable read-only file over a memoryview (no copy until read)."""

    def __init__(self, mv):
        super().__init__()
        self.mv, self.pos = mv, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        n = min(len(b), len(self.mv) - self.pos)
        memoryview(b).cast("B")[:n] = self.mv[self.pos:self.pos + n]
        self.pos += n
        return n

    def read(self, size=-1):
        end = len(self.mv) if size is None or size < 0 else min(len(self.mv), self.pos + size)
        out = bytes(self.mv[self.pos:end])
        self.pos = end
        return out

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.mv)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self):
        return self.pos

    def close(self):
        self.mv = memoryview(b"")
        super().close()


def _estimate(obj, seen=None) -> int:
    """An upper estimate of torch.save's output for `obj`: its tensors' storages, plus slack
    for the pickle and the archive's records."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _estimate(k, seen)
            _estimate(v, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _estimate(v, seen)
    total = sum(seen.values())
    return total + total // 32 + (1 << 20) + 4096 * len(seen)


def _save_in_place(client, pool: str, name: str, state_dict, what: str) -> None:
    """torch.save straight into a pool tensor sized by _estimate (header: the real length)."""
    size = _HEADER + _estimate(state_dict)
    try:
        try:
            info = client.open_tensor(pool, name)
            if info.size != size:
                client.delete_tensor(pool, name)
                info = client.create_tensor(pool, name, size=size)
        except tierd.NotFound:
            info = client.create_tensor(pool, name, size=size)
        with client.lease(info, "o", timeout=LEASE_TIMEOUT_S) as lease:
            mv = lease.memoryview()
            body = mv[_HEADER:]
            try:
                w = _MemWriter(body)
                torch.save(state_dict, w)
                mv[:8] = _MAGIC
                mv[8:16] = w.pos.to_bytes(8, "little")
            finally:
                w = None
                body.release()
                mv.release()
    except tierd.Error as e:
        _reraise(e, f"{what} (tierd pool {pool}, tensor {name})")


def _get_bytes(client, pool: str, name: str, what: str) -> torch.Tensor:
    """The payload of tensor `name`, copied out; a checksum mismatch on the way from tierd's NVMe
    tier is tierd.Corruption naming the file and tensor."""
    try:
        info = client.open_tensor(pool, name)
        with client.lease(info, "r", timeout=LEASE_TIMEOUT_S) as lease:
            src = torch.frombuffer(lease, dtype=torch.uint8)
            head = bytes(src[:_HEADER].numpy())
            n = int.from_bytes(head[8:16], "little")
            if head[:8] != _MAGIC or _HEADER + n > src.numel():
                raise SwapError(f"{what} (tierd pool {pool}, tensor {name}): not a checkpoint "
                                "file written by tierd.deepspeed")
            out = src[_HEADER:_HEADER + n].clone()
            del src
        return out
    except tierd.Error as e:
        _reraise(e, f"{what} (tierd pool {pool}, tensor {name})")


def _names_below(client, pool: str, directory: str) -> Dict[str, str]:
    """{path: tensor name} of the checkpoint files in the pool below `directory`."""
    prefix = checkpoint_name(directory) + "|"
    out = {}
    for t in client.list_tensors(pool):
        if t.name.startswith(prefix):
            rel = t.name[len(prefix):].replace("|", "/").replace("%7C", "|").replace("%25", "%")
            out[os.path.join(os.path.abspath(directory), rel)] = t.name
    return out


try:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine as _CkptBase
except ImportError:  # DeepSpeed is not installed: the engine is still importable, for its docs
    _CkptBase = object


class TierCheckpointEngine(_CkptBase):
    """DeepSpeed's CheckpointEngine storing every checkpoint file as a tensor of a tierd pool
    (named from the file's absolute path): save and load run at RAM speed and the files outlive
    the training processes (not tierd's RAM: with `snapshot=True` commit() also takes a tierd
    snapshot of the pool, which survives a reboot). A load whose bytes fail tierd's checksum
    raises tierd.Corruption naming the file and the tensor, never returns weights. Directories
    and a small text file per checkpoint file are still made on disk (DeepSpeed lists a
    checkpoint's files with glob, and writes its `latest` file itself)."""

    def __init__(self, pool: Optional[str] = None, config_params=None, *, snapshot: bool = False,
                 client=None):
        if _CkptBase is not object:
            super().__init__(config_params)
        self.name = "TierCheckpointEngine"
        if client is None:
            s = store()
            client, pool = s.client, pool or s.pool
        self.client, self.pool, self.snapshot = client, pool, snapshot

    def create(self, info):
        pass

    def makedirs(self, path, exist_ok=False):
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str):
        name = checkpoint_name(path)
        what = f"saving checkpoint file {path}"
        try:
            _save_in_place(self.client, self.pool, name, state_dict, what)
        except _TooSmall:  # more than the estimate: serialize first, then copy
            buf = io.BytesIO()
            torch.save(state_dict, buf)
            _put_bytes(self.client, self.pool, name, buf.getbuffer(), what)
        # DeepSpeed finds a checkpoint's files with glob and os.path.exists: a small file on
        # disk stands for each, saying where its bytes are.
        with open(path, "w") as f:
            f.write(f"{_PLACEHOLDER} pool {self.pool} tensor {name}\n")

    def load(self, path: str, map_location=None):
        name = checkpoint_name(path)
        what = f"loading checkpoint file {path} (tierd pool {self.pool}, tensor {name})"
        try:
            info = self.client.open_tensor(self.pool, name)
            with self.client.lease(info, "r", timeout=LEASE_TIMEOUT_S) as lease:
                mv = lease.memoryview()
                try:
                    head = bytes(mv[:_HEADER])
                    n = int.from_bytes(head[8:16], "little")
                    if head[:8] != _MAGIC or _HEADER + n > len(mv):
                        raise SwapError(f"{what}: not a checkpoint file written by tierd.deepspeed")
                    body = mv[_HEADER:_HEADER + n]
                    reader = _MemReader(body)
                    try:  # straight from the lease's bytes: torch copies them into the tensors
                        return torch.load(reader, map_location=map_location, weights_only=False)
                    finally:
                        reader.close()
                        body.release()
                finally:
                    mv.release()
        except tierd.Error as e:
            _reraise(e, what)

    def exists(self, path: str) -> bool:
        try:
            self.client.open_tensor(self.pool, checkpoint_name(path))
            return True
        except tierd.NotFound:
            return False

    def commit(self, info):
        if self.snapshot:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                dist.barrier()
                if dist.get_rank() != 0:
                    return True
            self.client.snapshot(self.pool)
        return True


# -- the offloaded optimizer's swap folder in checkpoints ---------------------------------------
_ckpt_engine_factory = None  # set by install(checkpoints=...)
_copy_mode = threading.local()


def _ignored(ignore, src_root: str, path: str) -> bool:
    """Whether shutil.copytree's `ignore` drops `path` (a file below src_root) or a folder on
    the way to it."""
    if ignore is None:
        return False
    rel = os.path.relpath(path, src_root).split(os.sep)
    here = src_root
    for part in rel:
        if part in set(ignore(here, [part])):
            return True
        here = os.path.join(here, part)
    return False


def _copy_swap_folder(orig, src, dst, *args, **kwargs):
    """shutil.copytree inside engine.save_checkpoint / load_checkpoint. DeepSpeed copies the
    offloaded optimizer's swap folder into the checkpoint (save) and back (load); through tierd
    that folder's files are pool tensors, so they are copied from and to the pool: into the
    checkpoint's files (pool tensors with checkpoints=True, files on disk otherwise) and, on
    load, from them into the swap files this process then reads."""
    mode = getattr(_copy_mode, "mode", None)
    s = _store
    if s is None or mode is None:
        return orig(src, dst, *args, **kwargs)
    ignore = kwargs.get("ignore", args[1] if len(args) > 1 else None)
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    if mode == "save":
        result = orig(src, dst, *args, **kwargs)  # the folders (and any file not in tierd)
        for path in s.files_below(src):
            if _ignored(ignore, src, path):
                continue
            target = os.path.join(dst, os.path.relpath(path, src))
            data = s.read_all(path)
            if _ckpt_engine_factory is not None:
                _put_bytes(s.client, s.pool, checkpoint_name(target), data, f"saving checkpoint file {target}")
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(data.numpy().tobytes())
        return result
    # load: the checkpoint's files become this process's swap files
    sources = _names_below(s.client, s.pool, src) if _ckpt_engine_factory is not None else {}
    for root, _dirs, files in os.walk(src):
        for fn in files:
            sources.setdefault(os.path.join(root, fn), None)
    os.makedirs(dst, exist_ok=True)
    for path, name in sorted(sources.items()):
        target = os.path.join(dst, os.path.relpath(path, src))
        if name is not None:
            data = _get_bytes(s.client, s.pool, name, f"loading checkpoint file {path}")
        else:
            with open(path, "rb") as f:
                data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        s.write(data, target, 0)
    return dst


def _with_copy_mode(mode: str, method):
    def wrapper(self, *args, **kwargs):
        orig = shutil.copytree
        shutil.copytree = lambda src, dst, *a, **k: _copy_swap_folder(orig, src, dst, *a, **k)
        _copy_mode.mode = mode
        try:
            return method(self, *args, **kwargs)
        finally:
            _copy_mode.mode = None
            shutil.copytree = orig
    wrapper.__wrapped__ = method
    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _with_end_of_step(method):
    def wrapper(self, *args, **kwargs):
        before = getattr(self, "global_steps", None)
        out = method(self, *args, **kwargs)
        if _store is not None and getattr(self, "global_steps", None) != before:
            _store.end_of_step()
        return out
    wrapper.__wrapped__ = method
    wrapper.__name__ = method.__name__
    return wrapper


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
    global _store, _ckpt_engine_factory
    if _store is not None:
        if _store.pool != pool:
            raise SwapError(f"tierd.deepspeed is already installed with pool {_store.pool}")
        return
    if checkpoints not in (False, True, "snapshot"):
        raise ValueError(f"checkpoints must be False, True or 'snapshot', not {checkpoints!r}")
    import deepspeed  # noqa: F401  (the accelerator is chosen on import)
    import deepspeed.ops.op_builder as op_builder
    import deepspeed.runtime.engine as ds_engine
    _store = _Store(pool, socket, ram_quota, nvme_quota)
    builder = op_builder.AsyncIOBuilder
    _patch(builder, "load", lambda self, verbose=True: _AioOp)
    _patch(builder, "is_compatible", lambda self, verbose=False: True)
    engine_cls = ds_engine.DeepSpeedEngine
    _patch(engine_cls, "save_checkpoint", _with_copy_mode("save", engine_cls.save_checkpoint))
    _patch(engine_cls, "load_checkpoint", _with_copy_mode("load", engine_cls.load_checkpoint))
    _patch(engine_cls, "step", _with_end_of_step(engine_cls.step))
    if checkpoints:
        snap = checkpoints == "snapshot"
        _ckpt_engine_factory = lambda *a, **k: TierCheckpointEngine(pool, k.get("config_params"), snapshot=snap)
        _patch(ds_engine, "create_checkpoint_engine", _ckpt_engine_factory)


def uninstall() -> None:
    """Restores DeepSpeed's own handle and checkpoint engine (for engines built afterwards) and
    closes the connection; pinned buffers still in use stay valid until their process exits."""
    global _store, _ckpt_engine_factory
    while _saved:
        obj, attr, value = _saved.pop()
        setattr(obj, attr, value)
    _ckpt_engine_factory = None
    if _store is not None:
        _store.executor.shutdown(wait=True)
        _store = None
