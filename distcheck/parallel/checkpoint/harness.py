"""The rank side of the ``checkpoint`` contract: build a model under a layout, train it, save it with the
user's ``save(state, path)``, load it under another layout with ``load(state, path)``, and report every
tensor whole.

A model is a module holding the case's tensors as parameters ``t0, t1, ...``, laid out as
:mod:`distcheck.parallel.checkpoint.reference` says: plain tensors on every rank (``replicated``, DDP's
layout), ``fully_shard`` on a one-axis mesh of the world (``fsdp``), DTensors ``Shard(d)`` /
``Replicate()`` per tensor (``tp``), or both on a 2-D ``(dp, tp)`` DeviceMesh (``fsdp_tp``: the tensors
distributed on ``mesh["tp"]``, then ``fully_shard(model, mesh=mesh["dp"])``, which shards each rank's tp
shard along dim 0 again). Training is Adam (lr 2**-6) on given gradients, each rank's the shard
of the case's full gradient in its parameter's placement: the optimizer half of a training step, the
gradient half being a function of the parameters alone. Each rank holds the whole gradient, so its shard
is a local split (``distribute_tensor(..., src_data_rank=None)``): torch 2.13's scatter from rank 0 raises
a bare AssertionError for a ``_StridedShard`` placement whose dimension the mesh does not divide (it splits
with padding and requires equal pieces), which is what FSDP2 over tp gives an uneven tensor. The state is torch's
``get_state_dict(model, optimizer)`` ({"model": ..., "optim": ...}, FQN keys), written back after the
load with ``set_state_dict``.

A ``case`` is a :class:`distcheck.parallel.checkpoint.contracts.CkptCase` (typed ``Any`` here: the contract
imports this module, so naming its type back would be an import cycle). Every rank runs :func:`save_rank`
and then (maybe on another world) :func:`load_rank` on one shared
folder; each returns the whole tensors (``full_tensor()``) as numpy arrays. Tensors live on the rank's
device (``ctx.device``: the CPU under gloo, its GPU under NCCL).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from distcheck.engine.world import RankContext

__all__ = ["build", "save_rank", "load_rank", "shared_folder", "folder_bytes", "local_shards", "LR"]

#: Adam's learning rate
LR = 2.0**-6


def shared_folder(ctx: RankContext, path: str | None = None) -> str:
    """A folder every rank of the world names alike: ``path``, or a new temporary one made by rank 0."""
    import tempfile

    import torch.distributed as dist

    box = [path if path is not None else (tempfile.mkdtemp(prefix="distcheck-ckpt-") if ctx.rank == 0 else None)]
    dist.broadcast_object_list(box, src=0, group=ctx.group)
    return str(box[0])


def folder_bytes(path: str) -> tuple[int, int]:
    """``(bytes, files)`` of every file under ``path``."""
    total = count = 0
    for folder, _, names in os.walk(path):
        for n in names:
            total += os.path.getsize(os.path.join(folder, n))
            count += 1
    return total, count


def build(ctx: RankContext, case: Any, layout: str, dims: Sequence[int | None], *, zero: bool = False
          ) -> tuple[Any, Any]:
    """The case's model under ``layout`` (its tensors, or zeros with ``zero``) and its Adam optimizer."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    dtype = getattr(torch, case.dtype)
    model = torch.nn.Module()
    for i, p in enumerate(case.params):
        t = (torch.zeros(p.shape, dtype=dtype) if zero else torch.tensor(p, dtype=dtype)).to(ctx.device)
        model.register_parameter(f"t{i}", torch.nn.Parameter(t))
    if layout in ("fsdp", "tp"):
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    elif layout == "fsdp_tp":
        from distcheck.parallel.checkpoint.reference import mesh_2d

        mesh2 = init_device_mesh(ctx.device.type, mesh_2d(ctx.world_size), mesh_dim_names=("dp", "tp"))
        mesh, dp_mesh = mesh2["tp"], mesh2["dp"]
    if layout in ("tp", "fsdp_tp"):
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        for i, d in enumerate(dims):
            full = getattr(model, f"t{i}").detach()
            place = [Replicate()] if d is None else [Shard(d)]
            setattr(model, f"t{i}", torch.nn.Parameter(distribute_tensor(full, mesh, place)))
    if layout in ("fsdp", "fsdp_tp"):
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=mesh if layout == "fsdp" else dp_mesh)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def _step(model: Any, optimizer: Any, grads: Sequence[np.ndarray], dtype: Any) -> None:
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    for p, g in zip(model.parameters(), grads, strict=True):
        full = torch.tensor(g, dtype=dtype).to(p.device)
        p.grad = (distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None) if isinstance(p, DTensor)
                  else full)
    optimizer.step()
    optimizer.zero_grad()


def _whole(t: Any) -> Any:
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone().numpy() if isinstance(t, torch.Tensor) else t


def snapshot(model: Any, optimizer: Any) -> dict:
    """Every parameter and Adam state whole: ``{"t0": array, "t0.exp_avg": ..., "t0.step": float}``."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    out = {k: _whole(v) for k, v in msd.items()}
    states: Any = osd["state"]
    for k, state in sorted(states.items()):
        for key, v in sorted(state.items()):
            out[f"{k}.{key}"] = _whole(v)
    return out


def local_shards(model: Any) -> dict:
    """Each parameter's local shard on this rank (``to_local()`` of a DTensor, a plain tensor whole) as a
    numpy array: ``{"t0": array, ...}``, to compare with :func:`distcheck.parallel.checkpoint.shard_boxes`."""
    from torch.distributed.tensor import DTensor

    return {k: (p.to_local() if isinstance(p, DTensor) else p).detach().cpu().clone().numpy()
            for k, p in model.named_parameters()}


def _state(model: Any, optimizer: Any) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd}


def save_rank(ctx: RankContext, save: Callable[[dict, str], Any], case: Any, path: str) -> dict:
    """Train the case's model under layout A for ``case.steps`` steps, save it with ``save(state, path)``,
    and report ``saved`` (the state whole), ``next`` (the parameters after one more step: what the saved
    run does next) and on rank 0 the ``bytes`` and ``files`` written."""
    import torch.distributed as dist

    dtype = getattr(__import__("torch"), case.dtype)
    model, opt = build(ctx, case, case.layout_a, case.dims_a)
    for grads in case.grads[:-1]:
        _step(model, opt, grads, dtype)
    save(_state(model, opt), path)
    dist.barrier(group=ctx.group)
    out: dict = {"saved": snapshot(model, opt), "local": local_shards(model)}
    if ctx.rank == 0:
        out["bytes"], out["files"] = folder_bytes(path)
    _step(model, opt, case.grads[-1], dtype)
    out["next"] = {k: v for k, v in snapshot(model, opt).items() if "." not in k}
    return out


def load_rank(ctx: RankContext, load: Callable[[dict, str], Any], case: Any, path: str) -> dict:
    """Build the case's model under layout B with zero tensors and a fresh Adam, load it with
    ``load(state, path)`` and ``set_state_dict``, and report ``loaded`` (the state whole) and ``next``
    (the parameters after one more step on the same gradient)."""
    import torch
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, opt = build(ctx, case, case.layout_b, case.dims_b, zero=True)
    state = _state(model, opt)
    load(state, path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    out: dict = {"loaded": snapshot(model, opt), "local": local_shards(model)}
    _step(model, opt, case.grads[-1], getattr(torch, case.dtype))
    out["next"] = {k: v for k, v in snapshot(model, opt).items() if "." not in k}
    return out


def round_trip(ctx: RankContext, save: Callable[[dict, str], Any], load: Callable[[dict, str], Any],
               case: Any) -> dict:
    """:func:`save_rank` then :func:`load_rank` on one world and one new shared folder, removed after."""
    import shutil

    import torch.distributed as dist

    path = shared_folder(ctx)
    try:
        out = save_rank(ctx, save, case, path)
        got = load_rank(ctx, load, case, path)
        out["loaded"], out["loaded_next"] = got["loaded"], got["next"]
    finally:
        dist.barrier(group=ctx.group)
        if ctx.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return out


def as_arrays(params: Sequence[Any]) -> list[np.ndarray]:
    """The case's tensors as float64 arrays (pickled to every rank)."""
    return [np.asarray(p, dtype=np.float64) for p in params]
