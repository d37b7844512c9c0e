"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on a real world, against single-process training.

Rank function :func:`fsdp_rank`; driver :func:`run_fsdp_checks`. Properties:

``fsdp2.params_match_single_process[reshard=True|False]``
    A float64 MLP (Linear/ReLU) is sharded with ``fully_shard`` on every
    Linear and on the root, with ``reshard_after_forward`` True (ZeRO-3: the
    parameters are gathered again for backward) or False (kept gathered,
    ZeRO-2-like). Each rank trains on its own rows of the batch with a
    **sum** loss (``0.5 * ||y - t||^2`` summed over rows) and gradient divide
    factor 1, so the reduce-scatter sums the per-rank gradients into the
    full-batch gradient. A local unsharded copy trains on the whole batch.
    Claim: **bitwise** equal parameters after every step. Why exact: inputs
    and targets are small integers, weights are multiples of 1/8, and the
    learning rate is a power of two, so every product and sum of forward,
    backward and the cross-rank gradient sum is a dyadic rational well below
    2**53: exact in float64, whatever the order of summation. That holds for
    SGD for the ``k = 2`` steps used here with a global batch of at most 16
    rows (:func:`default_fsdp_examples` caps it), and for Adam's first step (Adam's
    update is elementwise, so on exact gradients the shard computes the same
    bits as the full tensor). Beyond that, sums are reordered between the
    sharded and unsharded runs and results differ by rounding; distcheck does
    not claim a bound there, so it does not test it.

``fsdp2.bytes_per_rank``
    Per-rank bytes of the sharded parameters, gradients and optimizer state,
    measured as the sum of the distinct local storages (``DTensor.to_local()
    .untyped_storage().nbytes()``), equal the reference
    :func:`distcheck.zero.fsdp2_shard_elements` byte for byte:

    - parameters and gradients: **padded** (dim 0 padded to a multiple of N,
      every rank allocates ``ceil(dim0/N) * prod(shape[1:])`` per parameter;
      the gradients live in the padded reduce-scatter output buffer);
    - optimizer state: **unpadded** (``padded=False``): Adam's ``exp_avg`` and
      ``exp_avg_sq`` are ``zeros_like`` of the local view, which holds only the
      real rows, so the trailing ranks allocate less than the padded reference
      (a finding: the padded ZeRO-3 reference overstates FSDP2's optimizer
      state when N does not divide dim 0).

    The row also reports the imbalance of the fullest rank against ZeRO-3's
    ideal ``(4 + K) Psi / N`` (``zero.bytes_per_gpu.stage3``; Rajbhandari et
    al. 2020, Figure 1) with ``4 + K`` = this run's bytes per parameter
    (8 + 8 + 16 for float64 Adam, 8 + 8 for plain SGD).

Runs on gloo, NCCL and threaded (FSDP2 supports CPU with gloo in torch 2.13).
"""

from __future__ import annotations

from typing import Sequence

from distcheck.errors import ConfigError, check_choice, check_positive_int
from distcheck.report import CheckResult
from distcheck.runners.collectives import chunk_bounds, iter_pools, result_row, run_guarded, skip_row

__all__ = ["fsdp_rank", "default_fsdp_examples", "run_fsdp_checks", "dyadic_mlp", "MAX_DEFAULT_BATCH"]


def dyadic_mlp(widths: Sequence[int], seed: int, device="cpu"):
    """A float64 Linear/ReLU MLP whose weights and biases are integers / 8 (exact in float64)."""
    import torch
    from torch import nn

    if len(widths) < 2:
        raise ConfigError("widths", list(widths), "must name at least an input and an output width")
    gen = torch.Generator().manual_seed(seed)
    layers: list = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        check_positive_int("width", a)
        check_positive_int("width", b)
        lin = nn.Linear(a, b, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randint(-4, 5, (b, a), generator=gen).double() / 8)
            lin.bias.copy_(torch.randint(-4, 5, (b,), generator=gen).double() / 8)
        layers.append(lin)
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(device)


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        s = local.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def fsdp_rank(ctx, example: dict) -> dict:
    """Rank function for both FSDP2 properties.

    ``example``: ``{"widths": [...], "optimizer": "sgd"|"adam", "steps": k,
    "rows_per_rank": b, "reshard_after_forward": bool, "seed": int}``; instead
    of ``rows_per_rank``, ``"batch": B`` fixes the global batch, split over the
    ranks like ``numpy.array_split`` (ranks ``r >= B`` get no rows and still
    take part in every collective).

    Returns (plain Python): ``max_error`` and ``bitwise`` (sharded vs single
    process after every step), ``param_bytes``, ``grad_bytes``,
    ``optim_bytes`` (sums of distinct local storages, measured after the last
    backward and step), ``shapes``.
    """
    import copy

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    opt_name = check_choice("optimizer", example["optimizer"], ("sgd", "adam"))
    steps = check_positive_int("steps", example["steps"])
    n, r = ctx.world_size, ctx.rank
    if "batch" in example:
        total = check_positive_int("batch", example["batch"])
        lo, hi = chunk_bounds(total, n)[r]
    else:
        rows = check_positive_int("rows_per_rank", example["rows_per_rank"])
        total, lo, hi = n * rows, r * rows, (r + 1) * rows
    reshard = example["reshard_after_forward"]
    if not isinstance(reshard, bool):
        raise ConfigError("reshard_after_forward", reshard, "must be a bool")
    widths, seed = example["widths"], int(example.get("seed", 0))
    model = dyadic_mlp(widths, seed, ctx.device)
    single = copy.deepcopy(model)
    shapes = [tuple(p.shape) for p in model.parameters()]
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    sharded = [m for m in model if isinstance(m, torch.nn.Linear)] + [model]
    for m in sharded:
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    for m in sharded:
        m.set_gradient_divide_factor(1.0)  # sum, not mean, across ranks
    make = (lambda ps: torch.optim.SGD(ps, lr=2.0**-6)) if opt_name == "sgd" else (lambda ps: torch.optim.Adam(ps, lr=2.0**-6))
    opt, opt_single = make(model.parameters()), make(single.parameters())
    gen = torch.Generator().manual_seed(seed + 1)
    worst, bitwise, grad_bytes = 0.0, True, 0
    for _ in range(steps):
        x = torch.randint(-3, 4, (total, widths[0]), generator=gen).double().to(ctx.device)
        t = torch.randint(-3, 4, (total, widths[-1]), generator=gen).double().to(ctx.device)
        mine = slice(lo, hi)
        opt.zero_grad()
        (0.5 * (model(x[mine]) - t[mine]).pow(2).sum()).backward()
        grad_bytes = _storage_bytes([p.grad for p in model.parameters()])
        opt.step()
        opt_single.zero_grad()
        (0.5 * (single(x) - t).pow(2).sum()).backward()
        opt_single.step()
        for p, q in zip(model.parameters(), single.parameters()):
            full = p.full_tensor().detach()
            worst = max(worst, (full - q.detach()).abs().max().item())
            bitwise = bitwise and torch.equal(full, q.detach())
    optim_tensors = [v for st in opt.state.values() for k, v in st.items() if k != "step" and torch.is_tensor(v)]
    return {
        "max_error": float(worst),
        "bitwise": bool(bitwise),
        "param_bytes": _storage_bytes(list(model.parameters())),
        "grad_bytes": int(grad_bytes),
        "optim_bytes": _storage_bytes(optim_tensors) if optim_tensors else 0,
        "shapes": shapes,
    }


#: the largest global batch (rows) of the default examples; see default_fsdp_examples
MAX_DEFAULT_BATCH = {"sgd": 16, "adam": 24}


def default_fsdp_examples(world_size: int = 4) -> list[dict]:
    """SGD x 2 steps and Adam x 1 step, each with reshard_after_forward True and False.

    Widths are chosen so that dim 0 of some parameters (7, 3) is not a
    multiple of 2 or 4: padding and empty trailing shards are exercised.

    Global batch: 2 rows per rank (SGD) and 3 (Adam) up to 8 ranks, then
    capped at :data:`MAX_DEFAULT_BATCH` (16 and 24 rows; ranks beyond get no
    rows). The cap keeps the bitwise claim true at any world size: the second
    SGD step multiplies weights on the 2**-15 grid (1/8 minus 2**-6 times a
    gradient on the 2**-9 grid) and accumulates weight gradients on the 2**-45
    grid, so they are exact while their magnitude stays below 2**(53-45);
    a batch that grows with the world breaks that (seen: 64 rows at 32 ranks,
    differences of 2**-50).
    """
    n = check_positive_int("world_size", world_size)
    out = []
    for reshard in (True, False):
        out.append({"widths": [5, 7, 3], "optimizer": "sgd", "steps": 2,
                    "batch": min(2 * n, MAX_DEFAULT_BATCH["sgd"]), "reshard_after_forward": reshard, "seed": 21})
        out.append({"widths": [4, 6, 5, 2], "optimizer": "adam", "steps": 1,
                    "batch": min(3 * n, MAX_DEFAULT_BATCH["adam"]), "reshard_after_forward": reshard, "seed": 22})
    return out


def _optim_k(opt: str) -> int:
    return 16 if opt == "adam" else 0  # plain SGD keeps no state


def run_fsdp_checks(pool_or_world_sizes=(2,), *, backend: str = "gloo", examples: Sequence[dict] | None = None,
                    timeout_s: float = 60.0, padded_params: bool = True) -> list[CheckResult]:
    """Run the FSDP2 properties: one parameter row per ``reshard_after_forward`` value, one bytes row.

    ``padded_params=False`` compares the parameter bytes with the *unpadded*
    reference instead (wrong for FSDP2 when N does not divide dim 0; tests use
    it to show the byte check can fail).
    """
    from fractions import Fraction
    from math import prod

    from distcheck import zero as zref
    from distcheck.closed_form import get

    stage3 = get("zero.bytes_per_gpu.stage3")
    rows: list[CheckResult] = []
    for pool, ws, be, skip in iter_pools(pool_or_world_sizes, backend, timeout_s):
        exs = list(examples or default_fsdp_examples(ws))
        reshards = sorted({e["reshard_after_forward"] for e in exs}, reverse=True)
        names = [f"fsdp2.params_match_single_process[reshard={v}]" for v in reshards] + ["fsdp2.bytes_per_rank"]
        if skip:
            rows += [skip_row(nm, be, ws, skip) for nm in names]
            continue
        per_reshard = {v: [0.0, True, 0] for v in reshards}
        bytes_bad: list[str] = []
        imbalances: list[tuple] = []
        err = None
        for ex in exs:
            results, err = run_guarded(pool, fsdp_rank, ex)
            if err:
                break
            acc = per_reshard[ex["reshard_after_forward"]]
            acc[0] = max(acc[0], *(res["max_error"] for res in results))
            acc[1] = acc[1] and all(res["bitwise"] for res in results)
            acc[2] += 1
            shapes = results[0]["shapes"]
            padded = zref.fsdp2_shard_elements(shapes, ws, padded=True)
            unpadded = zref.fsdp2_shard_elements(shapes, ws, padded=False)
            want_params = padded if padded_params else unpadded
            k = _optim_k(ex["optimizer"])
            for r, res in enumerate(results):
                for what, got, want in (("params", res["param_bytes"], 8 * want_params[r]),
                                        ("grads", res["grad_bytes"], 8 * padded[r]),
                                        ("optimizer state", res["optim_bytes"], k * unpadded[r])):
                    if got != want:
                        bytes_bad.append(f"widths={ex['widths']} rank {r}: {what} {got} B, reference {want} B")
            # ideal ZeRO-3 (P_os+g+p): (4 + K) Psi / N with 4 + K = the bytes per parameter here
            # (8 float64 weights + 8 float64 grads + k of optimizer state), exact because the form is linear in K
            psi = sum(prod(sh) for sh in shapes)
            ideal = Fraction(stage3.evaluate(params=psi, dp=ws, k=8 + 8 + k - 4))
            most = max(res["param_bytes"] + res["grad_bytes"] + res["optim_bytes"] for res in results)
            imbalances.append((ex["widths"], ex["optimizer"], most, ideal))
        if err:
            rows += [result_row(nm, be, ws, len(exs), False, detail=err) for nm in names]
            continue
        for v in reshards:
            worst, bitwise, count = per_reshard[v]
            rows.append(result_row(
                f"fsdp2.params_match_single_process[reshard={v}]", be, ws, count, bitwise and worst == 0.0,
                max_error=worst, bound=0.0,
                detail="bitwise equal to single-process SGD (2 steps) and Adam (1 step) on exact dyadic data"
                if bitwise else f"max |FSDP2 - single| = {worst:.3e}; bitwise expected (exact dyadic arithmetic)",
            ))
        seen, imb = set(), []
        for w, opt, m, i in imbalances:
            if (tuple(w), opt) not in seen:
                seen.add((tuple(w), opt))
                imb.append(f"widths={w} {opt}: max {m} B vs (4+K)*Psi/N = {float(i):g} B (x{float(m / i):.3f})")
        rows.append(result_row(
            "fsdp2.bytes_per_rank", be, ws, len(exs), not bytes_bad, max_error=None, bound=0.0,
            detail=bytes_bad[0] if bytes_bad else
            "params and grads = dim-0 padded reference; optimizer state = unpadded local rows (finding); "
            + "; ".join(imb),
            extra={"imbalance": [(w, opt, m, str(i)) for w, opt, m, i in imbalances]},
        ))
    return rows
