"""The sharded optimizer step contract (ZeRO-1/2, FSDP-style): after each step, every rank's
parameters equal a single-device step on the full batch, and each rank holds the bytes the
ZeRO references say.

Targets (see :mod:`distcheck.parallel.zero.sharded_step` for how a rank runs them): a sharded
optimizer with ``ZeroRedundancyOptimizer``'s constructor ``cls(params, optimizer_class=...,
**hyperparameters)``, or ``torch.distributed.fsdp.fully_shard`` (a function with a
``reshard_after_forward`` parameter). Every rank trains on its own rows with a sum loss; the
reference trains an unsharded copy on the whole batch with the plain optimizer.

Properties:

* ``params``: after ``k`` steps (plain SGD and SGD with momentum: 1 or 2; Adam: 1) every rank's
  parameters are **bitwise** the reference's. Sharding changes where an update is computed
  (on its owner, by the same elementwise optimizer arithmetic on the same gradient) and then
  copies bits (a broadcast, an all-gather), and the gradient sum over ranks is exact (below).
  A step that forgets to send the updated parameters back leaves the other ranks' copies
  stale, and the ranks at fault are named.
* ``bytes_per_rank``: each rank's storage equals the reference of
  :mod:`distcheck.parallel.zero.reference`, byte for byte. A sharded optimizer keeps the
  per-element state (Adam's two moments, 16 B per float64 element; SGD's momentum buffer, 8 B;
  plain SGD none) of whole parameters, assigned largest first to the lightest rank
  (``zero_redundancy_assignment``; ``partition(..., stage=1, scheme="zero_redundancy")``); when
  it says which parameters it keeps (a local ``optim``), those must be the assignment's.
  ``fully_shard`` keeps the dim-0 shards (``torch.chunk``) of the parameters and gradients
  **padded** to a multiple of N rows (``fsdp2_shard_elements(padded=True)``) and of the optimizer
  state **unpadded** (Adam's ``zeros_like`` of the local rows); when N divides every dim 0 the
  total equals ZeRO-3's closed form ``zero.bytes_per_gpu.stage3`` with ``4 + K`` the run's bytes
  per parameter (Rajbhandari et al. 2020, "ZeRO", Figure 1).

Exactness. Inputs and targets are integers in [-3, 3], weights and biases multiples of 1/8 in
[-1/2, 1/2], the learning rate 2**-6: every product and sum of the forward, the backward, the
gradient sum over ranks and an SGD step is a dyadic rational. The parent recomputes each
step's gradient in exact rational arithmetic and checks that every sum, in any order, stays
representable: all its terms are multiples of ``1/D`` and the sum of their magnitudes is at
most ``2**53 / D``. Then every summation order gives the same bits. The strategy draws only
cases that pass (a deep net's second SGD step can leave the grid); the check runs the guard
again, and a case that fails it there is a defect of distcheck, never a verdict on the target.
The second step's gradient is taken at the first step's parameters, which are exact for
SGD (with or without momentum) but not after Adam's division by a square root, hence one step
for Adam. float64 only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from math import prod
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distcheck.engine.contracts.checks import combine, compare
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, resolve
from distcheck.engine.world import RankContext
from distcheck.parallel.zero import reference as zref
from distcheck.parallel.zero.sharded_step import LR, OPTIMIZERS

__all__ = ["StepCase", "ShardedOptimizerStep", "exact_gradients", "is_exact", "STATE_BYTES"]

#: bytes of per-element optimizer state per float64 parameter element
STATE_BYTES = {"sgd": 0, "momentum": 8, "adam": 16}
_MAX_BATCH = 16


@dataclass(frozen=True)
class StepCase:
    """One example: the world size, the optimizer and its steps, the weights ``(out, in)`` and biases of
    each ``Linear`` (ReLU between them), the batch ``X`` and the targets ``T``."""

    world_size: int
    optimizer: str
    steps: int
    weights: tuple
    biases: tuple
    X: np.ndarray
    T: np.ndarray

    @property
    def widths(self) -> list[int]:
        return [self.weights[0].shape[1]] + [W.shape[0] for W in self.weights]

    def __repr__(self) -> str:
        layers = "; ".join(f"W{i}={W.tolist()}, b{i}={b.tolist()}"
                           for i, (W, b) in enumerate(zip(self.weights, self.biases, strict=True)))
        return (f"StepCase(N={self.world_size}, {self.optimizer} x{self.steps}, widths={self.widths}, "
                f"X={self.X.tolist()}, T={self.T.tolist()}, {layers})")


def _cases(world_size: int) -> st.SearchStrategy[StepCase]:
    eighths = st.integers(-4, 4).map(lambda k: k / 8)
    ints = st.integers(-3, 3).map(float)

    @st.composite
    def draw(draw: st.DrawFn) -> StepCase:
        optimizer = draw(st.sampled_from(OPTIMIZERS))
        steps = 1 if optimizer == "adam" else draw(st.integers(1, 2))
        widths = draw(st.lists(st.integers(1, 7), min_size=2, max_size=4 if steps == 1 else 3))
        batch = draw(st.integers(1, _MAX_BATCH))
        weights = tuple(draw(hnp.arrays(np.float64, (b, a), elements=eighths)) for a, b in pairwise(widths))
        biases = tuple(draw(hnp.arrays(np.float64, (b,), elements=eighths)) for b in widths[1:])
        X = draw(hnp.arrays(np.float64, (batch, widths[0]), elements=ints))
        T = draw(hnp.arrays(np.float64, (batch, widths[-1]), elements=ints))
        return StepCase(world_size, optimizer, steps, weights, biases, X, T)

    return draw().filter(is_exact)


def is_exact(case: StepCase) -> bool:
    """True when every sum of the case's steps is exact in float64 in any order (:func:`exact_gradients`)."""
    try:
        exact_gradients(case)
    except RuntimeError:
        return False
    return True


# ----------------------------------------------------------------------------- the exactness guard

_LIMIT = 2**53


def _fr(a: np.ndarray) -> np.ndarray:
    return np.array([Fraction(float(v)) for v in np.ravel(a)], dtype=object).reshape(np.shape(a))


def _den(a: np.ndarray) -> int:
    return max((v.denominator for v in np.ravel(a)), default=1)


def _guard(what: str, magnitude: np.ndarray, den: int) -> None:
    top = max(np.ravel(magnitude), default=Fraction(0))
    if top * den > _LIMIT:
        raise RuntimeError(f"distcheck defect: a drawn case is not exact in float64 ({what}: terms on the 1/{den} "
                           f"grid sum to {float(top):g} > 2**53/{den}); please report it")


def _matmul(what: str, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    _guard(what, np.abs(A) @ np.abs(B), _den(A) * _den(B))
    return A @ B


def exact_gradients(case: StepCase) -> list[list[np.ndarray]]:
    """The full-batch gradient of every step (weights and biases, ``model.parameters()`` order), in
    exact rational arithmetic, each sum checked representable in float64 in any order (module doc).

    Raises RuntimeError (a distcheck defect) when a sum is not."""
    Ws, bs = [_fr(W) for W in case.weights], [_fr(b) for b in case.biases]
    X, T, lr = _fr(case.X), _fr(case.T), Fraction(LR)
    out = []
    for step in range(case.steps):
        hs, zs = [X], []
        for i, (W, b) in enumerate(zip(Ws, bs, strict=True)):
            z = _matmul("forward", hs[-1], W.T)
            _guard("bias", np.abs(z) + np.abs(b), max(_den(z), _den(b)))
            z = z + b
            zs.append(z)
            hs.append(z if i == len(Ws) - 1 else np.where(z > 0, z, np.array(Fraction(0), dtype=object)))
        d = hs[-1] - T
        grads: list = [None] * (2 * len(Ws))
        for i in reversed(range(len(Ws))):
            grads[2 * i] = _matmul("weight gradient", d.T, hs[i])
            ones = np.full((1, d.shape[0]), Fraction(1), dtype=object)
            grads[2 * i + 1] = _matmul("bias gradient", ones, d)[0]
            if i:
                d = _matmul("input gradient", d, Ws[i]) * (zs[i - 1] > 0)
        out.append(grads)
        if step + 1 < case.steps:  # SGD's first step (momentum's buffer is the gradient): exact, checked
            for i in range(len(Ws)):
                for p, g in ((Ws, grads[2 * i]), (bs, grads[2 * i + 1])):
                    _guard("SGD step", np.abs(p[i]) + lr * np.abs(g), max(_den(p[i]), _den(g) * lr.denominator))
                    p[i] = p[i] - lr * g
    return out


# ----------------------------------------------------------------------------- the contract

_PROPERTIES = (
    PropertySpec("params", "after every step each rank's parameters are bitwise those of a single-device step on "
                           "the full batch", "bitwise"),
    PropertySpec("bytes_per_rank", "each rank's parameter, gradient and optimizer-state storage equals the ZeRO "
                                   "reference's, byte for byte", "exact"),
)


class ShardedOptimizerStep(Contract):
    """Sharded optimizer step, ZeRO-1/2 and FSDP-style (see the module doc)."""

    name = "sharded-optimizer-step"
    parallelism = "zero"
    min_world_size = 2
    min_world_reason = ("one rank holds every shard: the sharding, the gradient reduction and the parameter "
                        "gathers are identities, so a missing or wrong one gives the single-device step there")
    summary = "parameters after each step equal a single-device step on the full batch; bytes per rank as ZeRO's"
    properties: ClassVar[tuple[PropertySpec, ...]] = _PROPERTIES
    dtypes = ("float64",)
    options = (
        Option("reshard_after_forward", True, bool, "fully_shard: gather the parameters again for the backward "
                                                    "(ZeRO-3; false keeps them, ZeRO-2-like)"),
        Option("reduce_gradients", True, bool, "sharded optimizer: the harness sums the ranks' gradients with an "
                                               "all-reduce before step() (ZeRO-1; false: the optimizer reduces them)"),
    )

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        import inspect

        import torch

        shown = ref or repr(obj)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer):
            from distcheck.engine.contracts.layer import check_constructor

            check_constructor(obj, ([],), {"optimizer_class": torch.optim.SGD, "lr": LR},
                              f"{obj.__name__}(params, optimizer_class=..., lr=...)")
            return make_target(obj, ref, "optimizer"), options
        if callable(obj) and not isinstance(obj, type):
            try:
                params: Mapping[str, inspect.Parameter] = inspect.signature(obj).parameters
            except ValueError:
                params = {}
            if "reshard_after_forward" in params:
                return make_target(obj, ref, "fully_shard"), options
        raise ProtocolError("target", shown, "must be a sharded optimizer class built as cls(params, "
                                             "optimizer_class=..., **hyperparameters), or fully_shard")

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[StepCase] | None:
        return _cases(world_size) if dtype == "float64" else None

    def skip_reason(self, world_size: int, dtype: str, options: dict) -> str:
        return f"{self.name} is certified in float64 only (exact dyadic data), not {dtype}"

    def run_rank(self, ctx: RankContext, target: Target, case: StepCase, dtype: str, options: dict) -> dict:
        from distcheck.parallel.zero.sharded_step import run_step

        return run_step(ctx, target, case, resolve(target), options)

    def check(self, case: StepCase, results: list, world_size: int, dtype: str,
              options: dict) -> dict[str, Outcome]:
        exact_gradients(case)  # the guard: a case that is not exact is distcheck's defect
        names = [f"{kind} of layer {i}" for i in range(len(case.weights)) for kind in ("weight", "bias")]
        params = combine(*(compare(name, "float64", [res["single"][i] for res in results],
                                   [res["params"][i] for res in results], ["float64"] * len(results))
                           for i, name in enumerate(names)))
        if "owned" in results[0]:
            memory = self._optimizer_bytes(case, results, world_size)
        else:
            memory = self._fsdp_bytes(case, results, world_size)
        return {"params": params, "bytes_per_rank": memory}

    # ------------------------------------------------------------------ bytes per rank

    @staticmethod
    def _verdict(bad: list[tuple[int, str]]) -> Outcome:
        if not bad:
            return Outcome(True, max_error=0.0, bound=0.0)
        return Outcome(False, bound=0.0, ranks=tuple(sorted({r for r, _ in bad})),
                       message="; ".join(f"rank {r}: {m}" for r, m in bad))

    def _optimizer_bytes(self, case: StepCase, results: list, N: int) -> Outcome:
        shapes = results[0]["shapes"]
        numels = [prod(s) for s in shapes]
        k = STATE_BYTES[case.optimizer]
        part = zref.partition(shapes, N, stage=1, scheme="zero_redundancy", weight_bytes=8, grad_bytes=8, k=k)
        owners = zref.zero_redundancy_assignment(numels, N)
        bad = []
        for r, res in enumerate(results):
            want = part.per_rank[r].optimizer_bytes
            if res["state_bytes"] != want:
                bad.append((r, f"{res['state_bytes']} B of optimizer state, reference {want} B (parameters "
                               f"{sorted(owners[r])} of {numels} elements, {k} B each; zero_redundancy partition)"))
            if res["owned"] is not None and res["owned"] != sorted(owners[r]):
                bad.append((r, f"keeps the state of parameters {res['owned']}, reference {sorted(owners[r])} "
                               "(largest first to the lightest rank)"))
        return self._verdict(bad)

    def _fsdp_bytes(self, case: StepCase, results: list, N: int) -> Outcome:
        from distcheck.engine.catalogue import form_value

        shapes = results[0]["shapes"]
        padded = zref.fsdp2_shard_elements(shapes, N, padded=True)
        unpadded = zref.fsdp2_shard_elements(shapes, N, padded=False)
        k = STATE_BYTES[case.optimizer]
        bad = []
        for r, res in enumerate(results):
            for what, got, want in (("parameters", res["param_bytes"], 8 * padded[r]),
                                    ("gradients", res["grad_bytes"], 8 * padded[r]),
                                    ("optimizer state", res["state_bytes"], k * unpadded[r])):
                if got != want:
                    rule = ("dim 0 padded to a multiple of N" if what != "optimizer state"
                            else "the local rows, unpadded")
                    bad.append((r, f"{what} {got} B, reference {want} B ({rule}; shapes {shapes})"))
        if not bad and all(s[0] % N == 0 for s in shapes):
            psi = sum(prod(s) for s in shapes)
            form = form_value("zero.bytes_per_gpu.stage3", params=psi, dp=N, k=8 + 8 + k - 4)
            for r, res in enumerate(results):
                total = res["param_bytes"] + res["grad_bytes"] + res["state_bytes"]
                if total != form:
                    bad.append((r, f"{total} B in all, closed form zero.bytes_per_gpu.stage3 = {form} B"))
        return self._verdict(bad)
