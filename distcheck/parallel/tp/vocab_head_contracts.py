"""The vocab-parallel output layer and its loss: an lm head split by vocabulary rows (a
column-parallel linear that does not gather its logits) followed by the vocab-parallel
cross-entropy (Shoeybi et al. 2019, "Megatron-LM", §3: the output GEMM fused with the
cross-entropy, so only b s values per all-reduce cross the ranks).

**vocab-parallel-lm-head-loss**. Every rank receives the hidden states x (b, s, h) and the targets;
rank r holds rows ``[lo_r, hi_r)`` of the head's ``weight`` (vocab_size, h) and computes its logit
columns ``x W_r^T``; the loss is the vocab-parallel cross-entropy of those columns
(:mod:`distcheck.parallel.tp.vocab_contracts`). Properties: ``forward`` (the loss, the same bits on
every rank), ``input_grad`` (the hidden states' gradient: all of it on every rank, the same bits),
``param_grads`` (rank r's rows of the head's gradient), ``collectives.forward`` (the loss's three
all-reduces of b s values, the head's none: ``tp.vocab_cross_entropy.allreduce_per_forward``),
``collectives.backward`` (one all-reduce of the b s h input gradient: Megatron's f, Shoeybi et al.
2019 §3). Targets:

* a module class ``cls(hidden_size, vocab_size, **kwargs)`` whose ``forward(x, target)`` returns the
  loss and whose ``weight`` (aliases ``head.weight``, ``lm_head.weight``, ``output_layer.weight``)
  holds the rank's rows (Megatron's and fairscale's ``ColumnParallelLinear(gather_output=False)``
  then ``vocab_parallel_cross_entropy``; ``examples/my_vocab_layers.py``);
* torch's ``torch.distributed.tensor.parallel:loss_parallel``: torch's recipe, an ``nn.Linear(h,
  vocab_size, bias=False)`` parallelized with ``ColwiseParallel(use_local_output=False)`` (its logits
  a ``Shard(-1)`` DTensor), then ``F.cross_entropy`` forward and backward inside ``loss_parallel()``.

**Bounded.** x is drawn from {-1, 0, 1} and the weights from multiples of 1/2 in [-1, 1], with h <= 2:
the logits are multiples of 1/2 in [-2, 2], computed exactly in every format, so the loss and the
logits' gradient carry the cross-entropy's derived bound, and the two products of the backward
(``dx = dz W``, inner length vocab_size, partial sums all-reduced; ``dW = dz^T x``, inner length b s)
add the product rule of :mod:`distcheck.engine.contracts.bounds` (``gamma_{k+3}``, Higham §3.1).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distcheck.core.vocab import Collective
from distcheck.engine import strategies as generic
from distcheck.engine.contracts import bounds as tb
from distcheck.engine.contracts.checks import agree, combine, compare
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.layer import check_constructor, split_bounds
from distcheck.engine.contracts.sharded import ITEMSIZE, closed_form
from distcheck.engine.contracts.targets import Target, make_target
from distcheck.engine.world import RankContext
from distcheck.parallel.tp import vocab as ref
from distcheck.parallel.tp.vocab_contracts import (
    CECase,
    _compare_records,
    _numpy,
    _tracked_cross_entropy,
    closed_form_at,
    refuse_threaded,
)

if TYPE_CHECKING:
    import torch

__all__ = ["HeadCase", "VocabParallelLMHeadLoss"]

_WEIGHT_NAMES = ("weight", "head.weight", "lm_head.weight", "output_layer.weight")

HEAD_PROPERTIES = (
    PropertySpec("forward", "every rank's loss is within the derived bound of the reference, the same bits on every "
                            "rank", "bounded"),
    PropertySpec("input_grad", "every rank holds all of the hidden states' gradient, within the derived bound, the "
                               "same bits on every rank", "bounded"),
    PropertySpec("param_grads", "every rank's gradient of its own rows of the head is within the derived bound",
                 "bounded"),
    PropertySpec("collectives.forward", "one forward issues the loss's three all-reduces of b s values and nothing "
                                        "for the head (its logits stay split)", "exact"),
    PropertySpec("collectives.backward", "one backward issues one all-reduce of the b s h input gradient "
                                         "(Megatron's f)", "exact"),
)


@dataclass(frozen=True)
class HeadCase:
    """One example: ``tp``, the hidden states ``x`` (b, s, h), the head's ``weight`` (vocab_size, h),
    the ``target`` ids (b, s) and the output gradient ((b, s) for ``reduction="none"``, else a scalar)."""

    tp: int
    x: np.ndarray
    weight: np.ndarray
    target: np.ndarray
    grad_output: np.ndarray

    @property
    def logits(self) -> np.ndarray:
        return self.x @ self.weight.T  # exact: small integers times halves, h <= 2 terms

    def __repr__(self) -> str:
        return (f"HeadCase(tp={self.tp}, x={self.x.tolist()}, weight={self.weight.tolist()}, "
                f"target={self.target.tolist()}, grad_output={self.grad_output.tolist()})")


class VocabParallelLMHeadLoss(Contract):
    """An lm head split by vocabulary rows followed by the vocab-parallel cross-entropy (see the module doc)."""

    name = "vocab-parallel-lm-head-loss"
    min_world_size = 2
    min_world_reason = ("one rank holds the whole vocabulary: the all-reduces of the max, the sum and the target's "
                        "logit are identities, so a missing or wrong one gives the reference's loss there")
    parallelism = "tp"
    summary = ("lm head split by vocabulary rows, logits kept split, vocab-parallel cross-entropy; the input "
               "gradient all-reduced")
    properties = HEAD_PROPERTIES
    options = (
        Option("divisible", True, bool, "draw only vocabulary sizes that tp divides (Megatron and fairscale "
                                        "require it)"),
        Option("reduction", "none", str, "the loss per token (none) or reduced over the tokens (mean, sum)",
               ref.REDUCTIONS),
        Option("ignore_index", None, int, "a target id whose tokens have loss 0 and gradient 0 (torch: -100)",
               min_value=-(2**63), max_value=2**63 - 1),  # a torch int64 target id
        Option("kwargs", {}, dict, "keyword arguments of a module class's constructor"),
    )

    def resolve(self, obj: Any, ref_name: str | None, options: dict) -> tuple[Target, dict]:
        import torch
        from torch.distributed.tensor.parallel import loss_parallel

        if obj is loss_parallel:
            return make_target(obj, ref_name, "loss_parallel", split="chunk"), options
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            check_constructor(obj, (1, 1), dict(options["kwargs"]), f"{obj.__name__}(hidden_size, vocab_size)")
            return make_target(obj, ref_name, "module", split="array_split", kwargs=dict(options["kwargs"])), options
        raise ProtocolError("target", ref_name or repr(obj),
                            "must be a torch.nn.Module class built as cls(hidden_size, "
                            "vocab_size) and called as module(x, target), or "
                            f"torch.distributed.tensor.parallel:loss_parallel for "
                            f"contract {self.name}")

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[HeadCase]:
        tp, b, s = world_size, 2, 3
        most = max(8, 2 * tp)
        reduction, ignore = options["reduction"], options["ignore_index"]

        @st.composite
        def draw_case(draw: st.DrawFn) -> HeadCase:
            V = tp * draw(st.integers(1, max(1, most // tp))) if options["divisible"] else draw(st.integers(tp, most))
            h, bb, ss = draw(st.integers(1, 2)), draw(st.integers(1, b)), draw(st.integers(1, s))
            x = generic.draw_ints(draw, (bb, ss, h), 1, max_shape=(b, s, 2))
            w = generic.draw_ints(draw, (V, h), 2, max_shape=(most, 2)) / 2
            ids = st.integers(0, V - 1) if ignore is None else st.one_of(st.integers(0, V - 1), st.just(ignore))
            t = draw(hnp.arrays(np.int64, (bb, ss), elements=ids))
            if reduction == "mean" and ignore is not None and (t == ignore).all():
                t = t.copy()
                t.flat[0] = 0
            g = (generic.draw_ints(draw, (bb, ss), 4, max_shape=(b, s)) / 2 if reduction == "none"
                 else np.array(draw(st.integers(-4, 4)) / 2))
            return HeadCase(tp=tp, x=x, weight=np.ascontiguousarray(w), target=t, grad_output=g)

        return draw_case()

    # -------------------------------------------------------------- rank

    def run_rank(self, ctx: RankContext, target: Target, case: HeadCase, dtype: str, options: dict) -> dict:
        import torch

        from distcheck.engine.collectives import ByteCounter
        from distcheck.engine.contracts.adapters import prepare
        from distcheck.engine.contracts.layer import torch_dtype
        from distcheck.engine.contracts.targets import resolve

        prepare(ctx, target)
        dt = torch_dtype(dtype)
        V, h = case.weight.shape
        lo, hi = split_bounds(V, case.tp, target.build["split"])[ctx.rank]
        x = torch.as_tensor(case.x, dtype=dt, device=ctx.device).clone().requires_grad_(True)
        t = torch.as_tensor(case.target, dtype=torch.long, device=ctx.device)
        g = torch.as_tensor(case.grad_output, dtype=dt, device=ctx.device)
        obj = resolve(target)
        if target.kind == "loss_parallel":
            loss, weight, forward, backward = _run_torch_recipe(ctx, obj, case, x, t, g, dt, options)
        else:
            module = obj(h, V, **target.build.get("kwargs", {})).to(device=ctx.device, dtype=dt)
            weight = _find_weight(module, target.ref)
            if tuple(weight.shape) != (hi - lo, h):
                raise AssertionError(f"rank {ctx.rank} holds a head weight of shape {tuple(weight.shape)}; its rows "
                                     f"[{lo}, {hi}) of the ({V}, {h}) head give ({hi - lo}, {h})")
            with torch.no_grad():
                weight.copy_(torch.as_tensor(case.weight[lo:hi], dtype=dt))
            with ByteCounter() as forward:
                loss = module(x, t)
            if not isinstance(loss, torch.Tensor) or loss.shape != g.shape:
                raise AssertionError(f"rank {ctx.rank}: the loss must be a tensor of shape {tuple(g.shape)} "
                                     f"(reduction={options['reduction']!r}), got {getattr(loss, 'shape', loss)!r}")
            with ByteCounter() as backward:
                torch.autograd.backward(loss, g)
        wgrad = weight.grad
        placed = None
        if wgrad is not None and hasattr(wgrad, "placements") and tuple(wgrad.placements) != tuple(weight.placements):
            placed = f"the head's gradient is placed {tuple(wgrad.placements)}, the head {tuple(weight.placements)}"
            wgrad = wgrad.redistribute(placements=weight.placements)
        if wgrad is not None and hasattr(wgrad, "to_local"):
            wgrad = wgrad.to_local()
        return {"out": _numpy(loss), "out_dtype": str(loss.dtype).removeprefix("torch."),
                "dx": None if x.grad is None else _numpy(x.grad),
                "dx_dtype": None if x.grad is None else str(x.grad.dtype).removeprefix("torch."),
                "dw": None if wgrad is None else _numpy(wgrad),
                "dw_dtype": None if wgrad is None else str(wgrad.dtype).removeprefix("torch."),
                "placed": placed, "bounds": (lo, hi),
                "forward": list(forward.records), "backward": list(backward.records)}

    # -------------------------------------------------------------- check

    def check(self, case: HeadCase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        reduction, ignore = options["reduction"], options["ignore_index"]
        logits = case.logits
        ce = CECase(tp=case.tp, logits=logits, target=case.target, grad_output=case.grad_output)
        tracked = {u: _tracked_head(case, ce, tb.UNIT_ROUNDOFF[u], reduction, ignore) for u in (dtype, "float64")}
        bound = {k: tb.final_bound(tracked[dtype][k].e, tracked["float64"][k].e) for k in ("loss", "dx", "dw")}
        loss = ref.vocab_parallel_cross_entropy(logits, case.target, case.tp, ignore_index=ignore, reduction=reduction)
        dz = ref.cross_entropy_grad(logits, case.target, case.grad_output, ignore_index=ignore, reduction=reduction)
        V, h = case.weight.shape
        dx = dz @ case.weight
        dw = dz.reshape(-1, V).T @ case.x.reshape(-1, h)
        n = len(results)
        outs = [None if r["out"] is None else np.atleast_1d(r["out"]) for r in results]
        forward = combine(compare("loss", dtype, [np.atleast_1d(loss)] * n, outs, [r["out_dtype"] for r in results],
                                  [np.atleast_1d(bound["loss"])] * n), agree("loss", outs))
        input_grad = combine(compare("input gradient", dtype, [dx] * n, [r["dx"] for r in results],
                                     [r["dx_dtype"] for r in results], [bound["dx"]] * n),
                             agree("input gradient", [r["dx"] for r in results]))
        rows = [slice(*r["bounds"]) for r in results]
        grads = compare("gradient of weight", dtype, [dw[sl] for sl in rows], [r["dw"] for r in results],
                        [r["dw_dtype"] for r in results], [bound["dw"][sl] for sl in rows])
        placed = [f"rank {i}: {r['placed']}" for i, r in enumerate(results) if r["placed"]]
        if placed:
            grads = combine(grads, Outcome(False, message="gradients are not placed as their parameters: "
                                                          + "; ".join(placed),
                                           ranks=tuple(i for i, r in enumerate(results) if r["placed"])))
        b, s = case.target.shape
        elements = int(closed_form_at("tp.vocab_cross_entropy.allreduce_elements", b=b, s=s))
        count = closed_form("tp.vocab_cross_entropy.allreduce_per_forward")
        size = ITEMSIZE[dtype]
        one = case.tp == 1
        fwd = [] if one else [(Collective.ALL_REDUCE, elements * size)] * count
        bwd = [] if one else [(Collective.ALL_REDUCE, case.x.size * size)]
        widened = {(Collective.ALL_REDUCE, elements * 4): (Collective.ALL_REDUCE, elements * size)} if size < 4 else {}
        return {
            "forward": forward,
            "input_grad": input_grad,
            "param_grads": grads,
            "collectives.forward": _compare_records(
                "forward", fwd, [r["forward"] for r in results],
                "tp=1: nothing to communicate" if one else
                f"the loss: closed form tp.vocab_cross_entropy.allreduce_per_forward = {count} of b s = {elements} "
                "values; the head: none (its logits stay split)", widened),
            "collectives.backward": _compare_records(
                "backward", bwd, [r["backward"] for r in results],
                "tp=1: nothing to communicate" if one else
                "one all-reduce of the replicated input's gradient (Megatron's f, Shoeybi et al. 2019 §3)", {}),
        }


def _find_weight(module: torch.nn.Module, shown: str) -> Any:  # a Parameter, a DTensor once parallelized
    for path in _WEIGHT_NAMES:
        try:
            return module.get_parameter(path)
        except AttributeError:
            continue
    raise ProtocolError("target", shown, f"must have the head's weight as a parameter named one of "
                                         f"{', '.join(_WEIGHT_NAMES)}")


def _run_torch_recipe(ctx: RankContext, loss_parallel: Callable[[], AbstractContextManager[Any]], case: HeadCase,
                      x: torch.Tensor, t: torch.Tensor, g: torch.Tensor, dt: torch.dtype,
                      options: dict) -> tuple[torch.Tensor, Any, Any, Any]:
    """``nn.Linear`` with ``ColwiseParallel(use_local_output=False)``, ``F.cross_entropy`` in ``loss_parallel()``."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from distcheck.engine.collectives import ByteCounter
    from distcheck.engine.contracts.layer import _mesh

    refuse_threaded(ctx)
    V, h = case.weight.shape
    head = torch.nn.Linear(h, V, bias=False).to(device=ctx.device, dtype=dt)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(case.weight, dtype=dt))
    mesh = _mesh(ctx)
    parallelize_module(head, mesh, ColwiseParallel(use_local_output=False))
    ignore = options["ignore_index"]
    tokens = int(np.prod(t.shape))
    with loss_parallel():
        with ByteCounter() as forward:
            logits = head(x)
            loss = F.cross_entropy(logits.flatten(0, 1), t.reshape(tokens), reduction=options["reduction"],
                                   ignore_index=-100 if ignore is None else ignore)
        if not isinstance(loss, DTensor):  # loss_parallel() keeps the loss of sharded logits a DTensor
            raise TypeError(f"F.cross_entropy under loss_parallel() returned a {type(loss).__name__}, not a DTensor")
        grad = DTensor.from_local(g.reshape(tokens) if options["reduction"] == "none" else g, mesh, loss.placements,
                                  run_check=False)
        with ByteCounter() as backward:
            torch.autograd.backward(loss, grad)
    return loss.to_local().reshape(g.shape), head.weight, forward, backward


def _tracked_head(case: HeadCase, ce: CECase, u: float, reduction: str, ignore: int | None) -> dict:
    """The loss, the input gradient and the head's gradient with running error bounds (logits exact)."""
    tracked = _tracked_cross_entropy(ce, u, reduction, ignore)
    dz = tracked["dz"]
    V, h = case.weight.shape
    dx = tb.matmul(dz, tb.exact(case.weight), u)
    flat = tb.Tracked(dz.v.reshape(-1, V), dz.e.reshape(-1, V))
    dw = tb.matmul(flat.T, tb.exact(case.x.reshape(-1, h)), u)
    return {"loss": tracked["loss"], "dx": dx, "dw": dw}
