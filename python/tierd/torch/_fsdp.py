"""OffloadAdamW over FSDP2 (torch.distributed.fsdp.fully_shard): parameters that are DTensors.

FSDP2 shards each parameter along dim 0 and reduce-scatters (and averages) its gradient in the
backward pass, so each rank already holds exactly what it must update: the local shard of every
parameter and of its gradient. OffloadAdamW then treats each rank as one process over those
local shards (a unit per parameter, named with the rank as "fsdp.r<R>of<W>.g<G>.p<I>.<buffer>"),
with no collectives of its own beyond agreeing on the step to resume from. A local shard is a
view of the parameter's storage (the sharded parameter's memory, on the GPU or, with
CPUOffloadPolicy, in pinned host memory), so writing the new master copy into it updates the
model.

On PyTorch without DTensor (Debian's 1.13) no parameter is one and nothing here is used.
"""
from __future__ import annotations

from typing import List, Optional

import torch


def is_dtensor(t) -> bool:
    """Whether `t` is a torch.distributed.tensor.DTensor (checked by name: importing DTensor
    fails on PyTorch 1.x, where there are none)."""
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def local_views(params: List[torch.Tensor]) -> Optional[List[torch.Tensor]]:
    """The local shards of `params` when they are DTensors (all or none), else None."""
    flags = [is_dtensor(p) for p in params]
    if not any(flags):
        return None
    if not all(flags):
        raise TypeError("OffloadAdamW: some parameters are DTensors (FSDP2) and some are not; "
                        "shard the whole model with fully_shard, or none of it")
    # to_local() of a parameter is a view of its storage, not a copy: the update relies on it.
    # FSDP2 may give a parameter new storage (lazy init, load_state_dict(assign=True)), so the
    # optimizer takes fresh views at every step.
    return [p.to_local().detach() for p in params]


def attach_grads(params: List[torch.Tensor], views: List[torch.Tensor]) -> None:
    """Sets each local view's .grad to the local shard of its DTensor parameter's gradient
    (None where the parameter has none), so the optimizer reads gradients from the views."""
    for p, v in zip(params, views):
        g = p.grad
        v.grad = None if g is None else (g.to_local() if is_dtensor(g) else g)


def detach_grads(views: List[torch.Tensor]) -> None:
    """Drops the references attach_grads() made, so zero_grad() frees the gradients."""
    for v in views:
        v.grad = None
