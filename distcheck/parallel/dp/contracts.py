"""The data-parallel gradient reducer contract: what every rank holds after the gradients of its
shard are synchronised, on equal and unequal shards.

A batch of ``n`` examples is split over the ``N`` ranks like ``numpy.array_split`` (the first
``n % N`` ranks get one more, ``n_k`` each). Every rank computes the gradient of its shard-mean
loss; the target synchronises them. Targets (:meth:`DataParallelReducer.resolve`):

* a DDP class (``torch.nn.parallel.DistributedDataParallel`` or a subclass), built as
  ``cls(module, device_ids=...)``: torch's plain mean ``(1/N) sum_k g_k``;
* a DDP communication hook ``hook(state, bucket) -> Future`` (a function with a parameter named
  ``bucket``), registered on torch's DDP with state ``float(n_k)`` (option ``hook_state="n_local"``)
  or None (``"none"``: torch's own hooks take a process group, None the default);
* your own bucketed all-reduce, a function ``reduce(module, n_local)`` called on every rank
  after the backward of the un-wrapped module; it must leave the synchronised gradients in
  each parameter's ``.grad``.

What the result must be (option ``expect``):

* ``"full_batch"`` (default): the full-batch gradient ``sum_k n_k g_k / n`` on every rank
  (every example weighted ``1/n``, catalogue ``dp.exact_weight``): a weighted reducer, or any
  reducer on equal shards;
* ``"plain_mean"``: DDP's plain mean ``(1/N) sum_k g_k`` (an example of shard k weighted
  ``1/(N n_k)``, ``dp.plain_mean_weight``), whose error against the full batch is exactly
  ``sum_k (1/(N n_k) - 1/n) G_k`` (``G_k`` the shard's gradient sum;
  :func:`distcheck.parallel.dp.plain_mean_bias`): off by the predicted amount, no more, no less.

Properties: ``grads`` (every rank against the numpy reference), ``full_batch`` (every rank's
result minus its own full-batch gradient, computed by torch without the reducer, against 0 or
the predicted plain-mean error) and ``replicated`` (the same bits on every rank).

Exactness (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Lemma 3.1, §3.1).
Every gradient entry is a sum of terms, each a product of inputs and of the constants 2, 1/n_k,
1/N, n_k, 1/n. Along any term's path at most ``K = n + N + d + hidden + out + 8`` roundings
happen (the linear model counts hidden = 4, out = 2): ``<= d + 1`` for the residual, 2 for
``2 r / n_k``, ``<= hidden + out`` for back-propagation, ``<= n_k`` for the sum over the shard,
1 for DDP's division by N, ``N - 1`` for the all-reduce sum, 1 for the comparison's
subtraction; a weighted reducer adds 2 (a multiply by ``n_k``, a divide by ``n``). Hence
``|computed - exact| <= gamma_K M`` with ``M`` the same expression on absolute values, and two
computations of one value differ by at most ``gamma_K (M_a + M_b) / (1 - gamma_K)`` (``M`` is
itself computed in floating point). The MLP's inputs and parameters are small integers, so its
forward pass and its ReLU masks are exact and the bound only covers the backward. With integer
data, a power-of-two world size, power-of-two shard sizes (and, for ``full_batch``, a
power-of-two ``n``) every division is exact and every sum a short dyadic rational: the regime
is then **bitwise** (bound 0). float64 only (the bound is derived for ``u = 2**-53``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distcheck.engine.contracts.checks import agree, combine, compare
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, check_call_shape, make_target, resolve
from distcheck.engine.world import RankContext
from distcheck.parallel.dp import reference as dp

__all__ = ["DDPCase", "DataParallelReducer", "reducer_reference"]

_INT = 3  # integer entries are drawn from [-3, 3]
_FLOAT = 4.0  # float entries of the linear model from [-4, 4]


@dataclass(frozen=True)
class DDPCase:
    """One example: the model (``"linear"`` or ``"mlp"``), the batch ``X`` (n, d) and targets ``Y``
    ((n,) or (n, out)), the parameters (the reference's layout: ``w``; or ``W1`` (d, hidden),
    ``b1``, ``W2`` (hidden, out), ``b2``), the world size and whether every entry is an integer."""

    model: str
    X: np.ndarray
    Y: np.ndarray
    params: dict
    world_size: int
    integer: bool

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        return int(self.X.shape[1])

    @property
    def sizes(self) -> list[int]:
        return [int(s) for s in dp.shard_sizes(self.n, self.world_size)]

    def rounding_count(self) -> int:
        """``K = n + N + d + hidden + out + 8`` (the linear model counts hidden = 4, out = 2)."""
        hidden, out = (self.params["W1"].shape[1], self.params["W2"].shape[1]) if self.model == "mlp" else (4, 2)
        return self.n + self.world_size + self.d + hidden + out + 8

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v.tolist()}" for k, v in self.params.items())
        return (f"DDPCase({self.model}, N={self.world_size}, shards={self.sizes}, X={self.X.tolist()}, "
                f"Y={self.Y.tolist()}, {params})")


def _cases(world_size: int, shards: str) -> st.SearchStrategy[DDPCase]:
    N = world_size

    @st.composite
    def draw(draw: st.DrawFn) -> DDPCase:
        model = draw(st.sampled_from(("linear", "mlp")))
        per_rank = draw(st.integers(1, 3))
        extra = 0 if shards == "equal" else draw(st.integers(1 if shards == "unequal" else 0, N - 1))
        n, d = N * per_rank + extra, draw(st.integers(1, 4))
        integer = model == "mlp" or draw(st.booleans())
        elements = (st.integers(-_INT, _INT).map(float) if integer
                    else st.floats(-_FLOAT, _FLOAT, allow_nan=False, allow_subnormal=False))

        def arr(*shape: int) -> np.ndarray:
            return draw(hnp.arrays(np.float64, shape, elements=elements))

        if model == "linear":
            return DDPCase(model, arr(n, d), arr(n), {"w": arr(d)}, N, integer)
        hidden, out = draw(st.integers(1, 4)), draw(st.integers(1, 2))
        params = {"W1": arr(d, hidden), "b1": arr(hidden), "W2": arr(hidden, out), "b2": arr(out)}
        return DDPCase(model, arr(n, d), arr(n, out), params, N, True)

    return draw()


# ----------------------------------------------------------------------------- the numpy reference


def _relu_mlp_grad_sum(params: dict, X: np.ndarray, Y: np.ndarray, absolute: bool = False) -> dict:
    """Gradient of ``sum_i ||relu(x_i W1 + b1) W2 + b2 - y_i||^2``; ``absolute``: the |.| evaluation M."""
    Z = X @ params["W1"] + params["b1"]
    mask = (Z > 0).astype(np.float64)
    H = Z * mask
    dP = 2 * (H @ params["W2"] + params["b2"] - Y)
    W2, Xa = params["W2"], X
    if absolute:
        dP, H, W2, Xa = np.abs(dP), np.abs(H), np.abs(W2), np.abs(X)
    dZ = (dP @ W2.T) * mask
    return {"W1": Xa.T @ dZ, "b1": dZ.sum(axis=0), "W2": H.T @ dP, "b2": dP.sum(axis=0)}


def _grad_sum(case: DDPCase, X: np.ndarray, Y: np.ndarray, absolute: bool = False) -> dict:
    if case.model == "mlp":
        return _relu_mlp_grad_sum(case.params, X, Y, absolute)
    if absolute:
        w = np.abs(case.params["w"])
        return {"w": 2 * (np.abs(X).T @ (np.abs(X) @ w + np.abs(Y)))}
    return {"w": dp.mse_grad_sum(case.params["w"], X, Y)}


def reducer_reference(case: DDPCase) -> dict:
    """The numpy reference of ``case`` (uses :mod:`distcheck.parallel.dp.reference`).

    Returns ``full`` (the example-weighted mean = the full-batch gradient), ``plain`` (the plain
    mean of shard means, DDP's), ``bias`` (``plain - full`` in closed form,
    :func:`~distcheck.parallel.dp.reference.plain_mean_bias`), the absolute evaluations
    ``M_full``, ``M_plain``, ``M_bias`` of the bound, ``sizes`` and ``K``.
    """
    sizes, N, n = case.sizes, case.world_size, case.n
    Xs, Ys = dp.split_batch(case.X, sizes), dp.split_batch(case.Y, sizes)
    G = [_grad_sum(case, a, b) for a, b in zip(Xs, Ys, strict=True)]
    A = [_grad_sum(case, a, b, absolute=True) for a, b in zip(Xs, Ys, strict=True)]
    means = [{k: v / nk for k, v in g.items()} for g, nk in zip(G, sizes, strict=True)]
    coef = [abs(1.0 / (N * nk) - 1.0 / n) for nk in sizes]
    return {
        "sizes": sizes, "K": case.rounding_count(),
        "full": dp.weighted_mean(means, sizes), "plain": dp.plain_mean(means), "bias": dp.plain_mean_bias(G, sizes),
        "M_full": {k: sum(a[k] for a in A) / n for k in A[0]},
        "M_plain": {k: sum(a[k] / nk for a, nk in zip(A, sizes, strict=True)) / N for k in A[0]},
        "M_bias": {k: sum(c * a[k] for a, c in zip(A, coef, strict=True)) for k in A[0]},
    }


def _is_pow2(k: int) -> bool:
    return k >= 1 and (k & (k - 1)) == 0


def _scaled(g: float, *trees: dict) -> dict:
    return {k: g * sum(np.asarray(t[k]) for t in trees) / (1 - g) for k in trees[0]}


# ----------------------------------------------------------------------------- the contract

_PROPERTIES = (
    PropertySpec("grads", "every rank's synchronised gradient equals the reference: the full-batch gradient "
                          "(expect=full_batch) or the plain mean of shard means (expect=plain_mean); bitwise on "
                          "exact cases, else within gamma_K (M_a + M_b) / (1 - gamma_K)", "bounded"),
    PropertySpec("full_batch", "on every rank, the synchronised gradient minus that rank's own full-batch gradient "
                               "(torch, without the reducer) is 0 (expect=full_batch) or the predicted plain-mean "
                               "error sum_k (1/(N n_k) - 1/n) G_k (expect=plain_mean), within the derived bound",
                 "bounded"),
    PropertySpec("replicated", "every rank holds the same bits (one all-reduce result)", "bitwise"),
)


class DataParallelReducer(Contract):
    """Data-parallel gradient reducer, equal and unequal shards (see the module doc)."""

    name = "data-parallel-reducer"
    parallelism = "dp"
    min_world_size = 2
    min_world_reason = ("one rank has nothing to reduce: every reducer, weighted or plain mean, returns that rank's "
                        "own gradient, and unequal shards need two ranks")
    summary = ("synchronised gradients equal the full-batch gradient (weighted reducer) or DDP's plain mean, off "
               "by exactly sum_k (1/(N n_k) - 1/n) G_k on unequal shards")
    properties: ClassVar[tuple[PropertySpec, ...]] = _PROPERTIES
    dtypes = ("float64",)
    options = (
        Option("expect", "full_batch", str, "what every rank must hold: full_batch (sum_k n_k g_k / n) or "
                                            "plain_mean (DDP's (1/N) sum_k g_k)", ("full_batch", "plain_mean")),
        Option("shards", "any", str, "shard sizes drawn: equal (N divides n), unequal, or any",
               ("equal", "unequal", "any")),
        Option("loss_scale", False, bool, "each rank multiplies its shard-mean loss by n_k N / n (the weighted "
                                          "fix with torch's plain DDP)"),
        Option("hook_state", "n_local", str, "the state a comm hook is registered with: n_local (float(n_k)) or "
                                             "none (None: the default process group, as torch's own hooks take)",
               ("n_local", "none")),
    )

    # ------------------------------------------------------------------ protocol

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        import inspect

        import torch

        shown = ref or repr(obj)
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            from distcheck.engine.contracts.layer import check_constructor

            check_constructor(obj, (None,), {"device_ids": None}, f"{obj.__name__}(module, device_ids=...)")
            return make_target(obj, ref, "ddp"), options
        if callable(obj) and not isinstance(obj, type):
            try:
                params: Mapping[str, inspect.Parameter] = inspect.signature(obj).parameters
            except ValueError:
                params = {}
            if "bucket" in params:
                return make_target(obj, ref, "hook"), options
            check_call_shape(obj, shown, "must be a DDP comm hook hook(state, bucket) or a reducer "
                                         "reduce(module, n_local)")
            return make_target(obj, ref, "reducer"), options
        raise ProtocolError("target", shown, "must be a DistributedDataParallel class, a DDP comm hook "
                                             "hook(state, bucket), or a reducer reduce(module, n_local)")

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[DDPCase] | None:
        if dtype != "float64":
            return None
        return _cases(world_size, options["shards"])

    def skip_reason(self, world_size: int, dtype: str, options: dict) -> str:
        return f"{self.name} is certified in float64 only (its bound is derived for u = 2**-53), not {dtype}"

    # ------------------------------------------------------------------ rank and check

    def run_rank(self, ctx: RankContext, target: Target, case: DDPCase, dtype: str, options: dict) -> dict:
        from distcheck.parallel.dp.ddp import run_reducer

        return run_reducer(ctx, target, case, resolve(target), options)

    def check(self, case: DDPCase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        ref = reducer_reference(case)
        sizes, n, plain = ref["sizes"], case.n, options["expect"] == "plain_mean"
        dyadic = case.integer and _is_pow2(world_size) and all(_is_pow2(s) for s in sizes)
        exact_grads = dyadic and (plain or _is_pow2(n))  # the reference's divisions are exact
        exact_error = dyadic and _is_pow2(n)  # and so is torch's full-batch gradient (1/n)
        if plain:
            g = dp.gamma(ref["K"])
            want, grads_bound = ref["plain"], _scaled(g, ref["M_plain"], ref["M_plain"])
            error, error_bound = ref["bias"], _scaled(g, ref["M_plain"], ref["M_full"], ref["M_bias"])
        else:
            g = dp.gamma(ref["K"] + 2)  # a weighted reducer's multiply by n_k and divide by n
            want, grads_bound = ref["full"], _scaled(g, ref["M_full"], ref["M_full"])
            error, error_bound = {k: np.zeros_like(v) for k, v in ref["full"].items()}, grads_bound
        N = len(results)
        per_grads, per_error, per_agree = [], [], []
        for k in want:
            got = [res["grads"][k] for res in results]
            dtypes = ["float64" if a is not None else None for a in got]
            per_grads.append(compare(f"gradient of {k}", "float64", [want[k]] * N, got, dtypes,
                                     None if exact_grads else [grads_bound[k]] * N))
            observed = [None if res["grads"][k] is None else res["grads"][k] - res["full"][k] for res in results]
            per_error.append(compare(f"gradient of {k} minus the rank's full-batch gradient", "float64",
                                     [error[k]] * N, observed, dtypes, None if exact_error else [error_bound[k]] * N))
            per_agree.append(agree(f"gradient of {k}", got))
        return {"grads": combine(*per_grads), "full_batch": combine(*per_error), "replicated": combine(*per_agree)}

    def statement(self, prop: str, dtype: str, options: dict) -> str:
        plain = options["expect"] == "plain_mean"
        if prop == "grads":
            what = "the plain mean of shard means (DDP's)" if plain else "the full-batch gradient"
            return (f"every rank's synchronised gradient equals {what}; bitwise on exact cases, else within "
                    "gamma_K (M_a + M_b) / (1 - gamma_K)")
        if prop == "full_batch":
            what = ("the predicted plain-mean error sum_k (1/(N n_k) - 1/n) G_k (dp.plain_mean_weight - "
                    "dp.exact_weight)" if plain else "0")
            return (f"on every rank, the synchronised gradient minus that rank's own full-batch gradient (torch, "
                    f"without the reducer) is {what}, within the derived bound")
        return self.spec(prop).statement
