"""A contract base for layers whose parameters are sharded over the ranks (tensor parallelism and
its relatives): the five properties, the target kinds (a module class, a factory, a torch parallel
style or plan), the harness of :mod:`distcheck.engine.contracts.layer`, and the generic check: every rank's
output, input gradient and parameter-gradient shards against the reference, replicated results
bit-identical across ranks, and the collectives of one forward and one backward against the
expected list.

A subclass (see :mod:`distcheck.parallel.tp.contracts`) gives its parameters (:meth:`specs`), the
case strategy, the :class:`~distcheck.engine.contracts.layer.LayerCase` of a case (which inputs and outputs
are split), the reference (exact, or with ``bounds``) and the expected collectives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from distcheck.core.exactness import max_exact_int
from distcheck.engine import strategies as generic
from distcheck.engine.contracts.checks import agree, combine, compare, compare_collectives, padded_all_gather
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.layer import SPLITS, LayerCase, ParamSpec, check_constructor, run_layer
from distcheck.engine.contracts.targets import Target, check_call_shape, make_target
from distcheck.engine.world import RankContext

__all__ = ["ITEMSIZE", "PROPERTIES", "COMMON_OPTIONS", "TPCase", "ShardedLayerContract", "magnitude", "closed_form",
           "integer_arrays", "check_exact"]

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2}
_CAP = 64  # largest entry drawn: keeps counterexamples readable

PROPERTIES = (
    PropertySpec("forward", "every rank's output equals the reference (its own columns when the output stays "
                            "split), and replicated outputs are the same bits on every rank", "bitwise"),
    PropertySpec("input_grad", "every rank's input gradient equals the reference's (its own columns when the input "
                           "is split), the same bits on every rank when replicated", "bitwise"),
    PropertySpec("param_grads", "every rank's parameter gradients equal the reference's shard, replicated ones the "
                                "same bits on every rank", "bitwise"),
    PropertySpec("collectives.forward", "one forward issues exactly the collectives of the closed form, at the "
                                        "full tensor size S", "exact"),
    PropertySpec("collectives.backward", "one backward issues exactly the conjugate collectives (Megatron's f and g)",
                 "exact"),
)

COMMON_OPTIONS = (
    Option("divisible", True, bool, "draw only widths that tp divides (Megatron and fairscale require it)"),
    Option("split", "array_split", str, "how the layer cuts a width tp does not divide: numpy.array_split "
                                        "(the first n % tp ranks get one more) or chunk (torch.chunk)", SPLITS),
    Option("kwargs", {}, dict, "extra keyword arguments of the module's constructor"),
    Option("param_names", {}, dict, "canonical parameter name -> attribute path in your module"),
)


def magnitude(num_terms: int, factors: int, dtype: str) -> int:
    return min(_CAP, max_exact_int(num_terms, factors=factors, dtype=dtype))


def closed_form(name: str) -> int:
    from distcheck.engine.catalogue import get

    return int(get(name).evaluate())


def integer_arrays(draw: st.DrawFn, shape: tuple[int, ...], bound: int) -> np.ndarray:
    return draw(generic.integer_valued_arrays(shape=shape, max_magnitude=bound))


@dataclass(frozen=True)
class TPCase:
    """One example: ``tp``, the input ``x``, the parameters (torch layout) and ``grad_output``."""

    tp: int
    x: np.ndarray
    params: dict
    grad_output: np.ndarray
    dims: dict

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.dims.items() if k not in ("in_features", "out_features"))
        parts = [f"tp={self.tp}"] + ([inner] if inner else []) + [f"x={self.x.tolist()}"]
        parts += [f"{k}={v.tolist()}" for k, v in self.params.items()]
        return f"TPCase({', '.join(parts + [f'grad_output={self.grad_output.tolist()}'])})"


class ShardedLayerContract(Contract):
    """Base of the contracts whose target is a torch layer with sharded parameters (see the module doc)."""

    parallelism = "tp"
    min_world_size = 2
    min_world_reason = ("tp = 1 shards nothing: every shard is the whole layer and every collective the identity, "
                        "so a missing, misplaced or doubled reduction gives the reference's results there")
    properties: ClassVar[tuple[PropertySpec, ...]] = PROPERTIES
    reference_module = "linear"
    ctor_fields: tuple[str, ...] = ()
    behaviour: tuple[str, ...] = ()  # options that describe the layer and are passed to a constructor that takes them
    accepts_style = False
    accepts_plan = False

    # -------------------------------------------------------------- protocol

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        import torch
        from torch.distributed.tensor.parallel.style import ParallelStyle

        build = {"param_names": options["param_names"], "split": options["split"], "kwargs": dict(options["kwargs"])}
        shown = ref or repr(obj)
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            import inspect

            try:
                params: Mapping[str, inspect.Parameter] = inspect.signature(obj).parameters
            except ValueError:
                params = {}
            takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
            for name in self.behaviour:
                if name in params or takes_any:
                    build["kwargs"][name] = options[name]
            build["bias_kwarg"] = self.has_bias_kwarg
            extra = dict(build["kwargs"], **({"bias": True} if self.has_bias_kwarg else {}))
            check_constructor(obj, tuple(range(1, len(self.ctor_fields) + 1)), extra,
                              f"{obj.__name__}({', '.join(self.ctor_fields)}"
                              f"{', bias=...' if self.has_bias_kwarg else ''})")
            return make_target(obj, ref, "module", **build), options
        is_style = isinstance(obj, ParallelStyle) or (isinstance(obj, type) and issubclass(obj, ParallelStyle))
        if is_style and self.accepts_style:
            build["split"] = "chunk"  # DTensor's Shard placement
            return make_target(obj, ref, "style", **build), self.style_options(obj, options)
        is_plan = isinstance(obj, dict) and obj and all(isinstance(v, ParallelStyle) for v in obj.values())
        if is_plan and self.accepts_plan:
            build["split"] = "chunk"
            return make_target(obj, ref, "plan", **build), options
        if callable(obj) and not isinstance(obj, type):
            check_call_shape(obj, shown, "must take (ctx, case) when it is a factory make(ctx, case) -> module")
            return make_target(obj, ref, "factory", **build), options
        kinds = ["a torch.nn.Module class", "a factory function make(ctx, case) -> module"]
        kinds += ["a torch ParallelStyle (ColwiseParallel, RowwiseParallel)"] if self.accepts_style else []
        kinds += ["a dict of submodule name -> ParallelStyle"] if self.accepts_plan else []
        raise ProtocolError("target", shown, f"must be {', '.join(kinds[:-1])} or {kinds[-1]} for contract {self.name}")

    has_bias_kwarg = True

    def style_options(self, style: Any, options: dict) -> dict:
        return options

    # -------------------------------------------------------------- per-contract hooks

    def specs(self) -> tuple[ParamSpec, ...]:
        raise NotImplementedError

    def layer_case(self, case: TPCase, options: dict) -> LayerCase:
        raise NotImplementedError

    def reference(self, case: TPCase, dtype: str, options: dict) -> dict:
        """``{"out", "dx", "grads": {name: ...}}``: full, float64, torch layout; exact, or with
        ``"bounds"`` (same keys) for a bounded contract."""
        raise NotImplementedError

    def expected_collectives(self, case: TPCase, options: dict, dtype: str) -> tuple[list, list, str, str]:
        raise NotImplementedError

    def gathered_dims(self, case: TPCase, options: dict, dtype: str) -> tuple[tuple[int, int], ...]:
        """``(length, slice_bytes)`` of each dimension the expected collectives all-gather (none by
        default). Where tp does not divide a length, the all-gather may also be at exactly its padded
        volume (:func:`~distcheck.engine.contracts.checks.padded_all_gather`: gloo needs equal shards)."""
        return ()

    # -------------------------------------------------------------- rank and check

    def run_rank(self, ctx: RankContext, target: Target, case: TPCase, dtype: str, options: dict) -> dict:
        return run_layer(ctx, target, self.layer_case(case, options), dtype)

    def check(self, case: TPCase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        lc = self.layer_case(case, options)
        ref = self.reference(case, dtype, options)
        bounds = ref.get("bounds", {})  # absent: bitwise

        def expected(full: np.ndarray | None, shard: str | None, dim: int) -> list:
            """The full reference on every rank, or each rank's own block of the parameter ``shard``."""
            if full is None or shard is None:
                return [full] * len(results)
            index = [slice(None)] * np.ndim(full)
            return [full[tuple(index[:dim] + [slice(*res["bounds"][shard])] + index[dim + 1:])] if dim >= 0
                    else full[..., slice(*res["bounds"][shard])] for res in results]  # views, no copies

        def held(what: str, full: np.ndarray | None, got: list, dtypes: list, shard: str | None, dim: int,
                 bound: np.ndarray | None) -> Outcome:
            exp = expected(full, shard, dim)
            outcome = compare(what, dtype, exp, got, dtypes, None if bound is None else expected(bound, shard, dim))
            return outcome if shard is not None else combine(outcome, agree(what, got))

        forward = held("output", ref["out"], [r["out"] for r in results], [r["out_dtype"] for r in results],
                       lc.output_shard, -1, bounds.get("out"))
        input_grad = (None if lc.x_is_index else  # integer ids: no input gradient (and no such property)
                      held("input gradient", ref["dx"], [r["dx"] for r in results], [r["dx_dtype"] for r in results],
                           lc.input_shard, -1, bounds.get("dx")))
        layout = [f"rank {r}: {msg}" for r, res in enumerate(results) for msg in res["param_errors"].values()]
        grads = [Outcome(not layout, message="parameters do not follow the contract's layout: " + "; ".join(layout),
                         ranks=tuple(r for r, res in enumerate(results) if res["param_errors"]))]
        placed = [f"rank {r}: {msg}" for r, res in enumerate(results) for msg in res.get("grad_errors", {}).values()]
        grads += [Outcome(not placed, message="gradients are not placed as their parameters: " + "; ".join(placed),
                          ranks=tuple(r for r, res in enumerate(results) if res.get("grad_errors")))]
        grads += [held(f"gradient of {spec.name}", ref["grads"][spec.name],
                       [r["grads"].get(spec.name) for r in results],
                       [r["grad_dtypes"].get(spec.name) for r in results],
                       None if spec.shard_dim is None else spec.name,
                       spec.shard_dim if spec.shard_dim is not None else 0, bounds.get(spec.name))
                  for spec in lc.specs if spec.name in lc.params
                  and not any(spec.name in r["param_errors"] for r in results)]
        fwd, bwd, fwd_src, bwd_src = self.expected_collectives(case, options, dtype)
        if case.tp == 1:
            fwd, bwd, fwd_src, bwd_src = [], [], "tp=1: nothing to communicate", "tp=1: nothing to communicate"
        pairs = [padded_all_gather(length, case.tp, size) for length, size in self.gathered_dims(case, options, dtype)]
        padded = [p for p in pairs if p is not None]
        return {
            "forward": forward,
            **({} if input_grad is None else {"input_grad": input_grad}),
            "param_grads": combine(*grads),
            "collectives.forward": compare_collectives("forward", fwd, [r["forward"] for r in results], fwd_src,
                                                       padded),
            "collectives.backward": compare_collectives("backward", bwd, [r["backward"] for r in results], bwd_src,
                                                        padded),
        }


def check_exact(dtype: str, *sums: Sequence[Sequence[np.ndarray]]) -> None:
    """Guard of the bitwise regime. Each argument is a sum of products, given as a list of chains
    ``(A1, A2, ...)`` standing for ``|A1| @ |A2| @ ...``; the sum of those magnitudes bounds every
    partial sum of the computation in any order, and must be at most 2**p. A scalar bound
    (``max|A1| max|A2| ... times the inner lengths``) decides most cases at once; the elementwise
    products are formed only when it does not. The strategies' magnitudes guarantee the guard; a
    violation is a defect of distcheck, not of the layer under test."""
    from distcheck.core.exactness import precision_bits

    limit = 2.0 ** precision_bits(dtype)
    for chains in sums:
        scalar = 0.0
        for chain in chains:
            term = _max_abs(chain[0])
            for a in chain[1:]:
                term *= _max_abs(a) * a.shape[0]
            scalar += term
        if scalar <= limit:
            continue
        total = np.zeros(())
        for chain in chains:
            prod = np.abs(chain[0])
            for a in chain[1:]:
                prod = prod @ np.abs(a)
            total = total + prod
        top = float(np.max(total, initial=0.0))
        if top > limit:
            raise RuntimeError(f"distcheck defect: a drawn case is not exact in {dtype} (a sum of magnitudes reaches "
                               f"{top:g} > 2**{precision_bits(dtype)}); please report it")


def _max_abs(a: ArrayLike) -> float:
    """max |a| without forming |a| (0 for an empty array)."""
    a = np.asarray(a)
    return max(float(a.max()), -float(a.min())) if a.size else 0.0
