"""Vocab-parallel contracts: the embedding whose table is split by vocabulary rows, and the
cross-entropy of logits split by vocabulary columns (Megatron-LM's, fairscale's, torch's
``loss_parallel``). References: :mod:`distcheck.parallel.tp.vocab`; closed forms:
:mod:`distcheck.parallel.tp.vocab_forms` (Shoeybi et al. 2019, "Megatron-LM", §3).

**vocab-parallel-embedding** (a :class:`ShardedLayerContract`). Rank r holds rows ``[lo_r, hi_r)``
of ``weight`` (num_embeddings, embedding_dim), looks up the ids in its block, zeros the others (the
mask) and all-reduces: every rank must hold ``weight[ids]``. Properties: ``forward``, ``param_grads``
(rank r's rows of the table's gradient), ``collectives.forward`` (one all-reduce of the b s d
output, ``tp.vocab_embedding.allreduce_per_forward``), ``collectives.backward`` (none). The ids are
integers, so there is no input gradient and no ``input_grad`` property. Targets: a module class
``cls(num_embeddings, embedding_dim)`` (fairscale's ``VocabParallelEmbedding``, Megatron's layout),
a factory, or torch's ``RowwiseParallel`` (applied to an ``nn.Embedding``: the table is sharded on
dim 0 and the output all-reduced). **Bitwise**: a lookup copies, and the all-reduce adds one
nonzero value to zeros; the table's gradient sums at most b s integer entries of the output
gradient, bounded by ``max_exact_int(b s, factors=1)``.

**vocab-parallel-cross-entropy** (a :class:`Contract`). Every rank receives its own block of vocab
columns of the logits ``z`` (b, s, vocab_size) and all the targets (b, s); it must return the loss
(per token for ``reduction="none"``, Megatron's and fairscale's convention; a scalar for ``"mean"``
and ``"sum"``), the same on every rank, and the gradient of its own logit columns. Properties:
``forward``, ``input_grad`` (the logits' gradient), ``collectives.forward`` (three all-reduces of b s
values: max, target logit, sum of exponentials, ``tp.vocab_cross_entropy.allreduce_per_forward``; an
implementation may all-reduce them in float32 when the dtype is narrower, as torch's
``loss_parallel`` does for bfloat16), ``collectives.backward`` (none). Targets:

* a function ``fn(logits_shard, target) -> loss`` (fairscale's and Megatron-LM's
  ``vocab_parallel_cross_entropy``), or a module class built as ``cls(**kwargs)`` and called the
  same way; it implements the contract's ``reduction`` and ``ignore_index`` itself;
* torch's ``torch.distributed.tensor.parallel:loss_parallel``: the rank's block becomes a DTensor
  sharded on the class dim, as a ``ColwiseParallel(use_local_output=False)`` lm head leaves it
  (``DTensor.from_local(block, mesh, [Shard(1)])`` on the (b s, vocab_size) logits), and
  ``F.cross_entropy(..., reduction, ignore_index)`` runs, forward and backward, inside
  ``loss_parallel()``.

**Bounded**, the bound derived as for attention (:mod:`distcheck.engine.contracts.bounds`; Higham,
*Accuracy and Stability of Numerical Algorithms*, §3.1, Lemma 3.1, §3.3). Logits are multiples of
1/2 in [-2, 2] and output gradients multiples of 1/2 in [-2, 2]: exact in every format. The model:
the row max is exact (a max of exact values); ``z - m`` rounds once; ``exp`` within 2u; the sum of
exponentials, local then all-reduced, is a sum of vocab_size terms in any order
(``gamma_{n-1+EXTRA}``); ``log`` perturbs by ``e / lb`` (lb = the sum's lower bound) and rounds
within 2u; the loss ``log S - (z_t - m)`` rounds once, plus one cast (torch computes the log-softmax
of a bfloat16 input in float32 and casts it); the target-logit all-reduce adds one value to zeros
(exact); ``mean`` sums the tokens in any order and divides by their exact count. The gradient
``(p - onehot) g`` (``g / count`` for ``mean``) is bounded for both ways of forming the softmax:
``exp(z - m) / S`` (Megatron-LM, fairscale) and ``exp(log_softmax)`` (torch's log-softmax
backward); the bound is the larger of the two, entry by entry. Ignored tokens have loss and
gradient exactly 0. The result in the dtype is held to ``(e(u) + e(2**-53)) (1 + 2**-30)`` from the
float64 reference, u = 2**-53, 2**-24, 2**-8 (bfloat16).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distcheck.core.vocab import Collective
from distcheck.engine import strategies as generic
from distcheck.engine.contracts import bounds as tb
from distcheck.engine.contracts.checks import (
    agree,
    combine,
    compare,
    format_collectives,
)
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.layer import (
    SPLITS,
    LayerCase,
    ParamSpec,
    check_constructor,
    split_bounds,
)
from distcheck.engine.contracts.sharded import (
    COMMON_OPTIONS,
    ITEMSIZE,
    PROPERTIES,
    ShardedLayerContract,
    TPCase,
    closed_form,
    magnitude,
)
from distcheck.engine.contracts.targets import Target, check_call_shape, make_target
from distcheck.engine.world import RankContext
from distcheck.parallel.tp import vocab as ref

if TYPE_CHECKING:
    import torch

__all__ = ["VocabParallelEmbedding", "VocabParallelCrossEntropy", "CECase"]

# ------------------------------------------------------------------------------------- embedding

_EMBEDDING_NAMES = ("weight", "embedding.weight", "word_embeddings.weight", "embed_tokens.weight", "wte.weight")


class VocabParallelEmbedding(ShardedLayerContract):
    """The embedding table split by vocabulary rows, masked lookups summed (see the module doc)."""

    name = "vocab-parallel-embedding"
    summary = "table split by vocabulary rows; masked lookup on each rank, one all-reduce forward, none backward"
    ctor_fields = ("num_embeddings", "embedding_dim")
    accepts_style = True
    has_bias_kwarg = False
    reference_module = "embedding"
    properties = tuple(p for p in PROPERTIES if p.name not in ("input_grad", "collectives.backward")) + (
        PropertySpec("collectives.backward", "one backward issues no collective (the ids have no gradient, the "
                                             "table's gradient is local)", "exact"),)
    options = COMMON_OPTIONS

    def specs(self) -> tuple[ParamSpec, ...]:
        return (ParamSpec("weight", 0, _EMBEDDING_NAMES),)

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[TPCase]:
        tp, b, s = world_size, 2, 3
        grad_bound = magnitude(b * s, 1, dtype)  # a table row's gradient sums at most b s output-gradient entries
        most = max(8, 2 * tp)

        @st.composite
        def draw_case(draw: st.DrawFn) -> TPCase:
            if options["divisible"]:
                V = tp * draw(st.integers(1, max(1, most // tp)))
            else:
                V = draw(st.integers(tp, most + 1))
            d = draw(st.integers(1, 3))
            bb, ss = draw(st.integers(1, b)), draw(st.integers(1, s))
            ids = draw(hnp.arrays(np.int64, (bb, ss), elements=st.integers(0, V - 1)))
            W = generic.draw_ints(draw, (V, d), generic.MAGNITUDE_CAP, max_shape=(most + 1, 3))
            g = generic.draw_ints(draw, (bb, ss, d), grad_bound, max_shape=(b, s, 3))
            return TPCase(tp=tp, x=ids, params={"weight": W}, grad_output=g,
                          dims={"num_embeddings": V, "embedding_dim": d})

        return draw_case()

    def layer_case(self, case: TPCase, options: dict) -> LayerCase:
        return LayerCase(tp=case.tp, x=case.x, g=case.grad_output, params=case.params, specs=self.specs(),
                         ctor_args=(case.dims["num_embeddings"], case.dims["embedding_dim"]), dims=case.dims,
                         reference="embedding", x_is_index=True)

    def reference(self, case: TPCase, dtype: str, options: dict) -> dict:
        W, ids, g = case.params["weight"], case.x, case.grad_output
        return {"out": ref.vocab_parallel_embedding(ids, W, case.tp), "dx": None,
                "grads": {"weight": ref.embedding_weight_grad(ids, g, W.shape[0])}}

    def expected_collectives(self, case: TPCase, options: dict, dtype: str) -> tuple[list, list, str, str]:
        b, s = case.x.shape
        elements = int(closed_form_at("tp.vocab_embedding.allreduce_elements", b=b, s=s,
                                      h=case.dims["embedding_dim"]))
        count = closed_form("tp.vocab_embedding.allreduce_per_forward")
        return ([(Collective.ALL_REDUCE, elements * ITEMSIZE[dtype])] * count, [],
                f"closed form tp.vocab_embedding.allreduce_per_forward = {count} of b s h = {elements} elements",
                "none: the ids have no gradient and the table's gradient is local")


def closed_form_at(name: str, **inputs: int) -> Any:
    from distcheck.engine.catalogue import get

    return get(name).evaluate(**inputs)


# ------------------------------------------------------------------------------------- cross-entropy

CE_PROPERTIES = (
    PropertySpec("forward", "every rank's loss is within the derived bound of the reference, the same bits on every "
                            "rank", "bounded"),
    PropertySpec("input_grad", "every rank's gradient of its own logit columns is within the derived bound of the "
                               "reference's", "bounded"),
    PropertySpec("collectives.forward", "one forward issues the three all-reduces of b s values of the closed form "
                                        "(max, target logit, sum of exponentials)", "exact"),
    PropertySpec("collectives.backward", "one backward issues no collective (each rank's gradient is local)", "exact"),
)


@dataclass(frozen=True)
class CECase:
    """One example: ``tp``, the full ``logits`` (b, s, vocab_size), the ``target`` ids (b, s) and the
    output gradient (b, s) for ``reduction="none"``, else a scalar."""

    tp: int
    logits: np.ndarray
    target: np.ndarray
    grad_output: np.ndarray

    def __repr__(self) -> str:
        return (f"CECase(tp={self.tp}, logits={self.logits.tolist()}, target={self.target.tolist()}, "
                f"grad_output={self.grad_output.tolist()})")


class VocabParallelCrossEntropy(Contract):
    """The cross-entropy of vocab-parallel logits (see the module doc); bounded regime."""

    name = "vocab-parallel-cross-entropy"
    min_world_size = 2
    min_world_reason = ("one rank holds the whole vocabulary: the all-reduces of the max, the sum and the target's "
                        "logit are identities, so a missing or wrong one gives the reference's loss there")
    parallelism = "tp"
    summary = ("logits split by vocabulary columns: max, target logit and sum of exponentials all-reduced; "
               "the gradient local")
    properties = CE_PROPERTIES
    options = (
        Option("divisible", True, bool, "draw only vocabulary sizes that tp divides (Megatron and fairscale "
                                        "require it)"),
        Option("split", "array_split", str, "how the vocabulary is cut when tp does not divide it: numpy.array_split "
                                            "or chunk (torch.chunk; DTensor's)", SPLITS),
        Option("reduction", "none", str, "the loss per token (none, Megatron's and fairscale's) or reduced over "
                                         "the tokens (mean over those not ignored, sum)", ref.REDUCTIONS),
        Option("ignore_index", None, int, "a target id whose tokens have loss 0 and gradient 0 (torch's convention, "
                                          "-100; none by default: Megatron and fairscale have none)",
               min_value=-(2**63), max_value=2**63 - 1),  # a torch int64 target id
        Option("kwargs", {}, dict, "keyword arguments of a module class's constructor"),
    )

    # -------------------------------------------------------------- protocol

    def resolve(self, obj: Any, ref_name: str | None, options: dict) -> tuple[Target, dict]:

        import torch
        from torch.distributed.tensor.parallel import loss_parallel

        shown = ref_name or repr(obj)
        build = {"split": options["split"], "kwargs": dict(options["kwargs"])}
        if obj is loss_parallel:
            return make_target(obj, ref_name, "loss_parallel", **dict(build, split="chunk")), dict(options,
                                                                                                  split="chunk")
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            check_constructor(obj, (), build["kwargs"], f"{obj.__name__}(**kwargs)")
            return make_target(obj, ref_name, "module", **build), options
        if callable(obj) and not isinstance(obj, type):
            check_call_shape(obj, shown, "must take (logits_shard, target) when it is a loss function")
            return make_target(obj, ref_name, "function", **build), options
        raise ProtocolError("target", shown, "must be a loss function fn(logits_shard, target), a torch.nn.Module "
                                             "class called the same way, or torch.distributed.tensor.parallel:"
                                             f"loss_parallel for contract {self.name}")

    # -------------------------------------------------------------- cases

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[CECase]:
        tp, b, s = world_size, 2, 3
        most = max(8, 2 * tp)
        reduction, ignore = options["reduction"], options["ignore_index"]

        @st.composite
        def draw_case(draw: st.DrawFn) -> CECase:
            if options["divisible"]:
                V = tp * draw(st.integers(1, max(1, most // tp)))
            else:
                V = draw(st.integers(tp, most + 1))
            bb, ss = draw(st.integers(1, b)), draw(st.integers(1, s))
            z = generic.draw_ints(draw, (bb, ss, V), 4, max_shape=(b, s, most + 1)) / 2
            ids = st.integers(0, V - 1) if ignore is None else st.one_of(st.integers(0, V - 1), st.just(ignore))
            t = draw(hnp.arrays(np.int64, (bb, ss), elements=ids))
            if reduction == "mean" and ignore is not None and (t == ignore).all():
                t = t.copy()
                t.flat[0] = 0  # the mean needs one token that counts
            if reduction == "none":
                g = generic.draw_ints(draw, (bb, ss), 4, max_shape=(b, s)) / 2
            else:
                g = np.array(draw(st.integers(-4, 4)) / 2)
            return CECase(tp=tp, logits=np.ascontiguousarray(z), target=t, grad_output=g)

        return draw_case()

    # -------------------------------------------------------------- rank

    def run_rank(self, ctx: RankContext, target: Target, case: CECase, dtype: str, options: dict) -> dict:
        import torch

        from distcheck.engine.collectives import ByteCounter
        from distcheck.engine.contracts.adapters import prepare
        from distcheck.engine.contracts.layer import torch_dtype
        from distcheck.engine.contracts.targets import resolve

        prepare(ctx, target)
        dt = torch_dtype(dtype)
        V = case.logits.shape[-1]
        lo, hi = split_bounds(V, case.tp, target.build.get("split", "array_split"))[ctx.rank]
        z = torch.as_tensor(case.logits[..., lo:hi], dtype=dt, device=ctx.device).clone().requires_grad_(True)
        t = torch.as_tensor(case.target, dtype=torch.long, device=ctx.device)
        g = torch.as_tensor(case.grad_output, dtype=dt, device=ctx.device)
        obj = resolve(target)
        if target.kind == "loss_parallel":
            loss, forward, backward = _run_loss_parallel(ctx, obj, z, t, g, V, options)
        else:
            fn = obj(**target.build.get("kwargs", {})).to(ctx.device) if target.kind == "module" else obj
            with ByteCounter() as forward:
                loss = fn(z, t)
            if not isinstance(loss, torch.Tensor):
                raise ProtocolError("target", target.ref,
                                    f"must return the loss as a tensor, got {type(loss).__name__}")
            if loss.shape != g.shape:
                raise AssertionError(f"rank {ctx.rank}: loss shape {tuple(loss.shape)}, expected {tuple(g.shape)} "
                                     f"(reduction={options['reduction']!r})")
            with ByteCounter() as backward:
                torch.autograd.backward(loss, g)
        return {"out": _numpy(loss), "out_dtype": str(loss.dtype).removeprefix("torch."),
                "dx": None if z.grad is None else _numpy(z.grad),
                "dx_dtype": None if z.grad is None else str(z.grad.dtype).removeprefix("torch."),
                "bounds": (lo, hi), "forward": list(forward.records), "backward": list(backward.records)}

    # -------------------------------------------------------------- check

    def check(self, case: CECase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        reduction, ignore = options["reduction"], options["ignore_index"]
        low = _tracked_cross_entropy(case, tb.UNIT_ROUNDOFF[dtype], reduction, ignore)
        exact = _tracked_cross_entropy(case, tb.UNIT_ROUNDOFF["float64"], reduction, ignore)
        loss_bound = tb.final_bound(low["loss"].e, exact["loss"].e)
        dz_bound = tb.final_bound(low["dz"].e, exact["dz"].e)
        n = len(results)
        loss = ref.vocab_parallel_cross_entropy(case.logits, case.target, case.tp, ignore_index=ignore,
                                                reduction=reduction)
        dz = ref.cross_entropy_grad(case.logits, case.target, case.grad_output, ignore_index=ignore,
                                    reduction=reduction)
        outs = [None if r["out"] is None else np.atleast_1d(r["out"]) for r in results]  # a reduced loss is 0-d
        forward = combine(
            compare("loss", dtype, [np.atleast_1d(loss)] * n, outs, [r["out_dtype"] for r in results],
                    [np.atleast_1d(loss_bound)] * n),
            agree("loss", outs))
        blocks = [slice(*r["bounds"]) for r in results]
        input_grad = compare("logits gradient", dtype, [dz[..., sl] for sl in blocks],
                             [r["dx"] for r in results], [r["dx_dtype"] for r in results],
                             [dz_bound[..., sl] for sl in blocks])
        b, s = case.target.shape
        elements = int(closed_form_at("tp.vocab_cross_entropy.allreduce_elements", b=b, s=s))
        count = closed_form("tp.vocab_cross_entropy.allreduce_per_forward")
        fwd = [] if case.tp == 1 else [(Collective.ALL_REDUCE, elements * ITEMSIZE[dtype])] * count
        source = ("tp=1: nothing to communicate" if case.tp == 1 else
                  f"closed form tp.vocab_cross_entropy.allreduce_per_forward = {count} of b s = {elements} values"
                  + (", each in the dtype or in float32" if ITEMSIZE[dtype] < 4 else ""))
        widened = {(Collective.ALL_REDUCE, elements * 4): (Collective.ALL_REDUCE, elements * ITEMSIZE[dtype])}
        return {
            "forward": forward,
            "input_grad": input_grad,
            "collectives.forward": _compare_records("forward", fwd, [r["forward"] for r in results], source,
                                                    widened if ITEMSIZE[dtype] < 4 else {}),
            "collectives.backward": _compare_records("backward", [], [r["backward"] for r in results],
                                                     "none: each rank's gradient is local", {}),
        }


def _compare_records(phase: str, expected: Sequence[tuple[str, int]], got_per_rank: Sequence[Sequence[tuple[str, int]]],
                     source: str, equivalent: dict) -> Outcome:
    """Every rank's records against ``expected`` (multisets), records in ``equivalent`` counted as their
    image (an all-reduce of float32 statistics for a bfloat16 input)."""
    want = sorted(expected)
    bad = [(r, recs) for r, recs in enumerate(got_per_rank)
           if sorted(equivalent.get(tuple(rec), tuple(rec)) for rec in recs) != want]
    if not bad:
        return Outcome(True, max_error=0.0, bound=0.0)
    lines = [f"rank {r}: {format_collectives(recs)}" for r, recs in bad]
    return Outcome(False, bound=0.0, ranks=tuple(r for r, _ in bad),
                   message=f"{phase} collectives differ from {format_collectives(want)} ({source}): "
                           + "; ".join(lines))


def _numpy(t: torch.Tensor) -> np.ndarray:
    import torch

    return t.detach().to(torch.float64).cpu().numpy()


def refuse_threaded(ctx: RankContext) -> None:
    """``loss_parallel()`` installs DTensor op handlers for the whole process and removes them on exit:
    ranks that are threads of one process (the threaded backend) race on them (a rank's exit removes
    another's handlers: a KeyError, or a rank that never issues its all-reduce). Refused as bad input."""
    if getattr(ctx, "backend", "") == "threaded":
        raise ProtocolError("target", "torch.distributed.tensor.parallel:loss_parallel",
                            "installs process-global DTensor op handlers, which ranks that are threads of one process "
                            "race on; use a process backend (--backend gloo or nccl), not threaded")


def _run_loss_parallel(ctx: RankContext, loss_parallel: Callable[[], AbstractContextManager[Any]], z: torch.Tensor,
                       t: torch.Tensor, g: torch.Tensor, vocab_size: int, options: dict) -> tuple[torch.Tensor, Any,
                       Any]:
    """torch's recipe: the logits block as a class-dim-sharded DTensor (what ColwiseParallel with
    ``use_local_output=False`` produces), ``F.cross_entropy`` forward and backward inside ``loss_parallel()``."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Shard

    from distcheck.engine.collectives import ByteCounter
    from distcheck.engine.contracts.layer import _mesh

    refuse_threaded(ctx)
    mesh = _mesh(ctx)
    tokens = int(np.prod(t.shape))
    ignore = options["ignore_index"]
    with loss_parallel():
        with ByteCounter() as forward:
            local = z.reshape(tokens, z.shape[-1])
            logits = DTensor.from_local(local, mesh, [Shard(1)], run_check=False,
                                        shape=torch.Size((tokens, vocab_size)), stride=(vocab_size, 1))
            loss = F.cross_entropy(logits, t.reshape(tokens), reduction=options["reduction"],
                                   ignore_index=-100 if ignore is None else ignore)
        grad = g.reshape(tokens) if options["reduction"] == "none" else g
        grad = DTensor.from_local(grad, mesh, loss.placements, run_check=False)  # type: ignore[attr-defined]
        with ByteCounter() as backward:
            torch.autograd.backward(loss, grad)
    out = loss.to_local() if hasattr(loss, "to_local") else loss
    return out.reshape(g.shape), forward, backward


# ------------------------------------------------------------------------------------- the bound


def _log(a: tb.Tracked, u: float) -> tb.Tracked:
    """Elementwise natural log of a positive quantity: perturbation ``e / lb`` plus a rounding within 2u of
    the result (lb, ub = |v| -+ 2e bound the exact and the computed argument); infinite when lb <= 0."""
    lb, ub = a.v - 2 * a.e, a.v + 2 * a.e
    with np.errstate(divide="ignore", invalid="ignore"):
        top = np.maximum(np.abs(np.log(np.where(lb > 0, lb, 1.0))), np.abs(np.log(ub)))
        e = np.where(lb > 0, a.e / np.where(lb > 0, lb, 1.0) + 2 * u * top, np.inf)
    return tb.Tracked(np.log(a.v), e)


def _round(a: tb.Tracked, u: float) -> tb.Tracked:
    """One more rounding of a computed value (a cast to the storage format)."""
    return tb.Tracked(a.v, a.e + u * (np.abs(a.v) + a.e))


def _tracked_cross_entropy(case: CECase, u: float, reduction: str, ignore: int | None) -> dict:
    """Loss and logits gradient with running error bounds (see the module doc)."""
    z = tb.exact(case.logits)
    valid = np.ones(case.target.shape, dtype=bool) if ignore is None else case.target != ignore
    t = np.where(valid, case.target, 0)
    m = tb.rowmax(z)
    shifted = tb.sub(z, m, u)
    ex = tb.exp(shifted, u)
    total = tb.rowsum(ex, u)
    lse = _log(total, u)
    picked = tb.Tracked(np.take_along_axis(shifted.v, t[..., None], axis=-1),
                        np.take_along_axis(shifted.e, t[..., None], axis=-1))
    per_token = _round(tb.sub(lse, picked, u), u)
    keep = valid[..., None]
    per_token = tb.Tracked(np.where(keep, per_token.v, 0.0)[..., 0], np.where(keep, per_token.e, 0.0)[..., 0])
    g = tb.exact(np.broadcast_to(case.grad_output, case.target.shape))
    count = int(valid.sum())
    if reduction == "none":
        loss = per_token
    else:
        flat = tb.rowsum(tb.Tracked(per_token.v.reshape(1, -1), per_token.e.reshape(1, -1)), u)
        loss = tb.Tracked(flat.v.reshape(()), flat.e.reshape(()))
        if reduction == "mean":
            loss = tb.div(loss, tb.exact(np.float64(count)), u)
            g = tb.div(g, tb.exact(np.float64(count)), u)
    onehot = np.zeros_like(z.v)
    np.put_along_axis(onehot, t[..., None], 1.0, axis=-1)
    p_divided = tb.div(ex, total, u)                                      # exp(z - m) / S
    p_from_log = tb.exp(_round(tb.sub(shifted, lse, u), u), u)            # exp(log_softmax)
    g_col = tb.Tracked(g.v[..., None], g.e[..., None])
    grads = [tb.mul(tb.sub(p, tb.exact(onehot), u), g_col, u) for p in (p_divided, p_from_log)]
    dz = tb.Tracked(np.where(keep, grads[0].v, 0.0), np.where(keep, np.maximum(grads[0].e, grads[1].e), 0.0))
    return {"loss": loss, "dz": dz}

