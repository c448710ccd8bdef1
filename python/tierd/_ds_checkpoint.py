"""tierd.deepspeed's checkpoint side: TierCheckpointEngine, and the wrappers of the engine's
save_checkpoint / load_checkpoint (the optimizer's swap folder) and step (the plan). See
tierd/deepspeed.py."""
from __future__ import annotations

import io
import os
import shutil
import threading
from typing import Dict, Optional

import torch

import tierd
from tierd import _ds_swap
from tierd._ds_swap import LEASE_TIMEOUT_S, SwapError, _escape, _limit, _reraise, store

_CKPT = "ckpt"


def checkpoint_name(path: str) -> str:
    """The pool tensor of checkpoint file `path` (its absolute path)."""
    return _limit(f"{_CKPT}|" + _escape(os.path.abspath(os.fspath(path))))


# -- checkpoints --------------------------------------------------------------------------------
# A checkpoint file in the pool: this header, then the bytes torch.save wrote.
_MAGIC = b"TIERCKP1"
_HEADER = 16  # magic, little-endian u64 payload length
_PLACEHOLDER = "tierd checkpoint file: its bytes are in tierd,"


def _tensor_of_size(client, pool: str, name: str, size: int):
    """Tensor `name` of exactly `size` bytes: the existing one when it has that size, else a new
    one in its place."""
    try:
        info = client.open_tensor(pool, name)
        if info.size == size:
            return info
        client.delete_tensor(pool, name)
    except tierd.NotFound:
        pass
    return client.create_tensor(pool, name, size=size)


def payload_length(head: bytes, total: int) -> Optional[int]:
    """The payload length a checkpoint tensor's header announces, given its first _HEADER bytes
    (fewer when the tensor is shorter) and the tensor's size; None when they are not a header
    tierd.deepspeed wrote (another magic, a tensor too short for its header or its payload)."""
    if len(head) < _HEADER or total < _HEADER or head[:8] != _MAGIC:
        return None
    n = int.from_bytes(head[8:_HEADER], "little")
    return n if _HEADER + n <= total else None


def _put_bytes(client, pool: str, name: str, payload, what: str) -> None:
    """Tensor `name` made to hold header + payload (a bytes-like object or uint8 tensor)."""
    src = payload if isinstance(payload, torch.Tensor) else torch.frombuffer(payload, dtype=torch.uint8)
    n = src.numel()
    size = _HEADER + n
    try:
        info = _tensor_of_size(client, pool, name, size)
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
        info = _tensor_of_size(client, pool, name, size)
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
            n = payload_length(bytes(src[:_HEADER].numpy()), src.numel())
            if n is None:
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
                    n = payload_length(bytes(mv[:_HEADER]), len(mv))
                    if n is None:
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


def set_factory(factory) -> None:
    global _ckpt_engine_factory
    _ckpt_engine_factory = factory
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
    s = _ds_swap.current()
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
        s = _ds_swap.current()
        if s is not None and getattr(self, "global_steps", None) != before:
            s.end_of_step()
        return out
    wrapper.__wrapped__ = method
    wrapper.__name__ = method.__name__
    return wrapper
