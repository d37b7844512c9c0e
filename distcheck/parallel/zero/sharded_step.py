"""The torch side of the sharded optimizer step contract: what every rank runs for one example
(:func:`run_step`). torch is imported inside the functions only.

The model is a float64 ``Linear`` / ``ReLU`` stack holding the case's weights (torch layout,
``(out, in)``). Every rank trains on its own rows of the batch (``numpy.array_split``; ranks
beyond the batch get none and still take part in every collective) with the **sum** loss
``0.5 sum ||f(x) - t||^2``, so the full-batch gradient is the sum of the ranks' gradients; a
copy of the model, unsharded, trains on the whole batch with the plain optimizer on every rank
(the reference). Targets:

* ``optimizer``: a sharded optimizer with ``torch.distributed.optim.ZeroRedundancyOptimizer``'s
  constructor, ``cls(params, optimizer_class=..., **hyperparameters)``. ZeRO-1 does not reduce
  gradients (DDP does), so the harness sums them with one all-reduce per parameter before
  ``step()``; with the option ``reduce_gradients=false`` each rank passes its own gradient and
  the optimizer must reduce them (ZeRO-2 style). The state is read from the local optimizer
  (``.optim``, as ZeroRedundancyOptimizer keeps it; else the optimizer itself).
* ``fully_shard``: ``torch.distributed.fsdp.fully_shard`` (or a function with its signature),
  applied to every ``Linear`` and to the root with ``reshard_after_forward`` and gradient divide
  factor 1 (the reduce-scatter sums), then the plain optimizer on the sharded parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

#: a :class:`distcheck.parallel.zero.contracts.StepCase` (not imported: that module imports this one)
_StepCase = Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from distcheck.engine.contracts.targets import Target
    from distcheck.engine.world import RankContext

__all__ = ["OPTIMIZERS", "LR", "build_mlp", "run_step"]

#: the optimizers a case draws (float64): plain SGD, SGD with momentum 0.9, Adam
OPTIMIZERS = ("sgd", "momentum", "adam")
#: the learning rate of every optimizer: a power of two, so an SGD step of an exact gradient is exact
LR = 2.0**-6


def _optimizer(name: str) -> tuple[Callable[..., torch.optim.Optimizer], dict[str, Any]]:
    import torch

    return {"sgd": (torch.optim.SGD, {"lr": LR}), "momentum": (torch.optim.SGD, {"lr": LR, "momentum": 0.9}),
            "adam": (torch.optim.Adam, {"lr": LR})}[name]


def build_mlp(case: _StepCase, device: torch.device | str) -> torch.nn.Sequential:
    """The case's model: ``Linear`` layers of ``case.widths`` with ReLU between them, float64."""
    import torch
    from torch import nn

    layers: list = []
    for i, (W, b) in enumerate(zip(case.weights, case.biases, strict=True)):
        lin = nn.Linear(W.shape[1], W.shape[0], dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if i < len(case.weights) - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(device)


def _storage_bytes(tensors: Iterable[Any]) -> int:  # tensors or DTensors (gradients after a backward)
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        s = local.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the per-element optimizer state (Adam's moments, SGD's momentum buffer), each storage
    once; scalar ``step`` counters are not counted."""
    import torch

    tensors = [v for st in optimizer.state.values() for k, v in st.items()
               if k != "step" and torch.is_tensor(v) and v.dim() > 0]
    return _storage_bytes(tensors) if tensors else 0


def _loss(model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return 0.5 * (model(x) - t).pow(2).sum()


def run_step(ctx: RankContext, target: Target, case: _StepCase, obj: Any, options: dict) -> dict:
    """One example on this rank: ``case.steps`` steps of the target and of the single-device reference.

    Returns (numpy float64, plain Python): ``params`` (the sharded run's parameters, gathered to
    full tensors, in ``model.parameters()`` order), ``single`` (the reference's), ``shapes``,
    ``state_bytes`` (the optimizer state this rank holds), for ``fully_shard`` also
    ``param_bytes`` and ``grad_bytes`` (after the last backward), and for ``optimizer`` the
    indices of the parameters whose state this rank keeps (``owned``; None when the optimizer
    does not say).
    """
    import torch
    import torch.distributed as dist

    from distcheck.engine.contracts.layer import split_bounds

    lo, hi = split_bounds(case.X.shape[0], ctx.world_size, "array_split")[ctx.rank]
    X, T = torch.from_numpy(case.X).to(ctx.device), torch.from_numpy(case.T).to(ctx.device)
    model = build_mlp(case, ctx.device)
    single = copy.deepcopy(model)
    cls, kw = _optimizer(case.optimizer)
    out: dict = {"shapes": [tuple(p.shape) for p in model.parameters()]}
    if target.kind == "fully_shard":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        sharded: list[Any] = [m for m in model if isinstance(m, torch.nn.Linear)] + [model]  # FSDP modules below
        for m in sharded:
            obj(m, mesh=mesh, reshard_after_forward=options["reshard_after_forward"])
        for m in sharded:
            m.set_gradient_divide_factor(1.0)  # sum, not mean, across ranks
        opt = cls(model.parameters(), **kw)
    else:
        opt = obj(model.parameters(), optimizer_class=cls, **kw)
    plain = cls(single.parameters(), **kw)
    for _ in range(case.steps):
        opt.zero_grad()
        _loss(model, X[lo:hi], T[lo:hi]).backward()
        if target.kind == "fully_shard":
            out["grad_bytes"] = _storage_bytes([p.grad for p in model.parameters()])
        elif options["reduce_gradients"]:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        plain.zero_grad()
        _loss(single, X, T).backward()
        plain.step()

    def full(p: torch.Tensor) -> np.ndarray:
        return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().numpy().copy()

    out["params"] = [full(p) for p in model.parameters()]
    out["single"] = [full(p) for p in single.parameters()]
    local = getattr(opt, "optim", opt)
    out["state_bytes"] = _state_bytes(local)
    if target.kind == "fully_shard":
        out["param_bytes"] = _storage_bytes(list(model.parameters()))
    else:
        index = {id(p): i for i, p in enumerate(model.parameters())}
        mine = [index[id(p)] for g in local.param_groups for p in g["params"] if id(p) in index]
        out["owned"] = None if local is opt else sorted(mine)
    return out
