"""tierd: the node memory tier (host RAM and NVMe) for training state, over libtier.

    import tierd
    c = tierd.connect()                 # $TIERD_SOCKET or /run/tierd/tierd.sock
    c.create_pool("job1", exist_ok=True)
    t = c.create_tensor("job1", "w0", shape=(1024,), dtype="float32", exist_ok=True)
    with c.lease(t, "w") as lease:      # modes: 'r' read, 'w' write, 'o' overwrite
        lease.numpy()[:] = 1.0          # zero-copy into the arena

The client, pools, tensors, leases and errors come from the extension module tierd._native;
tierd.torch adds OffloadAdamW, a torch.optim.Optimizer whose state lives in tierd,
tierd.torch.checkpoint the storage of torch.distributed.checkpoint in tierd (PyTorch >= 2.4), and
tierd.deepspeed.install(pool) puts DeepSpeed's ZeRO-3 NVMe offload and checkpoints in tierd.
"""
from tierd._native import *  # noqa: F401,F403  (the extension's public names)
from tierd._native import __version__, adamw_step  # noqa: F401
