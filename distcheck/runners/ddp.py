"""Is DistributedDataParallel's gradient the full-batch gradient? Rank functions and a driver.

Every rank builds the same small float64 model from an explicit seed, wraps it
in ``torch.nn.parallel.DistributedDataParallel``, runs forward/backward on its
``np.array_split`` shard, and returns the synchronised ``.grad`` together with
the gradient of the same model on the *full* batch computed without DDP.

Models (``DDPExample.model``), loss ``L = (1/n) sum_i ||f(x_i) - y_i||^2``
(the convention of :mod:`distcheck.dp`: mean over examples, sum over outputs):

* ``"linear"``: ``f(x) = x w`` with ``w`` of shape (d,).
* ``"mlp"``: ``f(x) = relu(x W1 + b1) W2 + b2``; ``W1`` (d, hidden), ``W2`` (hidden, out).

What DDP computes (lesson, "Data parallelism is exact"): rank ``k`` with ``n_k``
examples produces ``g_k``, the gradient of its shard-mean loss; DDP's all-reduce
returns ``(1/N) sum_k g_k`` (it divides by ``N = world_size``). With equal shards
this is the full-batch gradient ``(1/n) sum_i grad_i``; with unequal shards it
weights example ``i`` by ``1/(N n_k)`` instead of ``1/n`` (catalogue
``dp.plain_mean_weight`` vs ``dp.exact_weight``), an error equal to
``sum_k (1/(N n_k) - 1/n) G_k`` with ``G_k`` the shard's gradient *sum*
(:func:`distcheck.dp.plain_mean_bias`).

Two fixes are implemented (both give ``sum_k n_k g_k / n``):

* ``method="hook"``: :func:`weighted_allreduce_hook`, a DDP communication hook
  that all-reduces ``[n_k * g_k, n_k]`` in one buffer and divides by the summed
  count, so no rank needs to know the others' shard sizes;
* ``method="loss_scale"``: each rank multiplies its loss by ``n_k N / n`` and lets
  DDP average as usual.

Floating-point bound (Higham, *Accuracy and Stability of Numerical Algorithms*,
2nd ed., Lemma 3.1 and section 3.1). Every gradient entry is a sum of terms, each
a product of inputs and of the constants 2, 1/n_k, 1/N, n_k, 1/n. Along any
term's path at most ``K = n + N + d + hidden + out + 8`` roundings happen:
``<= d + 1`` for the residual (linear model; the MLP forward is exact, see below),
2 for ``2 r / n_k``, ``<= hidden + out`` for back-propagation through the layers,
``<= n_k`` for the sum over the shard's examples, 1 for DDP's division by N (or
the hook's multiply and divide: 2), ``N - 1`` for the all-reduce sum, 1 for the
final comparison's subtraction. Hence ``|computed - exact| <= gamma_K * M`` with
``M`` the same expression evaluated on absolute values, ``gamma_K = K u/(1 - K u)``,
``u = 2**-53``; ``M`` is itself computed in float with at most ``K`` roundings of
nonnegative terms, hence the factor ``1/(1 - gamma_K)``. Comparing two computations
of one exact value, the bound is ``gamma_K (M_a + M_b) / (1 - gamma_K)``.

Exactness: the MLP's inputs and parameters are small integers (as float64), so its
forward pass (integer sums far below 2**53) and its ReLU masks are exact, and the
bound only has to cover the backward pass (a ReLU mask flipped by a forward
rounding would break any bound). The linear model uses either Gaussian inputs or
integers (``integer=True``). With integer inputs, power-of-two shard sizes and a
power-of-two world size every division is exact and every partial sum is a
dyadic rational of a few bits, so DDP is *bitwise* equal to the full batch: the
equal-shard check then requires equality, not the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from distcheck.errors import (
    BackendUnavailable,
    ConfigError,
    DistributedError,
    check_choice,
    check_positive_int,
)

__all__ = [
    "DDPExample",
    "METHODS",
    "make_data",
    "default_examples",
    "weighted_allreduce_hook",
    "ddp_grad_check",
    "ddp_grad_checks",
    "reference",
    "ddp_rows",
    "run_ddp_checks",
]

#: how a rank combines gradients: DDP's plain mean, or one of the two weighted fixes
METHODS = ("plain", "hook", "loss_scale")
_MODELS = ("linear", "mlp")
#: integer range of the inputs and parameters of integer examples (inclusive)
_INT_LO, _INT_HI = -3, 3


@dataclass(frozen=True)
class DDPExample:
    """One DDP example: a model, a batch of ``n`` examples and the seed that makes them.

    Attributes:
        model: ``"linear"`` or ``"mlp"``.
        n: examples in the global batch (>= world size of the run).
        d: input features; ``hidden``, ``out``: MLP widths (ignored by ``"linear"``).
        seed: numpy seed of inputs, targets and parameters (every rank rebuilds them).
        integer: integer-valued inputs and parameters in [-3, 3] (always for ``"mlp"``).
    """

    model: str = "linear"
    n: int = 8
    d: int = 3
    hidden: int = 4
    out: int = 2
    seed: int = 0
    integer: bool = False

    def __post_init__(self):
        check_choice("model", self.model, _MODELS)
        for name in ("n", "d", "hidden", "out"):
            check_positive_int(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", self.seed, "must be an integer >= 0")
        if self.model == "mlp" and not self.integer:
            raise ConfigError("integer", self.integer, "must be True for model='mlp' (exact forward pass, see ddp.py)")

    def rounding_count(self, world_size: int) -> int:
        """``K = n + N + d + hidden + out + 8``: an upper bound on roundings along any term's path."""
        return self.n + world_size + self.d + self.hidden + self.out + 8


def make_data(ex: DDPExample) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(params, X, Y)`` as float64 numpy arrays, in :mod:`distcheck.dp`'s layout.

    ``X`` (n, d). Linear: ``params = {"w": (d,)}``, ``Y`` (n,). MLP: ``params`` has
    ``W1`` (d, hidden), ``b1`` (hidden,), ``W2`` (hidden, out), ``b2`` (out,); ``Y`` (n, out).
    """
    rng = np.random.default_rng(ex.seed)

    def draw(*shape):
        if ex.integer:
            return rng.integers(_INT_LO, _INT_HI + 1, size=shape).astype(np.float64)
        return rng.standard_normal(shape)

    X = draw(ex.n, ex.d)
    if ex.model == "linear":
        return {"w": draw(ex.d)}, X, draw(ex.n)
    params = {"W1": draw(ex.d, ex.hidden), "b1": draw(ex.hidden), "W2": draw(ex.hidden, ex.out), "b2": draw(ex.out)}
    return params, X, draw(ex.n, ex.out)


def _is_pow2(k: int) -> bool:
    return k >= 1 and (k & (k - 1)) == 0


def default_examples(world_size: int, shards: str, count: int = 6) -> list[DDPExample]:
    """``count`` deterministic examples for ``world_size`` ranks.

    ``shards="equal"``: ``n = N * n_k`` with ``n_k`` cycling through 1, 2, 3, 4, 8;
    ``shards="unequal"``: ``n = N * n_k + r`` with ``0 < r < N`` (needs ``N >= 2``).
    Models cycle through integer linear, Gaussian linear and integer MLP.
    """
    check_positive_int("world_size", world_size)
    check_positive_int("count", count)
    check_choice("shards", shards, ("equal", "unequal"))
    if shards == "unequal" and world_size < 2:
        raise ConfigError("world_size", world_size, "must be >= 2 for unequal shards")
    kinds = (("linear", True), ("linear", False), ("mlp", True))
    out = []
    for i in range(count):
        model, integer = kinds[i % len(kinds)]
        nk = (1, 2, 3, 4, 8)[i % 5]
        n = world_size * nk + (0 if shards == "equal" else 1 + i % (world_size - 1))
        out.append(DDPExample(model=model, n=n, d=3 + i % 3, hidden=4, out=2, seed=1000 * world_size + i,
                              integer=integer))
    return out


# --------------------------------------------------------------------------- rank side (torch)


def weighted_allreduce_hook(n_local: float, bucket):
    """DDP communication hook: all-reduce ``[n_k * g_k, n_k]`` and return ``sum n_k g_k / sum n_k``.

    Register with ``ddp.register_comm_hook(state=float(n_k), hook=weighted_allreduce_hook)``.
    With a hook registered DDP does not divide by the world size itself.
    """
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    flat = torch.cat([buf * n_local, buf.new_tensor([n_local])])
    fut = dist.all_reduce(flat, async_op=True).get_future()

    def finish(f):
        out = f.value()[0]
        return out[:-1] / out[-1]

    return fut.then(finish)


def _torch_model(ex: DDPExample, params: dict):
    import torch

    if ex.model == "linear":
        m = torch.nn.Linear(ex.d, 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(params["w"]).reshape(1, ex.d))
        return m
    m = torch.nn.Sequential(
        torch.nn.Linear(ex.d, ex.hidden, dtype=torch.float64), torch.nn.ReLU(),
        torch.nn.Linear(ex.hidden, ex.out, dtype=torch.float64),
    )
    with torch.no_grad():
        m[0].weight.copy_(torch.from_numpy(params["W1"].T))
        m[0].bias.copy_(torch.from_numpy(params["b1"]))
        m[2].weight.copy_(torch.from_numpy(params["W2"].T))
        m[2].bias.copy_(torch.from_numpy(params["b2"]))
    return m


def _grads(ex: DDPExample, m) -> dict:
    """The model's ``.grad``\\ s as numpy arrays in :mod:`distcheck.dp`'s layout."""
    def arr(p):
        return p.grad.detach().cpu().numpy().copy()

    if ex.model == "linear":
        return {"w": arr(m.weight).reshape(ex.d)}
    return {"W1": arr(m[0].weight).T.copy(), "b1": arr(m[0].bias), "W2": arr(m[2].weight).T.copy(), "b2": arr(m[2].bias)}


def _loss(ex: DDPExample, model, X, Y):
    pred = model(X)
    if ex.model == "linear":
        pred = pred.reshape(-1)
    return (pred - Y).pow(2).sum() / X.shape[0]


def ddp_grad_check(ctx, example: DDPExample, methods: Sequence[str] = ("plain",)) -> dict:
    """Rank function: DDP gradients on this rank's shard and the full-batch gradient.

    Returns ``{"full": grads, "<method>": grads, ...}`` (numpy float64 dicts in
    :mod:`distcheck.dp`'s layout) for each of ``methods`` (see :data:`METHODS`).
    ``"full"`` is computed on this rank without DDP on the whole batch.
    Call on every rank (DDP construction and backward are collectives).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    params, Xn, Yn = make_data(example)
    N = ctx.world_size
    if example.n < N:
        raise ConfigError("n", example.n, f"must be >= world_size={N} (every rank needs an example)")
    dev = ctx.device
    X, Y = torch.from_numpy(Xn).to(dev), torch.from_numpy(Yn).to(dev)
    Xk, Yk = torch.tensor_split(X, N)[ctx.rank], torch.tensor_split(Y, N)[ctx.rank]  # np.array_split sizes
    nk = Xk.shape[0]

    full = _torch_model(example, params).to(dev)
    _loss(example, full, X, Y).backward()
    out = {"full": _grads(example, full)}
    for method in methods:
        check_choice("method", method, METHODS)
        local = _torch_model(example, params).to(dev)
        ddp = DDP(local, device_ids=[dev.index] if dev.type == "cuda" else None)
        if method == "hook":
            ddp.register_comm_hook(float(nk), weighted_allreduce_hook)
        loss = _loss(example, ddp, Xk, Yk)
        if method == "loss_scale":
            loss = loss * (nk * N / example.n)
        loss.backward()
        out[method] = _grads(example, local)
    return out


def ddp_grad_checks(ctx, examples: Sequence[DDPExample], methods: Sequence[str]) -> list[dict]:
    """Rank function: :func:`ddp_grad_check` for several examples in one pool call."""
    return [ddp_grad_check(ctx, ex, methods) for ex in examples]


# --------------------------------------------------------------------------- reference (numpy)


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


def _grad_sum(ex: DDPExample, params: dict, X, Y, absolute: bool = False) -> dict:
    from distcheck import dp

    if ex.model == "mlp":
        return _relu_mlp_grad_sum(params, X, Y, absolute)
    if absolute:
        w = np.abs(params["w"])
        return {"w": 2 * (np.abs(X).T @ (np.abs(X) @ w + np.abs(Y)))}
    return {"w": dp.mse_grad_sum(params["w"], X, Y)}


def reference(ex: DDPExample, world_size: int) -> dict:
    """numpy reference for ``ex`` on ``world_size`` ranks (uses :mod:`distcheck.dp`).

    Returns a dict of gradient dicts: ``full`` (example-weighted = full batch),
    ``plain`` (plain mean of shard means, what DDP computes), ``bias``
    (``plain - full`` in closed form, :func:`distcheck.dp.plain_mean_bias`), and the
    absolute evaluations ``M_full``, ``M_plain``, ``M_bias`` used by the bound; and
    ``sizes`` (n_k per rank, ``np.array_split`` sizes) and ``K`` (rounding count).
    """
    from distcheck import dp

    params, X, Y = make_data(ex)
    sizes = [int(s) for s in dp.shard_sizes(ex.n, world_size)]
    Xs, Ys = dp.split_batch(X, sizes), dp.split_batch(Y, sizes)
    G = [_grad_sum(ex, params, a, b) for a, b in zip(Xs, Ys)]
    A = [_grad_sum(ex, params, a, b, absolute=True) for a, b in zip(Xs, Ys)]
    means = [{k: v / nk for k, v in g.items()} for g, nk in zip(G, sizes)]
    N, n = world_size, ex.n
    coef = [abs(1.0 / (N * nk) - 1.0 / n) for nk in sizes]
    return {
        "sizes": sizes,
        "K": ex.rounding_count(world_size),
        "full": dp.weighted_mean(means, sizes),
        "plain": dp.plain_mean(means),
        "bias": dp.plain_mean_bias(G, sizes),
        "M_full": {k: sum(a[k] for a in A) / n for k in A[0]},
        "M_plain": {k: sum(a[k] / nk for a, nk in zip(A, sizes)) / N for k in A[0]},
        "M_bias": {k: sum(c * a[k] for a, c in zip(A, coef)) for k in A[0]},
    }


# --------------------------------------------------------------------------- driver


def _max_abs(tree: dict) -> float:
    return max(float(np.max(np.abs(v))) if np.size(v) else 0.0 for v in tree.values())


def _sub(a: dict, b: dict) -> dict:
    return {k: np.asarray(a[k]) - np.asarray(b[k]) for k in a}


def _excess(diff: dict, bound: dict) -> tuple[float, float]:
    """(max |diff|, the bound at the entry where |diff| / bound is largest)."""
    worst, worst_bound, ratio = 0.0, 0.0, -1.0
    for k in diff:
        d, b = np.abs(diff[k]).ravel(), np.asarray(bound[k]).ravel()
        for di, bi in zip(d, b):
            r = di / bi if bi > 0 else (np.inf if di > 0 else 0.0)
            if r > ratio:
                ratio, worst, worst_bound = r, float(di), float(bi)
    return worst, worst_bound


def _scaled(gk: float, *trees: dict) -> dict:
    return {k: gk * sum(np.asarray(t[k]) for t in trees) / (1 - gk) for k in trees[0]}


def _check_equal(ex, N, res, ref) -> tuple[bool, float, float, str]:
    from distcheck import dp

    bitwise = ex.integer and _is_pow2(N) and all(_is_pow2(s) for s in ref["sizes"])
    g = dp.gamma(ref["K"])
    worst_err, worst_bound, ok, notes = 0.0, 0.0, True, []
    for r, out in enumerate(res):
        for other, Mo in (("full", ref["M_full"]), ("numpy", ref["M_full"])):
            target = out["full"] if other == "full" else ref["full"]
            diff = _sub(out["plain"], target)
            err, b = _excess(diff, _scaled(g, ref["M_plain"], Mo))
            if bitwise:
                b = 0.0
            if err > b:
                ok = False
                notes.append(f"rank {r} vs {other}: {err:.3e} > {b:.3e}")
            if err >= worst_err:
                worst_err, worst_bound = err, b
    return ok, worst_err, worst_bound, ("bitwise" if bitwise else "bound") + ("; " + "; ".join(notes) if notes else "")


def _check_plain(ex, N, res, ref) -> tuple[bool, float, float, str]:
    from distcheck import dp

    g = dp.gamma(ref["K"])
    match_bound = _scaled(g, ref["M_plain"], ref["M_full"], ref["M_bias"])
    detect_bound = _scaled(g, ref["M_plain"], ref["M_full"])
    ok, worst_err, worst_bound, notes = True, 0.0, 0.0, []
    for r, out in enumerate(res):
        observed = _sub(out["plain"], out["full"])
        mismatch, b = _excess(_sub(observed, ref["bias"]), match_bound)
        if mismatch > b:
            ok = False
            notes.append(f"rank {r}: observed error differs from the predicted plain-mean error by {mismatch:.3e} > {b:.3e}")
        vs_numpy, b2 = _excess(_sub(out["plain"], ref["plain"]), _scaled(g, ref["M_plain"], ref["M_plain"]))
        if vs_numpy > b2:
            ok = False
            notes.append(f"rank {r}: DDP differs from numpy plain mean by {vs_numpy:.3e} > {b2:.3e}")
        err_size = _max_abs(observed)
        detected = any(np.any(np.abs(observed[k]) > detect_bound[k]) for k in observed)
        if not detected:
            ok = False
            notes.append(f"rank {r}: plain-mean error {err_size:.3e} not above the rounding bound (not detected)")
        if mismatch >= worst_err:
            worst_err, worst_bound = mismatch, b
    return ok, worst_err, worst_bound, f"plain-mean error {_max_abs(ref['bias']):.3e} predicted" + (
        "; " + "; ".join(notes) if notes else "")


def _check_weighted(ex, N, res, ref) -> tuple[bool, float, float, str]:
    from distcheck import dp

    g = dp.gamma(ref["K"] + 2)  # the hook's multiply by n_k and divide by n (loss_scale: one coefficient)
    bound = _scaled(g, ref["M_full"], ref["M_full"])
    ok, worst_err, worst_bound, notes = True, 0.0, 0.0, []
    for r, out in enumerate(res):
        for method in ("hook", "loss_scale"):
            for other, target in (("full", out["full"]), ("numpy", ref["full"])):
                err, b = _excess(_sub(out[method], target), bound)
                if err > b:
                    ok = False
                    notes.append(f"rank {r} {method} vs {other}: {err:.3e} > {b:.3e}")
                if err >= worst_err:
                    worst_err, worst_bound = err, b
    return ok, worst_err, worst_bound, "hook and loss_scale" + ("; " + "; ".join(notes) if notes else "")


def _cross_rank(res, method) -> float:
    """Largest difference between ranks' synchronised gradients (all-reduce gives every rank the same bits)."""
    return max(_max_abs(_sub(out[method], res[0][method])) for out in res)


_ROWS = (
    ("ddp.equal_shards", "equal", ("plain",), _check_equal),
    ("ddp.unequal_shards.plain", "unequal", ("plain",), _check_plain),
    ("ddp.unequal_shards.weighted", "unequal", ("hook", "loss_scale"), _check_weighted),
)


def ddp_rows(world, examples: int | dict | None = None, timeout_s: float | None = None) -> list:
    """The three DDP rows on an existing world (a RankPool, a TorchrunWorld, ...).

    ``world`` needs ``.run(fn, *args)``, ``.world_size`` and ``.backend``.
    ``examples``: per-row count (int, default 6) or a dict row name -> list of
    :class:`DDPExample`. Returns a list of :class:`distcheck.report.CheckResult`.
    Rank failures and timeouts become FAIL rows naming the error.
    """
    from distcheck.report import FAIL, PASS, SKIP, CheckResult
    from distcheck.runners.collectives import describe_failure

    N = world.world_size
    rows = []
    for name, shards, methods, check in _ROWS:
        if isinstance(examples, dict):
            exs = list(examples.get(name, ()))
        else:
            count = 6 if examples is None else check_positive_int("examples", examples)
            exs = [] if (shards == "unequal" and N < 2) else default_examples(N, shards, count)
        if not exs:
            rows.append(CheckResult(name, world.backend, SKIP, N, 0, detail="no example (unequal shards need >= 2 ranks)"))
            continue
        try:
            kwargs = {} if timeout_s is None else {"timeout_s": timeout_s}
            results = world.run(ddp_grad_checks, exs, methods, **kwargs)
        except DistributedError as exc:
            rows.append(CheckResult(name, world.backend, FAIL, N, len(exs), detail=describe_failure(exc),
                                    extra={"error": str(exc)}))
            continue
        ok_all, worst_err, worst_bound, notes = True, 0.0, 0.0, []
        for i, ex in enumerate(exs):
            res = [results[r][i] for r in range(N)]
            ok, err, b, note = check(ex, N, res, reference(ex, N))
            spread = max(_cross_rank(res, m) for m in methods)
            if spread != 0.0:
                ok = False
                note += f"; ranks disagree by {spread:.3e}"
            if not ok:
                notes.append(f"{ex}: {note}")
            ok_all &= ok
            if err >= worst_err:
                worst_err, worst_bound = err, b
        detail = notes[0] if notes else {
            "ddp.equal_shards": "DDP grad == full-batch grad (bitwise for integer, 2^k shards)",
            "ddp.unequal_shards.plain": "plain-mean error detected, == sum_k (1/(N n_k) - 1/n) G_k",
            "ddp.unequal_shards.weighted": "n_k-weighted (comm hook, loss scale) == full-batch grad",
        }[name]
        rows.append(CheckResult(name, world.backend, PASS if ok_all else FAIL, N, len(exs),
                                max_error=worst_err, bound=worst_bound, detail=detail))
    return rows


def run_ddp_checks(world_sizes: Sequence[int] = (2, 4), backend: str = "gloo", examples: int | None = None,
                   timeout_s: float = 120.0) -> list:
    """Run the DDP rows on fresh pools of each world size; return CheckResult rows.

    Rows per world size: ``ddp.equal_shards``, ``ddp.unequal_shards.plain`` (pass
    means the plain-mean error was *detected* and equals the predicted error within
    the bound), ``ddp.unequal_shards.weighted``. An unavailable backend (e.g. NCCL
    without GPUs) gives ``skip`` rows, decided before anything starts.
    ``backend``: ``"gloo"``, ``"nccl"`` or ``"threaded"`` (DDP runs on torch's
    threaded process group too).
    """
    from distcheck.report import SKIP, CheckResult
    from distcheck.runners.pool import RankPool

    check_choice("backend", backend, ("gloo", "nccl", "threaded"))
    rows = []
    for N in world_sizes:
        check_positive_int("world_size", N)
        try:
            pool = RankPool(N, backend=backend, timeout_s=timeout_s, preload=("torch._dynamo", "torch.nn.parallel"))
        except BackendUnavailable as exc:
            rows += [CheckResult(name, backend, SKIP, N, 0, detail=str(exc)) for name, *_ in _ROWS]
            continue
        with pool:
            rows += ddp_rows(pool, examples)
    return rows
