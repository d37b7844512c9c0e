"""The sequence-parallel contract: a pre-norm MLP block ``x + down(relu(up(norm(x))))`` whose layer norm
and residual run on sequence shards (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", §4.2.2, Figure 5).

Rank r receives its tokens ``x[:, rows_r]`` (batch first, (b, s, h); tp divides s, rows in rank order)
and returns its tokens of the output. Weights in torch's layout: ``norm.weight``, ``norm.bias`` (h,)
replicated; ``up.weight`` (ffn, h) and ``up.bias`` split by rows (column-parallel); ``down.weight``
(h, ffn) split by columns (row-parallel); ``down.bias`` replicated.

Reference. The same block with tensor parallelism alone, on the whole sequence (torch's
``nn.LayerNorm``, ``ColwiseParallel`` and ``RowwiseParallel``: :data:`distcheck.parallel.sp.plans.TENSOR_PARALLEL_MLP`),
run on the same ranks with the same weights. Sequence parallelism moves the layer norm and the
residual to the shards and replaces the all-reduce by a reduce-scatter and an all-gather; it must
change nothing else. (The tensor-parallel MLP itself is certified against the single-device numpy
reference by ``tensor-parallel-mlp``; the numpy properties ``sp.*`` check the sequence-parallel blocks
against the single-device block.)

Exactness. Weights, biases and the output gradient are integers in [-1, 1] and the tokens are drawn
with an exact layer norm in real arithmetic (:func:`distcheck.strategies.exact_norm_rows`); torch's
layer norm (Welford's running mean) may still round, so the layer norm's output is not assumed exact.

* **forward** (bounded): both blocks normalise each token with torch's layer norm (the same per-token
  arithmetic, so the same bits ``n``); from there each computes ``x + down(relu(up(n)))``, a sum of
  ``ffn + 2`` terms (the tp partial outputs of ``down``, reduce-scattered here, all-reduced there; its
  bias, once or as tp shares ``b / tp``; the residual), each term from a dot product of length h, in an
  order of its own: ``|got - ref| <= 2 (gamma_{ffn+tp+2} (P + |down.bias| + |x|) + gamma_{h+1} P)``
  elementwise, with ``P = (N |up.weight|^T + |up.bias|) |down.weight|^T``,
  ``N_j = |norm.weight_j| sqrt(h) + |norm.bias_j|`` bounding the layer norm's output
  (|xhat| <= sqrt(h - 1)), the magnitudes widened by ``1 + gamma_{h + ffn + 8}`` for their own rounding
  (Higham, "Accuracy and Stability of Numerical Algorithms", eq. 3.5, Lemma 3.3). torch's own plans
  order nothing differently but the reduction, and meet it with room to spare.
* **input_grad** (bitwise): the gradient reaching the layer norm is a sum of products of integers below
  2**p (at most h ffn in magnitude), exact in any order; the layer norm's backward is then the same
  per-token arithmetic in both blocks.
* **param_grads**: the biases' gradients are sums of integers (bitwise). The weights' are sums over the
  s tokens of a product with a rounded value, which an implementation may order its own way (per shard,
  then across the ranks, for the layer norm's): ``norm.weight`` within
  ``2 gamma_{s+tp+1} sqrt(h) sum_t |dy_t|``, ``up.weight`` within ``2 gamma_{s+tp+1} sum_t |dh_t| N``,
  ``down.weight`` within ``2 gamma_{s+tp+1} sum_t |g_t| A`` (A bounding relu(up(n)); bounded). A gradient left
  as a pending sum (DTensor's ``Partial``, as torch's ``SequenceParallel`` leaves the layer norm's) is
  completed first (``redistribute``), and that all-reduce is counted in ``collectives.grad_sums``.
* **collectives**: one forward issues exactly one all-gather and one reduce-scatter of the full output
  (S = b s h bytes per element size: ``sp.block.all_gathers_per_forward``,
  ``sp.block.reduce_scatters_per_forward``) and no all-reduce; one backward the conjugates. The
  replicated parameters whose gradients a rank computes from its own tokens are summed over the ranks,
  in the backward or when their pending sums are completed: the layer norm's weight and bias, 2 h
  elements; and ``down``'s bias too (3 h in all) when it is added after the reduce-scatter, on each
  rank's tokens (Megatron-LM's layout, which marks it ``sequence_parallel``). Added before it, as
  DTensor adds ``b / tp`` to every rank's partial output, its gradient comes from the all-gathered
  output gradient and needs no sum.

No dropout: torch's DTensor random streams are another contract.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st

from distcheck.core.exactness import unit_roundoff
from distcheck.core.vocab import Collective
from distcheck.engine.contracts.checks import agree, combine, compare, compare_collectives, format_collectives
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, check_call_shape, make_target, resolve
from distcheck.engine.world import RankContext
from distcheck.parallel.sp import strategies as ds

if TYPE_CHECKING:
    import torch

__all__ = ["SPCase", "SequenceParallelMLP"]

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2}
PARAMS = ("norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight", "down.bias")
#: the dimension each parameter is split along under tensor parallelism (None: replicated)
SHARD_DIM = {"norm.weight": None, "norm.bias": None, "up.weight": 0, "up.bias": 0, "down.weight": 1,
             "down.bias": None}


@dataclass(frozen=True)
class SPCase:
    """One example: ``tp``; ``x`` and ``grad_output`` (b, s, h); ``params`` (canonical name -> full value,
    torch layout)."""

    tp: int
    x: np.ndarray
    params: dict
    grad_output: np.ndarray

    def __repr__(self) -> str:
        parts = [f"tp={self.tp}", f"x={self.x.tolist()}"] + [f"{k}={v.tolist()}" for k, v in self.params.items()]
        return f"SPCase({', '.join(parts + [f'grad_output={self.grad_output.tolist()}'])})"

    @property
    def dims(self) -> dict:
        return {"hidden_size": self.x.shape[2], "ffn_hidden_size": self.params["up.weight"].shape[0],
                "seq_len": self.x.shape[1]}


def _gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)


def _chunk(n: int, tp: int, rank: int) -> tuple[int, int]:
    size = n // tp
    return rank * size, (rank + 1) * size


class SequenceParallelMLP(Contract):
    """The sequence-parallel pre-norm MLP block (see the module doc)."""

    name = "sequence-parallel-mlp"
    parallelism = "sp"
    min_world_size = 2
    min_world_reason = ("one rank splits no sequence: its all-gather and reduce-scatter are identities (and the "
                        "tensor-parallel reference cannot run there: torch 2.13's DTensor refuses a sharded "
                        "dimension of size 1 on a one-rank mesh)")
    summary = ("layer norm and residual on sequence shards, the MLP tensor parallel between an all-gather and a "
               "reduce-scatter: the tensor-parallel block's results on each rank's tokens")
    properties = (
        PropertySpec("forward", "every rank's output is its tokens of the tensor-parallel block's output, within "
                                "the derived bound of the reordered sums", "bounded"),
        PropertySpec("input_grad", "every rank's input gradient is its tokens of the tensor-parallel block's, bit "
                                   "for bit", "bitwise"),
        PropertySpec("param_grads", "every parameter gradient (pending sums completed) equals the tensor-parallel "
                                    "block's: the biases' bit for bit, the weights' within their derived "
                                    "bounds", "bounded"),
        PropertySpec("collectives.forward", "one all-gather and one reduce-scatter of the full output, no all-reduce",
                     "exact"),
        PropertySpec("collectives.backward", "the conjugates: one all-gather and one reduce-scatter of the full "
                                             "output (besides the layer norm's gradient sums)", "exact"),
        PropertySpec("collectives.grad_sums", "the gradients computed from each rank's tokens are summed over the "
                                              "ranks: all-reduces of 2 h elements in all (the layer norm's), or 3 h "
                                              "with down's bias added after the reduce-scatter", "exact"),
    )
    options = (Option("param_names", {}, dict, "canonical parameter name (norm.weight, up.weight ...) -> attribute "
                                                "path in your module"),)

    # ---------------------------------------------------------------- parent side

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        from torch.distributed.tensor.parallel.style import ParallelStyle

        shown = ref or repr(obj)
        if isinstance(obj, dict) and obj and all(isinstance(v, ParallelStyle) for v in obj.values()):
            return make_target(obj, ref, "plan", param_names={}), options
        if callable(obj) and not isinstance(obj, type):
            check_call_shape(obj, shown, "must take (ctx, case) when it is a factory make(ctx, case) -> module")
            return make_target(obj, ref, "factory", param_names=dict(options["param_names"])), options
        raise ProtocolError("target", shown, "must be a dict of submodule name -> torch ParallelStyle for distcheck's "
                                             "block (norm, up, down), or a factory make(ctx, case) -> module taking "
                                             f"each rank's tokens, for contract {self.name}")

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[SPCase]:
        tp = world_size  # >= 2: min_world_size

        @st.composite
        def draw_case(draw: st.DrawFn) -> SPCase:
            s = tp * draw(st.integers(1, 2))
            x = draw(ds.exact_norm_rows(min_tokens=s, max_tokens=s, max_hidden=8))
            h = x.shape[1]
            f = tp * draw(st.integers(1, max(1, 8 // tp)))

            def ints(shape: tuple[int, ...]) -> np.ndarray:
                return np.array(draw(st.lists(st.integers(-1, 1), min_size=math.prod(shape),
                                              max_size=math.prod(shape))), dtype=np.float64).reshape(shape)

            params = {"norm.weight": ints((h,)), "norm.bias": ints((h,)), "up.weight": ints((f, h)),
                      "up.bias": ints((f,)), "down.weight": ints((h, f)), "down.bias": ints((h,))}
            return SPCase(tp=tp, x=x[None], params=params, grad_output=ints((1, s, h)))

        return draw_case()

    # ---------------------------------------------------------------- rank side

    def run_rank(self, ctx: RankContext, target: Target, case: SPCase, dtype: str, options: dict) -> dict:
        import torch

        from distcheck.engine.contracts.layer import torch_dtype

        dt = torch_dtype(dtype)
        lo, hi = _chunk(case.x.shape[1], case.tp, ctx.rank)
        obj = resolve(target)
        if target.kind == "plan":
            module = _parallel_block(ctx, case, dt, obj)
        else:
            view = SimpleNamespace(
                params={k: torch.as_tensor(v, dtype=dt, device=ctx.device) for k, v in case.params.items()},
                dims=case.dims, tp=case.tp, rank=ctx.rank, dtype=dt, device=ctx.device, rows=(lo, hi))
            module = obj(ctx, view)
            if not hasattr(module, "parameters") or not callable(module):
                raise ProtocolError("target", target.ref, f"must return a torch module from make(ctx, case), got "
                                                          f"{type(module).__name__}")
        got = _run(module, case.x[:, lo:hi], case.grad_output[:, lo:hi], dt, ctx.device,
                   target.build.get("param_names", {}), target.ref)
        from distcheck.parallel.sp.plans import TENSOR_PARALLEL_MLP

        reference = _run(_parallel_block(ctx, case, dt, TENSOR_PARALLEL_MLP), case.x, case.grad_output, dt,
                         ctx.device, {}, "the tensor-parallel reference")
        return {"got": got, "ref": reference, "rows": (lo, hi)}

    # ---------------------------------------------------------------- check

    def check(self, case: SPCase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        u = float(unit_roundoff(dtype))  # a power of two: exact
        p = case.params
        b, s, h = case.x.shape
        f = p["up.weight"].shape[0]
        widen = 1 + _gamma(h + f + 8, u)
        N = (np.abs(p["norm.weight"]) * math.sqrt(h) + np.abs(p["norm.bias"])) * widen
        A = (N @ np.abs(p["up.weight"]).T + np.abs(p["up.bias"])) * widen
        P = (A @ np.abs(p["down.weight"]).T) * widen
        out_bound = 2 * (_gamma(f + case.tp + 2, u) * (P + np.abs(p["down.bias"]) + np.abs(case.x))
                         + _gamma(h + 1, u) * P) * widen
        G = np.abs(case.grad_output[0])                # (s, h)
        D = G @ np.abs(p["down.weight"])               # (s, ffn) >= |dh_t|, the gradient at up's output
        dy = D @ np.abs(p["up.weight"])                # (s, h) >= |dy_t|, the gradient at the layer norm's output
        reorder = 2 * _gamma(s + case.tp + 1, u) * widen  # a sum over the s tokens in any order, partly per rank
        full_bounds = {"norm.weight": reorder * math.sqrt(h) * dy.sum(axis=0),
                       "up.weight": reorder * np.outer(D.sum(axis=0), N),   # (ffn, h): sum_t |dh_t| |n_t|
                       "down.weight": reorder * np.outer(G.sum(axis=0), A)}  # (h, ffn): sum_t |g_t| |a_t|

        def local_bound(name: str, r: int) -> np.ndarray:
            """Rank r's block of a parameter's gradient bound (the chunk split of its shard dimension)."""
            full, dim = full_bounds[name], SHARD_DIM[name]
            if dim is None:
                return full
            lo, hi = _chunk(full.shape[dim], case.tp, r)
            return full[lo:hi] if dim == 0 else full[:, lo:hi]

        def rows(full: np.ndarray, r: int) -> np.ndarray:
            lo, hi = results[r]["rows"]
            return full[:, lo:hi]

        forward = compare("output", dtype, [rows(r_["ref"]["out"], r) for r, r_ in enumerate(results)],
                          [r_["got"]["out"] for r_ in results], [r_["got"]["out_dtype"] for r_ in results],
                          [rows(out_bound, r) for r in range(len(results))])
        input_grad = compare("input gradient", dtype, [rows(r_["ref"]["dx"], r) for r, r_ in enumerate(results)],
                             [r_["got"]["dx"] for r_ in results], [r_["got"]["dx_dtype"] for r_ in results])
        grads = []
        for name in PARAMS:
            bound = [local_bound(name, r) for r in range(len(results))] if name in full_bounds else None
            outcome = compare(f"gradient of {name}", dtype, [r_["ref"]["grads"][name] for r_ in results],
                              [r_["got"]["grads"][name] for r_ in results],
                              [r_["got"]["grad_dtypes"][name] for r_ in results], bound)
            if SHARD_DIM[name] is None:
                outcome = combine(outcome, agree(f"gradient of {name}", [r_["got"]["grads"][name] for r_ in results]))
            grads.append(outcome)
        size = b * s * h * ITEMSIZE[dtype]
        one = [(Collective.ALL_GATHER, size), (Collective.REDUCE_SCATTER, size)] if case.tp > 1 else []
        src = ("closed forms sp.block.all_gathers_per_forward = 1, sp.block.reduce_scatters_per_forward = 1"
               if case.tp > 1 else "tp=1: nothing to communicate")
        backward = [[rec for rec in r_["got"]["backward"] if rec[0] != Collective.ALL_REDUCE] for r_ in results]
        return {
            "forward": forward,
            "input_grad": input_grad,
            "param_grads": combine(*grads),
            "collectives.forward": compare_collectives("forward", one, [r_["got"]["forward"] for r_ in results], src),
            "collectives.backward": compare_collectives("backward", one, backward, "the conjugates of the forward's"),
            "collectives.grad_sums": _grad_sums(results, h * ITEMSIZE[dtype], case.tp),
        }


def _grad_sums(results: list, row_bytes: int, tp: int) -> Outcome:
    """All-reduces in the backward and in the completion of pending sums: 2 h or 3 h elements in all at tp >= 2
    (see the module doc), none at tp = 1."""
    allowed = (2 * row_bytes, 3 * row_bytes) if tp > 1 else (0,)
    bad = []
    for r, res in enumerate(results):
        recs = [rec for rec in res["got"]["backward"] + res["got"]["grad_sync"] if rec[0] == Collective.ALL_REDUCE]
        others = [rec for rec in res["got"]["grad_sync"] if rec[0] != Collective.ALL_REDUCE]
        if sum(n for _, n in recs) not in allowed or others:
            bad.append(f"rank {r}: {format_collectives(recs + others)}")
    if not bad:
        return Outcome(True, max_error=0.0, bound=0.0)
    return Outcome(False, bound=0.0, message=f"the gradients computed from each rank's tokens must be summed over the "
                                             f"{tp} ranks by all-reduces of {' or '.join(map(str, allowed))} bytes in "
                                             "all (the layer norm's weight and bias, h elements each, and down's bias "
                                             "when it is added after the reduce-scatter); " + "; ".join(bad))


# ---------------------------------------------------------------- torch, on the ranks


def _block_class() -> type[torch.nn.Module]:
    import torch
    from torch import nn

    class Block(nn.Module):
        """A pre-norm MLP block ``x + down(relu(up(norm(x))))``."""

        def __init__(self, hidden_size: int, ffn_hidden_size: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(hidden_size, eps=0.0)
            self.up = nn.Linear(hidden_size, ffn_hidden_size)
            self.down = nn.Linear(ffn_hidden_size, hidden_size)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(self.norm(x))))

    return Block


def _mesh(ctx: RankContext) -> Any:
    key = "distcheck.sp.mesh"
    if key not in ctx.scratch:
        from torch.distributed.device_mesh import init_device_mesh

        ctx.scratch[key] = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("tp",))
    return ctx.scratch[key]


def _parallel_block(ctx: RankContext, case: SPCase, dtype: torch.dtype, plan: dict) -> torch.nn.Module:
    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    dims = case.dims
    module = _block_class()(dims["hidden_size"], dims["ffn_hidden_size"]).to(device=ctx.device, dtype=dtype)
    with torch.no_grad():
        for name, value in case.params.items():
            module.get_parameter(name).copy_(torch.as_tensor(value, dtype=dtype, device=ctx.device))
    parallelize_module(module, _mesh(ctx), plan)
    return module


def _numpy(t: torch.Tensor) -> np.ndarray:
    import torch

    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.detach().to(torch.float64).cpu().numpy()


def _run(module: torch.nn.Module, x: np.ndarray, g: np.ndarray, dtype: torch.dtype, device: torch.device, names: dict,
         ref: str) -> dict:
    import torch

    from distcheck.engine.collectives import ByteCounter

    xt = torch.as_tensor(x, dtype=dtype, device=device).clone().requires_grad_(True)
    gt = torch.as_tensor(g, dtype=dtype, device=device)
    with ByteCounter() as forward:
        out = module(xt)
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if hasattr(out, "to_local"):
        out = out.to_local()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(gt.shape):
        raise AssertionError(f"{ref}: the output must be this rank's tokens, shape {tuple(gt.shape)}; got "
                             f"{getattr(out, 'shape', type(out).__name__)}")
    with ByteCounter() as backward:
        torch.autograd.backward(out, gt)
    grads, dtypes = {}, {}
    with ByteCounter() as grad_sync:
        for name in PARAMS:
            path = names.get(name, name)
            try:
                param: Any = module.get_parameter(path)  # a DTensor once parallelized
            except AttributeError:
                raise ProtocolError("target", ref, f"must have a parameter {name!r} (tried {path}; name it with the "
                                                   "option param_names)") from None
            grad = param.grad
            if grad is not None and hasattr(grad, "placements") and tuple(grad.placements) != tuple(param.placements):
                grad = grad.redistribute(placements=param.placements)  # a pending sum (Partial) completed
            grads[name] = None if grad is None else _numpy(grad)
            dtypes[name] = None if grad is None else str(grad.dtype).removeprefix("torch.")
    return {"out": _numpy(out), "out_dtype": str(out.dtype).removeprefix("torch."),
            "dx": None if xt.grad is None else _numpy(xt.grad),
            "dx_dtype": None if xt.grad is None else str(xt.grad.dtype).removeprefix("torch."),
            "grads": grads, "grad_dtypes": dtypes, "forward": list(forward.records),
            "backward": list(backward.records), "grad_sync": list(grad_sync.records)}
