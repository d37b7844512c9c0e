"""ZeRO-1 on a real world: ``torch.distributed.optim.ZeroRedundancyOptimizer``.

Two properties, one rank function (:func:`zero1_rank`):

``zero1.params_match_single_process``
    Every rank holds the same small float64 MLP and the same batch, computes
    the full-batch gradient, and steps a ``ZeroRedundancyOptimizer`` wrapping
    Adam or SGD (momentum) for ``k`` steps; a local copy of the model is
    stepped by the plain optimizer. Claim: the parameters are **bitwise**
    equal after every step. Why bitwise: ZeRO-1 changes only *where* each
    parameter's update is computed (on its owner rank, by the same
    per-tensor optimizer arithmetic on the same gradient) and then
    broadcasts the result, which copies bits. The gradient reduction of data
    parallelism is not part of ZeRO-1 (DDP does it; see the DDP checks), so
    every rank uses the same full-batch gradient here; bound = 0.

``zero1.optimizer_bytes_per_rank``
    The optimizer state each rank allocates (sum of the local storage of the
    per-element state tensors: Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's
    ``momentum_buffer``) equals, byte for byte, the reference of
    :func:`distcheck.zero.partition` with ``scheme="zero_redundancy"``
    (whole parameters, greedy largest-first) and ``k`` = state bytes per
    element (16 for float64 Adam, 8 for float64 SGD momentum); the owner
    lists equal :func:`distcheck.zero.zero_redundancy_assignment`. Adam's
    scalar ``step`` counters (one float32 per parameter) are reported apart.
    The row also reports the imbalance ``max rank bytes / (K Psi / N)``
    against the ideal ZeRO closed form (``zero.bytes_per_gpu.stage1``:
    ``2 Psi + 2 Psi + K Psi / N``; Rajbhandari et al. 2020, Figure 1).

Works on gloo, NCCL and the threaded backend (broadcast only).
"""

from __future__ import annotations

from fractions import Fraction
from math import prod
from typing import Sequence

from distcheck.errors import ConfigError, check_choice, check_positive_int
from distcheck.report import CheckResult
from distcheck.runners.collectives import iter_pools, result_row, run_guarded, skip_row

__all__ = ["OPTIMIZERS", "build_mlp", "zero1_rank", "default_zero1_examples", "run_zero1_checks", "state_bytes_per_element"]

OPTIMIZERS = ("adam", "sgd")


def state_bytes_per_element(optimizer: str, itemsize: int = 8) -> int:
    """Per-element optimizer state: Adam keeps m and v (2 x itemsize), SGD momentum one buffer."""
    check_choice("optimizer", optimizer, OPTIMIZERS)
    return (2 if optimizer == "adam" else 1) * itemsize


def build_mlp(widths: Sequence[int], seed: int, device="cpu", bias: bool = True):
    """A float64 ``nn.Sequential`` of Linear/Tanh layers of ``widths`` with seeded weights.

    Weights come from an explicit ``torch.Generator`` (the threaded backend
    shares one global RNG between ranks), so every rank builds the same model.
    """
    import torch
    from torch import nn

    if len(widths) < 2:
        raise ConfigError("widths", list(widths), "must name at least an input and an output width")
    for w in widths:
        check_positive_int("width", w)
    gen = torch.Generator().manual_seed(seed)
    layers: list = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        lin = nn.Linear(a, b, bias=bias, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=gen, dtype=torch.float64) / a**0.5)
            if bias:
                lin.bias.copy_(torch.randn(b, generator=gen, dtype=torch.float64) * 0.1)
        layers.append(lin)
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(device)


def _optimizer(name: str):
    import torch

    return {"adam": (torch.optim.Adam, {"lr": 1e-2}), "sgd": (torch.optim.SGD, {"lr": 5e-2, "momentum": 0.9})}[name]


def zero1_rank(ctx, example: dict) -> dict:
    """Rank function for both ZeRO-1 properties.

    ``example``: ``{"widths": [in, hidden..., out], "optimizer": "adam"|"sgd",
    "steps": k >= 1, "batch": rows, "seed": int}``.

    Returns (plain Python): ``max_error`` (largest |ZeRO - single process| over
    all parameters and steps), ``bitwise`` (all equal), ``owned`` (indices into
    ``model.parameters()`` of the parameters this rank's optimizer steps, in
    torch's order), ``state_bytes`` (sum of storage bytes of the per-element
    state tensors), ``step_bytes`` (scalar step counters), ``shapes`` (all
    parameter shapes).
    """
    import copy

    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt_name = check_choice("optimizer", example["optimizer"], OPTIMIZERS)
    steps = check_positive_int("steps", example["steps"])
    seed = int(example.get("seed", 0))
    model = build_mlp(example["widths"], seed, ctx.device)
    single = copy.deepcopy(model)
    cls, kw = _optimizer(opt_name)
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kw)
    plain = cls(single.parameters(), **kw)
    gen = torch.Generator().manual_seed(seed + 1)
    batch = check_positive_int("batch", example.get("batch", 8))
    worst, bitwise = 0.0, True
    for _ in range(steps):
        x = torch.randn(batch, example["widths"][0], generator=gen, dtype=torch.float64).to(ctx.device)
        y = torch.randn(batch, example["widths"][-1], generator=gen, dtype=torch.float64).to(ctx.device)
        for net, opt in ((model, zero), (single, plain)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        for p, q in zip(model.parameters(), single.parameters()):
            worst = max(worst, (p.detach() - q.detach()).abs().max().item())
            bitwise = bitwise and torch.equal(p.detach(), q.detach())
    index = {id(p): i for i, p in enumerate(model.parameters())}
    owned = [index[id(p)] for group in zero._partition_parameters()[ctx.rank] for p in group["params"]]
    state_bytes = step_bytes = 0
    seen: set[int] = set()
    for p, st in zero.optim.state.items():
        for t in st.values():
            if not torch.is_tensor(t):
                continue
            key = t.untyped_storage().data_ptr()
            if key in seen:
                continue
            seen.add(key)
            if t.numel() == p.numel() and t.dim() > 0:
                state_bytes += t.untyped_storage().nbytes()
            else:
                step_bytes += t.untyped_storage().nbytes()
    return {
        "max_error": float(worst),
        "bitwise": bool(bitwise),
        "owned": owned,
        "state_bytes": int(state_bytes),
        "step_bytes": int(step_bytes),
        "shapes": [tuple(p.shape) for p in model.parameters()],
    }


def default_zero1_examples() -> list[dict]:
    """Two small MLPs (unequal parameter sizes, so the greedy split is uneven) x both optimizers."""
    return [
        {"widths": [6, 10, 4], "optimizer": "adam", "steps": 3, "batch": 8, "seed": 11},
        {"widths": [5, 9, 7, 3], "optimizer": "sgd", "steps": 3, "batch": 6, "seed": 12},
    ]


def run_zero1_checks(pool_or_world_sizes=(2,), *, backend: str = "gloo", examples: Sequence[dict] | None = None,
                     timeout_s: float = 60.0, expected_partition=None) -> list[CheckResult]:
    """Run both ZeRO-1 properties; two rows per world.

    Args:
        pool_or_world_sizes: a ``RankPool``, an int or a sequence of world sizes.
        backend: backend for pools opened here.
        examples: dicts as :func:`zero1_rank` takes; default :func:`default_zero1_examples`.
        expected_partition: ``f(numels, dp) -> list[list[int]]`` giving each
            rank's parameter indices; default
            :func:`distcheck.zero.zero_redundancy_assignment`. Tests pass a wrong
            one to show the byte check can fail.
    """
    from distcheck import zero as zref
    from distcheck.closed_form import get

    expected_partition = expected_partition or zref.zero_redundancy_assignment
    exs = list(examples or default_zero1_examples())
    rows: list[CheckResult] = []
    for pool, ws, be, skip in iter_pools(pool_or_world_sizes, backend, timeout_s):
        names = ("zero1.params_match_single_process", "zero1.optimizer_bytes_per_rank")
        if skip:
            rows += [skip_row(n, be, ws, skip) for n in names]
            continue
        worst, all_bitwise, err = 0.0, True, None
        bytes_ok, bytes_detail, imbalances = True, [], []
        for ex in exs:
            results, err = run_guarded(pool, zero1_rank, ex)
            if err:
                break
            worst = max(worst, *(r["max_error"] for r in results))
            all_bitwise = all_bitwise and all(r["bitwise"] for r in results)
            shapes = results[0]["shapes"]
            numels = [prod(s) for s in shapes]
            k = state_bytes_per_element(ex["optimizer"])
            part = zref.partition(shapes, ws, stage=1, scheme="zero_redundancy", weight_bytes=8, grad_bytes=8, k=k)
            expected_owned = expected_partition(numels, ws)
            for r, res in enumerate(results):
                want = k * sum(numels[i] for i in expected_owned[r])
                if sorted(res["owned"]) != sorted(expected_owned[r]):
                    bytes_ok = False
                    bytes_detail.append(f"widths={ex['widths']} rank {r}: owns {res['owned']}, reference {expected_owned[r]}")
                if expected_partition is zref.zero_redundancy_assignment:
                    want = part.per_rank[r].optimizer_bytes  # the reference's own byte count
                if res["state_bytes"] != want:
                    bytes_ok = False
                    bytes_detail.append(f"widths={ex['widths']} rank {r}: {res['state_bytes']} B of state, reference {want} B")
            psi = sum(numels)
            four_psi = 4 * psi  # the 2 Psi + 2 Psi of the closed form (bf16 weights and grads)
            ideal = Fraction(get("zero.bytes_per_gpu.stage1").evaluate(params=psi, dp=ws, k=k)) - four_psi
            most = max(r["state_bytes"] for r in results)
            imbalances.append((ex["widths"], most, ideal))
        if err:
            rows += [result_row(n, be, ws, len(exs), False, detail=err) for n in names]
            continue
        rows.append(result_row(
            names[0], be, ws, len(exs), worst == 0.0, max_error=worst, bound=0.0,
            detail=("bitwise equal to single-process Adam/SGD after every step" if worst == 0.0
                    else f"max |ZeRO - single| = {worst:.3e} (bitwise expected)"),
        ))
        imb = "; ".join(f"widths={w}: max {m} B vs K*Psi/N = {float(i):g} B (x{float(m / i):.3f})" for w, m, i in imbalances)
        rows.append(result_row(
            names[1], be, ws, len(exs), bytes_ok, max_error=0.0 if bytes_ok else None, bound=0.0,
            detail=(bytes_detail[0] if bytes_detail else "per-rank optimizer bytes = whole-parameter reference; " + imb),
            extra={"imbalance": [(w, m, str(i)) for w, m, i in imbalances]},
        ))
    return rows
