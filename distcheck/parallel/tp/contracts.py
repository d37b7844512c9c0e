"""Tensor-parallel contracts: column-parallel linear, row-parallel linear, the Megatron MLP and
grouped-query attention split by heads.

Layouts (Shoeybi et al. 2019, "Megatron-LM", §3, Fig. 3; the lesson "Scaling and distributed
training", "Tensor parallelism: columns and rows"), weights in torch's layout (out, in):

* **column-parallel linear** ``y = x W^T + b``: rank r holds rows r of ``weight`` (dim 0) and of
  ``bias``. With ``gather_output`` the output is all-gathered (every rank holds all of y), else
  rank r keeps its own columns of y. The input is replicated, so its gradient is all-reduced in
  the backward (Megatron's operator f: identity forward, all-reduce backward).
* **row-parallel linear**: rank r holds columns r of ``weight`` (dim 1); the partial products are
  all-reduced and the bias, replicated, is added ONCE. With ``input_is_parallel`` rank r receives
  only its columns of x; otherwise it receives all of x, takes its columns, and the backward
  all-gathers the input gradient.
* **MLP** ``down(relu(up(x)))``: ``up`` column-parallel without gather, ``down`` row-parallel with
  its input already split: one all-reduce forward (``tp.mlp.allreduce_per_forward``) and one
  backward (f and g are conjugate, §3). DTensor's ``RowwiseParallel`` adds the replicated bias
  as ``b / tp`` on every rank before the all-reduce (option ``partial_bias``, set for a torch
  plan), exact only when tp is a power of two; otherwise the output is held to a derived bound.
* **attention** (grouped-query when num_kv_heads < num_heads): ``q_proj``, ``k_proj``, ``v_proj``
  split by whole heads (dim 0; tp divides num_kv_heads), ``o_proj`` row-parallel (dim 1); one
  all-reduce forward (``tp.attention.allreduce_per_forward``) and one backward.

At tp = 1 no collective is expected (Megatron, fairscale and DTensor all skip them).

Exactness. The linear layers and the MLP are **bitwise**: inputs, weights, biases and the output
gradient are integers bounded so that every partial sum of the forward and of the backward stays
below 2**p in magnitude (p = 53, 24, 8 for float64, float32, bfloat16;
``distcheck.core.exactness.max_exact_int``), so every summation order gives the exact result. For
linears, the longest sums are ``in_features + 1`` products of two entries (the output), for the
MLP ``ffn (hidden + 1) + 1`` products of three. Attention has a softmax, so it is **bounded**:
inputs are exact multiples of 1/4 (x) and 1/8 (weights) and each result is held to the running error bound of
:mod:`distcheck.engine.contracts.bounds` for the dtype's unit roundoff (2**-53, 2**-24, 2**-8 for
bfloat16), plus the float64 reference's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

from distcheck.core.vocab import Collective
from distcheck.engine.contracts import bounds as tb
from distcheck.engine.contracts.contract import Option, PropertySpec
from distcheck.engine.contracts.layer import LayerCase, ParamSpec
from distcheck.engine.contracts.sharded import (
    COMMON_OPTIONS,
    ITEMSIZE,
    PROPERTIES,
    ShardedLayerContract,
    TPCase,
    check_exact,
    closed_form,
    integer_arrays,
    magnitude,
)
from distcheck.engine.contracts.targets import Target
from distcheck.parallel.tp import strategies as ds

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "TensorParallelAttention"]

# ------------------------------------------------------------------------------------- linears


def _linear_cases(tp: int, dtype: str, options: dict) -> st.SearchStrategy[TPCase] | None:
    width = max(8, 2 * tp)
    batch = 4
    bound = magnitude(max(width + 1, batch), 2, dtype)
    if bound < 1:
        return None

    @st.composite
    def draw_case(draw: st.DrawFn) -> TPCase:
        lin = draw(ds.linear_cases(min_tp=tp, max_tp=tp, max_features=width, max_batch=batch,
                                   divisible=True if options["divisible"] else None, max_magnitude=bound))
        params = {"weight": np.ascontiguousarray(lin.W.T)}
        if lin.b is not None:
            params["bias"] = lin.b
        g = integer_arrays(draw, (lin.x.shape[0], lin.W.shape[1]), bound)
        return TPCase(tp=tp, x=lin.x, params=params, grad_output=g,
                      dims={"in_features": lin.W.shape[0], "out_features": lin.W.shape[1]})

    return draw_case()


def _linear_reference(case: TPCase, sharded: str, dtype: str) -> dict:
    from distcheck.parallel.tp import reference as ref

    W, b, x, g = case.params["weight"], case.params.get("bias"), case.x, case.grad_output
    bias = [] if b is None else [(b,)]
    check_exact(dtype, [(x, W.T), *bias], [(g, W)], [(g.T, x)], [(g.T, np.ones((g.shape[0], 1)))])
    fn = ref.column_parallel if sharded == "column" else ref.row_parallel
    out = fn(x, W.T, case.tp, b)
    grads = {"weight": g.T @ x}
    if b is not None:
        grads["bias"] = g.sum(axis=0)
    return {"out": out, "dx": g @ W, "grads": grads}


class ColumnParallelLinear(ShardedLayerContract):
    """Column-parallel linear ``y = x W^T + b`` (see the module doc)."""

    name = "column-parallel-linear"
    summary = "weight and bias split by output rows; output all-gathered with gather_output; input gradient all-reduced"
    ctor_fields = ("in_features", "out_features")
    behaviour = ("gather_output",)
    accepts_style = True
    options = COMMON_OPTIONS + (Option("gather_output", True, bool, "the layer all-gathers its output "
                                                                    "(False: each rank keeps its own output columns)"),)

    def specs(self) -> tuple[ParamSpec, ...]:
        return (ParamSpec("weight", 0, ("weight",)), ParamSpec("bias", 0, ("bias",)))

    def style_options(self, style: Any, options: dict) -> dict:
        from torch.distributed.tensor import Replicate

        style = style() if isinstance(style, type) else style
        layouts = getattr(style, "output_layouts", None) or (None,)
        return dict(options, gather_output=isinstance(layouts[0], Replicate))

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[TPCase] | None:
        return _linear_cases(world_size, dtype, options)

    def layer_case(self, case: TPCase, options: dict) -> LayerCase:
        return LayerCase(tp=case.tp, x=case.x, g=case.grad_output, params=case.params, specs=self.specs(),
                         output_shard=None if options["gather_output"] else "weight",
                         ctor_args=(case.dims["in_features"], case.dims["out_features"]), dims=case.dims)

    def reference(self, case: TPCase, dtype: str, options: dict) -> dict:
        return _linear_reference(case, "column", dtype)

    def expected_collectives(self, case: TPCase, options: dict, dtype: str) -> tuple[list, list, str, str]:
        b, size = case.x.shape[0], ITEMSIZE[dtype]
        fwd = [(Collective.ALL_GATHER, b * case.dims["out_features"] * size)] if options["gather_output"] else []
        return (fwd, [(Collective.ALL_REDUCE, b * case.dims["in_features"] * size)],
                "gather_output: one all-gather of the output" if fwd else "no gather: none",
                "the replicated input's gradient: one all-reduce (Megatron's f, Shoeybi et al. 2019 §3)")

    def gathered_dims(self, case: TPCase, options: dict, dtype: str) -> tuple[tuple[int, int], ...]:
        return ((case.dims["out_features"], case.x.shape[0] * ITEMSIZE[dtype]),) if options["gather_output"] else ()


class RowParallelLinear(ShardedLayerContract):
    """Row-parallel linear: partial products all-reduced, the bias added once (see the module doc)."""

    name = "row-parallel-linear"
    summary = "weight split by input columns; one all-reduce of the partial outputs; bias added once"
    ctor_fields = ("in_features", "out_features")
    behaviour = ("input_is_parallel",)
    accepts_style = True
    options = COMMON_OPTIONS + (Option("input_is_parallel", False, bool,
                                       "the layer receives only its own input columns (False: all of x, split by "
                                       "the layer)"),)

    def specs(self) -> tuple[ParamSpec, ...]:
        return (ParamSpec("weight", 1, ("weight",)), ParamSpec("bias", None, ("bias",)))

    def style_options(self, style: Any, options: dict) -> dict:
        from torch.distributed.tensor import Shard

        style = style() if isinstance(style, type) else style
        layouts = getattr(style, "input_layouts", None) or (None,)
        return dict(options, input_is_parallel=isinstance(layouts[0], Shard))

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[TPCase] | None:
        return _linear_cases(world_size, dtype, options)

    def layer_case(self, case: TPCase, options: dict) -> LayerCase:
        return LayerCase(tp=case.tp, x=case.x, g=case.grad_output, params=case.params, specs=self.specs(),
                         input_shard="weight" if options["input_is_parallel"] else None,
                         ctor_args=(case.dims["in_features"], case.dims["out_features"]), dims=case.dims)

    def reference(self, case: TPCase, dtype: str, options: dict) -> dict:
        return _linear_reference(case, "row", dtype)

    def expected_collectives(self, case: TPCase, options: dict, dtype: str) -> tuple[list, list, str, str]:
        b, size = case.x.shape[0], ITEMSIZE[dtype]
        count = closed_form("tp.row.allreduce_count")
        bwd = [] if options["input_is_parallel"] else [(Collective.ALL_GATHER, b * case.dims["in_features"] * size)]
        return ([(Collective.ALL_REDUCE, b * case.dims["out_features"] * size)] * count,
                bwd, f"closed form tp.row.allreduce_count = {count}",
                "input_is_parallel: none" if not bwd else "the split input's gradient: one all-gather")

    def gathered_dims(self, case: TPCase, options: dict, dtype: str) -> tuple[tuple[int, int], ...]:
        return () if options["input_is_parallel"] else ((case.dims["in_features"], case.x.shape[0] * ITEMSIZE[dtype]),)


# ------------------------------------------------------------------------------------- MLP

_UP = ("up", "fc1", "dense_h_to_4h", "linear_fc1", "w1", "up_proj", "c_fc")
_DOWN = ("down", "fc2", "dense_4h_to_h", "linear_fc2", "w2", "down_proj", "c_proj")


class TensorParallelMLP(ShardedLayerContract):
    """Megatron's MLP ``down(relu(up(x)))`` with one all-reduce each way (see the module doc)."""

    name = "tensor-parallel-mlp"
    summary = "up column-parallel, ReLU on each shard, down row-parallel: one all-reduce forward, one backward"
    ctor_fields = ("hidden_size", "ffn_hidden_size")
    accepts_plan = True
    reference_module = "mlp"
    options = COMMON_OPTIONS + (Option("partial_bias", False, bool, "down's replicated bias is added as b / tp on "
                                       "every rank before the all-reduce (DTensor's Partial placement, on by itself "
                                       "for a torch plan); b / tp rounds unless tp is a power of two, so the output "
                                       "is then held to a derived bound"),)

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        target, options = super().resolve(obj, ref, options)
        return target, (dict(options, partial_bias=True) if target.kind == "plan" else options)

    def specs(self) -> tuple[ParamSpec, ...]:
        return (ParamSpec("up.weight", 0, tuple(f"{n}.weight" for n in _UP)),
                ParamSpec("up.bias", 0, tuple(f"{n}.bias" for n in _UP)),
                ParamSpec("down.weight", 1, tuple(f"{n}.weight" for n in _DOWN)),
                ParamSpec("down.bias", None, tuple(f"{n}.bias" for n in _DOWN)))

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[TPCase] | None:
        tp, F, B = world_size, max(8, 2 * world_size), 3
        for H in (6, 2):  # hidden 6, or 2 when the format is too narrow for 6
            bound = magnitude(max(F * (H + 1) + 1, B * (H + 1), F * H), 3, dtype)
            if bound >= 1:
                break
        else:
            return None

        @st.composite
        def draw_case(draw: st.DrawFn) -> TPCase:
            m = draw(ds.mlp_cases(min_tp=tp, max_tp=tp, max_batch=B, max_hidden=H, max_ffn=F,
                                  divisible=True if options["divisible"] else None, max_magnitude=bound))
            params = {"up.weight": np.ascontiguousarray(m.W_up.T)}
            if m.b_down is not None:
                params["up.bias"] = integer_arrays(draw, (m.W_up.shape[1],), bound)
            params["down.weight"] = np.ascontiguousarray(m.W_down.T)
            if m.b_down is not None:
                params["down.bias"] = m.b_down
            g = integer_arrays(draw, m.x.shape, bound)
            return TPCase(tp=tp, x=m.x, params=params, grad_output=g,
                          dims={"hidden_size": m.x.shape[1], "ffn_hidden_size": m.W_up.shape[1]})

        return draw_case()

    def layer_case(self, case: TPCase, options: dict) -> LayerCase:
        return LayerCase(tp=case.tp, x=case.x, g=case.grad_output, params=case.params, specs=self.specs(),
                         ctor_args=(case.dims["hidden_size"], case.dims["ffn_hidden_size"]), dims=case.dims,
                         reference="mlp")

    def reference(self, case: TPCase, dtype: str, options: dict) -> dict:
        from distcheck.parallel.tp import reference as ref

        p, x, g = case.params, case.x, case.grad_output
        W1, W2, b1, b2 = p["up.weight"], p["down.weight"], p.get("up.bias"), p.get("down.bias")
        ones = np.ones((1, x.shape[0]))  # a sum over the batch
        b_up = [] if b1 is None else [(b1,)]
        check_exact(dtype,
                    [(x, W1.T), *b_up],                                                      # h = x W1^T + b1
                    [(x, W1.T, W2.T)] + ([] if b1 is None else [(b1, W2.T)]) + ([] if b2 is None else [(b2,)]),
                    [(g, W2)], [(ones, g, W2)],                                              # dh, db1
                    [(x.T, g, W2)],                                                          # dW1 (transposed)
                    [(g.T, x, W1.T)] + ([] if b1 is None else [(g.T, ones.T, b1[None])]),    # dW2 = g^T relu(h)
                    [(g, W2, W1)])                                                           # dx
        out = ref.megatron_mlp(x, W1.T, W2.T, case.tp, "relu", b1, b2)
        h = x @ W1.T + (0 if b1 is None else b1)
        a = np.maximum(h, 0)
        dh = (g @ W2) * (h > 0)  # torch's ReLU gradient is 0 at 0
        grads = {"up.weight": dh.T @ x, "down.weight": g.T @ a}
        if b1 is not None:
            grads["up.bias"], grads["down.bias"] = dh.sum(axis=0), g.sum(axis=0)
        out_ref = {"out": out, "dx": dh @ W1, "grads": grads}
        tp = case.tp
        if options["partial_bias"] and b2 is not None and tp & (tp - 1):
            out_ref["bounds"] = {"out": _partial_bias_bound(a, W2, b2, tp, dtype)}
        return out_ref

    def expected_collectives(self, case: TPCase, options: dict, dtype: str) -> tuple[list, list, str, str]:
        S = case.x.shape[0] * case.dims["hidden_size"] * ITEMSIZE[dtype]
        count = closed_form("tp.mlp.allreduce_per_forward")
        return ([(Collective.ALL_REDUCE, S)] * count, [(Collective.ALL_REDUCE, S)] * count,
                f"closed form tp.mlp.allreduce_per_forward = {count}",
                f"conjugate of the forward (f and g, Shoeybi et al. 2019 §3): {count}")


def _partial_bias_bound(a: np.ndarray, W2: np.ndarray, b2: np.ndarray, tp: int, dtype: str) -> np.ndarray:
    """Elementwise bound on the MLP output when each rank adds ``b2 / tp`` (rounded once) to its partial
    product before the all-reduce: ``a @ W2^T`` with the tp shares as ``tp`` more terms of every sum
    (:func:`distcheck.engine.contracts.bounds.matmul`, any order; Higham, Lemma 3.1)."""
    def tracked(u: float) -> tb.Tracked:
        share = np.tile(b2 / tp, (tp, 1))
        A = tb.exact(np.hstack([a, np.ones((a.shape[0], tp))]))
        B = tb.Tracked(np.vstack([W2.T, share]), np.vstack([np.zeros_like(W2.T), u * np.abs(share)]))
        return tb.matmul(A, B, u)

    return tb.final_bound(tracked(tb.UNIT_ROUNDOFF[dtype]).e, tracked(tb.UNIT_ROUNDOFF["float64"]).e)


# ------------------------------------------------------------------------------------- attention


class TensorParallelAttention(ShardedLayerContract):
    """Grouped-query self-attention split by heads (see the module doc); bounded regime."""

    name = "tensor-parallel-attention"
    summary = "q/k/v split by whole heads (GQA groups kept), o_proj row-parallel: one all-reduce each way"
    ctor_fields = ("hidden_size", "num_heads", "num_kv_heads", "head_dim")
    behaviour = ("causal",)
    accepts_plan = True
    has_bias_kwarg = False
    reference_module = "attention"
    properties = tuple(PropertySpec(p.name, p.statement.replace("equals", "is within the derived bound of"),
                                    "bounded" if p.regime == "bitwise" else p.regime) for p in PROPERTIES)
    options = COMMON_OPTIONS + (Option("causal", True, bool, "queries see only keys at or before their position"),)

    def specs(self) -> tuple[ParamSpec, ...]:
        return tuple(ParamSpec(f"{n}.weight", 0 if n != "o_proj" else 1, (f"{n}.weight",) + alt)
                     for n, alt in (("q_proj", ("wq.weight", "query.weight")), ("k_proj", ("wk.weight", "key.weight")),
                                    ("v_proj", ("wv.weight", "value.weight")),
                                    ("o_proj", ("wo.weight", "out_proj.weight", "dense.weight"))))

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[TPCase] | None:
        tp = world_size

        @st.composite
        def draw_case(draw: st.DrawFn) -> TPCase:
            a = draw(ds.attention_cases(min_tp=tp, max_tp=tp, max_kv_heads=max(4, tp), max_group=2, max_seq=4))
            # x in quarters, weights in eighths: exact in every dtype, scores below about 2.2 so
            # the exponentials' error stays small in bfloat16
            params = {"q_proj.weight": a.Wq.T / 8, "k_proj.weight": a.Wk.T / 8, "v_proj.weight": a.Wv.T / 8,
                      "o_proj.weight": a.Wo.T / 8}
            params = {k: np.ascontiguousarray(v) for k, v in params.items()}
            g = integer_arrays(draw, (1,) + a.x.shape, 2) / 4
            return TPCase(tp=tp, x=a.x[None] / 4, params=params, grad_output=g,
                          dims={"hidden_size": a.x.shape[1], "num_heads": a.num_heads,
                                "num_kv_heads": a.num_kv_heads, "head_dim": a.head_dim})

        return draw_case()

    def layer_case(self, case: TPCase, options: dict) -> LayerCase:
        d = case.dims
        return LayerCase(tp=case.tp, x=case.x, g=case.grad_output, params=case.params, specs=self.specs(),
                         ctor_args=(d["hidden_size"], d["num_heads"], d["num_kv_heads"], d["head_dim"]), dims=d,
                         reference="attention",
                         reference_kwargs={"num_heads": d["num_heads"], "num_kv_heads": d["num_kv_heads"],
                                           "head_dim": d["head_dim"], "causal": options["causal"]})

    def reference(self, case: TPCase, dtype: str, options: dict) -> dict:
        low = _tracked_attention(case, tb.UNIT_ROUNDOFF[dtype], causal=options["causal"])
        ref = _tracked_attention(case, tb.UNIT_ROUNDOFF["float64"], causal=options["causal"])
        out = {"out": low["out"].v, "dx": low["dx"].v, "grads": {k: t.v for k, t in low["grads"].items()}}
        out["bounds"] = {"out": tb.final_bound(low["out"].e, ref["out"].e),
                         "dx": tb.final_bound(low["dx"].e, ref["dx"].e)}
        out["bounds"].update({k: tb.final_bound(t.e, ref["grads"][k].e) for k, t in low["grads"].items()})
        return out

    def expected_collectives(self, case: TPCase, options: dict, dtype: str) -> tuple[list, list, str, str]:
        S = case.x.size * ITEMSIZE[dtype]
        count = closed_form("tp.attention.allreduce_per_forward")
        return ([(Collective.ALL_REDUCE, S)] * count, [(Collective.ALL_REDUCE, S)] * count,
                f"closed form tp.attention.allreduce_per_forward = {count}",
                f"conjugate of the forward (Shoeybi et al. 2019 §3): {count}")


def _tracked_attention(case: TPCase, u: float, *, causal: bool) -> dict:
    """Forward and backward of grouped-query attention with running error bounds (:mod:`bounds`)."""
    d = case.dims
    H, G, e = d["num_heads"], d["num_kv_heads"], d["head_dim"]
    group = H // G
    p = case.params
    x = tb.exact(case.x[0])  # (s, hidden)
    Wq, Wk, Wv, Wo = (tb.exact(p[f"{n}.weight"]) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    q, k, v = tb.matmul(x, Wq.T, u), tb.matmul(x, Wk.T, u), tb.matmul(x, Wv.T, u)
    s = x.v.shape[0]
    sigma = 1 / math.sqrt(e)
    mask = np.triu(np.ones((s, s), dtype=bool), k=1) if causal else np.zeros((s, s), dtype=bool)
    heads, probs = [], []
    for h in range(H):
        qh, g_ = q[:, h * e:(h + 1) * e], h // group
        kh, vh = k[:, g_ * e:(g_ + 1) * e], v[:, g_ * e:(g_ + 1) * e]
        scores = tb.scale(tb.matmul(qh, kh.T, u), sigma, u)
        scores = tb.Tracked(np.where(mask, -np.inf, scores.v), np.where(mask, 0.0, scores.e))
        P = tb.softmax(scores, u)
        probs.append(P)
        heads.append(tb.matmul(P, vh, u))
    A = tb.Tracked(np.concatenate([t.v for t in heads], axis=1), np.concatenate([t.e for t in heads], axis=1))
    out = tb.matmul(A, Wo.T, u)
    G_out = tb.exact(case.grad_output[0])
    dA = tb.matmul(G_out, Wo, u)
    dq: list[tb.Tracked] = []
    dk_parts: dict[int, tuple[list, list]] = {g_: ([], []) for g_ in range(G)}
    dv_parts: dict[int, tuple[list, list]] = {g_: ([], []) for g_ in range(G)}
    for h in range(H):
        g_ = h // group
        qh, kh, vh = q[:, h * e:(h + 1) * e], k[:, g_ * e:(g_ + 1) * e], v[:, g_ * e:(g_ + 1) * e]
        dO, P = dA[:, h * e:(h + 1) * e], probs[h]
        dP = tb.matmul(dO, vh.T, u)
        t = tb.rowsum(tb.mul(P, dP, u), u)
        dS = tb.scale(tb.mul(P, tb.sub(dP, t, u), u), sigma, u)
        dq.append(tb.matmul(dS, kh, u))
        dk_parts[g_][0].append(dS.T)
        dk_parts[g_][1].append(qh)
        dv_parts[g_][0].append(P.T)
        dv_parts[g_][1].append(dO)

    def cat(ts: Sequence[tb.Tracked], axis: int) -> tb.Tracked:
        return tb.Tracked(np.concatenate([t.v for t in ts], axis=axis), np.concatenate([t.e for t in ts], axis=axis))

    # a kv head's gradient sums over the query heads of its group: one product of inner length s * group
    dk = [tb.matmul(cat(dk_parts[g_][0], 1), cat(dk_parts[g_][1], 0), u) for g_ in range(G)]
    dv = [tb.matmul(cat(dv_parts[g_][0], 1), cat(dv_parts[g_][1], 0), u) for g_ in range(G)]
    dQ, dK, dV = cat(dq, 1), cat(dk, 1), cat(dv, 1)
    dx = tb.matmul(cat([dQ, dK, dV], 1), cat([Wq, Wk, Wv], 0), u)
    grads = {"q_proj.weight": tb.matmul(dQ.T, x, u), "k_proj.weight": tb.matmul(dK.T, x, u),
             "v_proj.weight": tb.matmul(dV.T, x, u), "o_proj.weight": tb.matmul(G_out.T, A, u)}
    return {"out": tb.Tracked(out.v[None], out.e[None]), "dx": tb.Tracked(dx.v[None], dx.e[None]), "grads": grads}
