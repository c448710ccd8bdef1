"""tierd.deepspeed's swap side: DeepSpeed's aio handle over a tierd pool (AioHandle), the
process's connection, swap files and pinned buffers (_Store). See tierd/deepspeed.py."""
from __future__ import annotations

import concurrent.futures as _futures
import os
import socket as _socket
import threading
import warnings
from typing import Dict, List, Optional

import torch

import tierd

# torch.frombuffer warns once on a read-only buffer (a read lease); the views made here of read
# leases are only read.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

# Seconds an operation waits for a conflicting lease of the same file (another operation in
# flight on it) before it fails.
LEASE_TIMEOUT_S = 120.0
_PINNED = "pinned"


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


def set_store(s: Optional[_Store]) -> None:
    global _store
    _store = s


def current() -> Optional[_Store]:
    """The process's store, None before install()."""
    return _store

