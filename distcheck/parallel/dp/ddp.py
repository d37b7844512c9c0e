"""The torch side of the data-parallel reducer contract: the models, the weighted comm hook, and
what every rank runs for one example (:func:`run_reducer`). torch is imported inside the
functions only.

Models (the case's ``model``), loss ``L = (1/n) sum_i ||f(x_i) - y_i||^2`` (the convention of
:mod:`distcheck.parallel.dp.reference`: mean over examples, sum over outputs):

* ``"linear"``: ``f(x) = x w``, ``w`` of shape (d,), a bias-free ``nn.Linear(d, 1)``;
* ``"mlp"``: ``f(x) = relu(x W1 + b1) W2 + b2``, ``nn.Linear(d, hidden)``, ReLU, ``nn.Linear(hidden, out)``.

What DDP computes (the lesson "Scaling and distributed training", "Data parallelism is exact"):
rank ``k`` with ``n_k`` examples produces ``g_k``, the gradient of its shard-mean loss, and
DDP's all-reduce returns ``(1/N) sum_k g_k``. With unequal shards that weights an example by
``1/(N n_k)`` instead of ``1/n`` (catalogue ``dp.plain_mean_weight`` against ``dp.exact_weight``).
Two fixes give ``sum_k n_k g_k / n``, the full-batch gradient:

* :func:`weighted_allreduce_hook`, a DDP communication hook that all-reduces ``[n_k g_k, n_k]``
  in one buffer and divides by the summed count, so no rank needs the others' shard sizes;
* loss scaling: each rank multiplies its loss by ``n_k N / n`` and lets DDP average as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a case is a distcheck.parallel.dp.contracts.DDPCase, which imports this module
    import numpy as np
    import torch

    from distcheck.engine.contracts.targets import Target
    from distcheck.engine.world import RankContext

__all__ = ["weighted_allreduce_hook", "build_model", "model_grads", "run_reducer"]


def weighted_allreduce_hook(n_local, bucket):  # type: (float, torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]
    """DDP communication hook: all-reduce ``[n_k * g_k, n_k]`` and return ``sum n_k g_k / sum n_k``.

    Register with ``ddp.register_comm_hook(state=float(n_k), hook=weighted_allreduce_hook)``
    (``n_k``: this rank's examples). With a hook registered DDP does not divide by the world
    size itself.

    Its types are in a type comment, not in the signature: ``register_comm_hook`` rejects a hook
    whose ``bucket`` or return annotation is anything but the objects ``dist.GradBucket`` and
    ``torch.futures.Future[torch.Tensor]``, and this module imports torch lazily, so annotations
    here would be strings.
    """
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    flat = torch.cat([buf * n_local, buf.new_tensor([n_local])])
    fut = dist.all_reduce(flat, async_op=True).get_future()

    def finish(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        out = f.value()[0]
        return out[:-1] / out[-1]

    return fut.then(finish)


def build_model(case: Any, device: torch.device | str) -> torch.nn.Module:
    """The case's model as a float64 torch module holding its parameters."""
    import torch

    p = case.params
    if case.model == "linear":
        m = torch.nn.Linear(case.d, 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(p["w"]).reshape(1, case.d))
        return m.to(device)
    hidden, out = p["W1"].shape[1], p["W2"].shape[1]
    first = torch.nn.Linear(case.d, hidden, dtype=torch.float64)
    second = torch.nn.Linear(hidden, out, dtype=torch.float64)
    with torch.no_grad():
        first.weight.copy_(torch.from_numpy(p["W1"].T))
        first.bias.copy_(torch.from_numpy(p["b1"]))
        second.weight.copy_(torch.from_numpy(p["W2"].T))
        second.bias.copy_(torch.from_numpy(p["b2"]))
    return torch.nn.Sequential(first, torch.nn.ReLU(), second).to(device)


def model_grads(case: Any, m: Any) -> dict:
    """The model's ``.grad`` as numpy arrays in the reference's layout (None where a parameter has none)."""
    def arr(p: torch.nn.Parameter) -> np.ndarray | None:
        return None if p.grad is None else p.grad.detach().cpu().numpy().copy()

    if case.model == "linear":
        g = arr(m.weight)
        return {"w": None if g is None else g.reshape(case.d)}
    out = {"W1": arr(m[0].weight), "b1": arr(m[0].bias), "W2": arr(m[2].weight), "b2": arr(m[2].bias)}
    return {k: (v.T.copy() if v is not None and k in ("W1", "W2") else v) for k, v in out.items()}


def _loss(case: Any, model: torch.nn.Module, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    pred = model(X)
    if case.model == "linear":
        pred = pred.reshape(-1)
    return (pred - Y).pow(2).sum() / X.shape[0]


def run_reducer(ctx: RankContext, target: Target, case: Any, obj: Any, options: dict) -> dict:
    """What every rank runs for one example of the data-parallel reducer contract.

    The full-batch gradient without the reducer (torch, on this rank), then the model on this
    rank's shard (``np.array_split`` sizes) through the target: a DDP class wraps it; a comm
    hook is registered on torch's DDP (its state: ``float(n_k)``, or None with the option
    ``hook_state="none"``, the default process group, as torch's own hooks take); a reducer
    ``reduce(module, n_local)`` is called after the backward and must leave the synchronised
    gradients in ``.grad``. With ``loss_scale`` the shard's loss is multiplied by ``n_k N / n``.

    Returns ``{"full": grads, "grads": grads}`` (numpy float64, the reference's layout).
    Call on every rank (DDP construction and its backward are collectives).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel

    N, dev = ctx.world_size, ctx.device
    X, Y = torch.from_numpy(case.X).to(dev), torch.from_numpy(case.Y).to(dev)
    Xk, Yk = torch.tensor_split(X, N)[ctx.rank], torch.tensor_split(Y, N)[ctx.rank]
    nk, n = Xk.shape[0], X.shape[0]
    full = build_model(case, dev)
    _loss(case, full, X, Y).backward()
    local = build_model(case, dev)
    ids = [dev.index] if dev.type == "cuda" else None
    if target.kind == "ddp":
        wrapped = obj(local, device_ids=ids)
    elif target.kind == "hook":
        wrapped = DistributedDataParallel(local, device_ids=ids)
        wrapped.register_comm_hook(None if options["hook_state"] == "none" else float(nk), obj)
    else:
        wrapped = local
    loss = _loss(case, wrapped, Xk, Yk)
    if options["loss_scale"]:
        loss = loss * (nk * N / n)
    loss.backward()
    if target.kind == "reducer":
        obj(local, nk)
    return {"full": model_grads(case, full), "grads": model_grads(case, local), "n_local": int(nk)}
