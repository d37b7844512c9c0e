"""Real-backend checks of ``torch.distributed.pipelining``: its tables, what it executes, its gradients.

Found by :func:`distcheck.stages.discover_checks` (this module's ``world_rows`` and
``world_free_rows``; stage ``layers``). torch is imported inside the functions only.

``pp.table.<Schedule>`` (no process group, backend ``"torch-table"``; :mod:`.tables`)
    Each torch schedule's own action table, replayed through the simulator (dependencies, W
    after its I, no deadlock), equals the simulator's own schedule: the order action for
    action, the step, bubble and peak in flight (p = 1..4, m = p..8, smallest first). Every
    torch schedule has its simulator schedule (:data:`.tables.TORCH_SCHEDULES`).
``pp.executed_order.<Schedule>`` (gloo/NCCL)
    On a real world, the compute actions each rank runs (recorded by wrapping the stage's
    ``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk``) equal the
    rank's table, blanks dropped (an overlapped pair as its forward then its backward).
``pp.executed_timeline.<Schedule>`` (gloo/NCCL)
    The executed orders of all ranks, replayed (the table's overlapped pairs kept where the
    executed order is the table's), give the simulator's step, bubble and peak in flight.
``pp.grads.<Schedule>`` (gloo/NCCL)
    After one ``step``, every stage's gradients equal those of the unsplit model run on the
    whole batch, **bitwise**: inputs and targets are small integers, weights integers / 8,
    the layers Linear + ReLU, the loss a sum of squares with ``scale_grads=False``, so every
    per-micro-batch gradient and their sum over micro-batches are exact in float64.

Point-to-point send/recv is required: the threaded backend gives ``skip`` rows. The
recorded upstream discrepancies of these checks are :mod:`distcheck.parallel.pp.findings`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distcheck.core.errors import ConfigError, DistributedError
from distcheck.core.results import FAIL, PASS, SKIP, CheckResult
from distcheck.core.validate import check_choice, check_positive_int
from distcheck.engine.drivers import describe_failure
from distcheck.engine.world import RankContext, World
from distcheck.parallel.pp.actions import Action, DeadlockError
from distcheck.parallel.pp.schedules import placement, simulate
from distcheck.parallel.pp.simulator import replay
from distcheck.parallel.pp.tables import COSTS, TORCH_SCHEDULES, _schedule_class, check_table, run_table_checks

if TYPE_CHECKING:
    import torch

__all__ = ["STAGE", "PRELOAD", "SCHEDULES", "world_rows", "world_free_rows", "pipeline_rank", "schedule_step",
           "default_pipeline_examples", "run_pipelining_checks", "check_table", "run_table_checks"]

#: the stage of ``distcheck check`` these checks join
STAGE = "layers"
#: modules a pool's parent imports before forking its ranks
PRELOAD = ("torch.distributed.pipelining",)
#: the torch schedules checked on a world (every one: :data:`.tables.TORCH_SCHEDULES`)
SCHEDULES = tuple(TORCH_SCHEDULES)


def world_free_rows() -> list[CheckResult]:
    """The ``pp.table.*`` rows (torch, no world)."""
    return run_table_checks()


def world_rows(world: World, *, timeout_s: float = 120.0) -> list[CheckResult]:
    """The grads, executed-order and executed-timeline rows of every schedule on ``world``."""
    return run_pipelining_checks(world, tables=False)


def _row(check: str, backend: str, world_size: int, ok: bool, detail: str, *, max_error: float | None = None,
         bound: float | None = 0.0) -> CheckResult:
    return CheckResult(check, backend, PASS if ok else FAIL, world_size, 1, max_error=max_error, bound=bound,
                       detail=detail)


# --------------------------------------------------------------------------- the rank function


def _blocks(num_stages: int, d: int, seed: int) -> list[torch.nn.Sequential]:
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for s in range(num_stages):
        lin = nn.Linear(d, d, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randint(-4, 5, (d, d), generator=gen).double() / 8)
            lin.bias.copy_(torch.randint(-4, 5, (d,), generator=gen).double() / 8)
        blocks.append(nn.Sequential(lin, nn.ReLU()) if s < num_stages - 1 else nn.Sequential(lin))
    return blocks


def _sum_sq_loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return 0.5 * (y - t).pow(2).sum()


def _record(stage: Any, log: list) -> None:
    """Wrap a stage's compute methods so each call appends (kind, stage, micro-batch)."""
    fwd, bwd, bww = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    idx = stage.stage_index

    def forward_one_chunk(fwd_chunk_id: int, *a: Any, **k: Any) -> Any:
        log.append(("F", idx, fwd_chunk_id))
        return fwd(fwd_chunk_id, *a, **k)

    def backward_one_chunk(bwd_chunk_id: int, *a: Any, **k: Any) -> Any:
        full = k.get("full_backward", a[1] if len(a) > 1 else True)
        log.append(("B" if full else "I", idx, bwd_chunk_id))
        return bwd(bwd_chunk_id, *a, **k)

    def backward_weight_one_chunk(bwd_chunk_id: int, *a: Any, **k: Any) -> Any:
        log.append(("W", idx, bwd_chunk_id))
        return bww(bwd_chunk_id, *a, **k)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _table_units(actions: list) -> list:
    """The rank's table as ``(kind, stage, mb)`` triples, an overlapped pair as a list of two."""
    out: list[tuple[str, int, int] | list[tuple[str, int, int]]] = []
    for u in actions:
        if isinstance(u, tuple):
            out.append([(a.kind, a.stage, a.microbatch) for a in u])
        else:
            out.append((u.kind, u.stage, u.microbatch))
    return out


def pipeline_rank(ctx: RankContext, example: dict) -> dict:
    """Rank function: one ``step`` of a torch schedule against the unsplit model.

    ``example``: ``{"schedule": a key of TORCH_SCHEDULES, "m": micro-batches, "d": width,
    "rows_per_mb": int, "seed": int}``; ``p`` = world size. Returns :func:`schedule_step`'s dict.
    """
    name = check_choice("schedule", example["schedule"], SCHEDULES)
    sim, v = TORCH_SCHEDULES[name]
    return schedule_step(ctx, _schedule_class(name), sim, v, example)


def schedule_step(ctx: RankContext, cls: type, schedule: str, v: int, example: dict) -> dict:
    """One ``step`` of the torch schedule class ``cls`` (a ``PipelineScheduleSingle`` when
    ``v == 1``, else ``PipelineScheduleMulti``) on this rank's stages, placed as the simulator's
    ``schedule`` places them, against the unsplit model on the whole batch.

    ``example``: ``m``, and optionally ``d`` (width, 4), ``rows_per_mb`` (2), ``seed`` (0).
    Returns plain Python: ``max_error`` and ``bitwise`` over the gradients of this rank's
    stages, ``executed`` (the ``(kind, stage, mb)`` it ran, in order) and ``table`` (its
    compute actions from the schedule's own ``pipeline_order``, blanks dropped; an overlapped
    pair as a list of two).
    """
    import torch
    from torch.distributed.pipelining import PipelineStage

    from distcheck.parallel.pp.reference import from_torch_actions

    p, r = ctx.world_size, ctx.rank
    m = check_positive_int("m", example["m"])
    d = check_positive_int("d", example.get("d", 4))
    rows = check_positive_int("rows_per_mb", example.get("rows_per_mb", 2))
    num_stages = v * p
    blocks = _blocks(num_stages, d, int(example.get("seed", 0)))
    where = placement(schedule, p, v).tolist()
    mine = [s for s in range(num_stages) if where[s] == r]
    log: list = []
    stages = []
    for s in mine:
        st = PipelineStage(copy.deepcopy(blocks[s]).to(ctx.device), s, num_stages, ctx.device)
        _record(st, log)
        stages.append(st)
    sched = cls(stages[0] if v == 1 else stages, n_microbatches=m, loss_fn=_sum_sq_loss, scale_grads=False)
    gen = torch.Generator().manual_seed(int(example.get("seed", 0)) + 1)
    x = torch.randint(-2, 3, (m * rows, d), generator=gen).double().to(ctx.device)
    t = torch.randint(-2, 3, (m * rows, d), generator=gen).double().to(ctx.device)
    args = (x,) if 0 in mine else ()
    kwargs = {"target": t} if num_stages - 1 in mine else {}
    sched.step(*args, **kwargs)
    ref = torch.nn.Sequential(*[copy.deepcopy(b) for b in blocks]).to(ctx.device)
    _sum_sq_loss(ref(x), t).backward()
    worst, bitwise = 0.0, True
    for st, s in zip(stages, mine, strict=True):
        for a, b in zip(st.submod.parameters(), ref[s].parameters(), strict=True):
            assert a.grad is not None and b.grad is not None, "every parameter takes part in the loss"
            worst = max(worst, (a.grad - b.grad).abs().max().item())
            bitwise = bitwise and torch.equal(a.grad, b.grad)
    table = _table_units(from_torch_actions({r: sched.pipeline_order[r]}, pairs=True)[r])
    return {"max_error": float(worst), "bitwise": bool(bitwise), "executed": [tuple(a) for a in log], "table": table}


# --------------------------------------------------------------------------- the parent's checks


def _flat(table: list) -> list[tuple]:
    return [tuple(a) for u in table for a in (u if isinstance(u, list) else [u])]


def _executed_vs_simulator(schedule: str, p: int, m: int, results: list) -> tuple[bool, str]:
    """Replay what the ranks executed; compare with the simulator's schedule (the lesson's costs)."""
    sim, v = TORCH_SCHEDULES[schedule]
    order = {}
    for rk, res in enumerate(results):
        executed = [tuple(a) for a in res["executed"]]
        if executed == _flat(res["table"]):  # the table's overlapped pairs, as the ranks ran them
            units = [tuple(Action(k, mb, st) for k, st, mb in u) if isinstance(u, list) else Action(u[0], u[2], u[1])
                     for u in res["table"]]
        else:
            units = [Action(k, mb, st) for k, st, mb in executed]
        order[rk] = units
    try:
        tl = replay(order, v * p, m, stage_to_rank=placement(sim, p, v).tolist(), **COSTS)
        want = simulate(sim, p, m, v, t_f=COSTS["t_f"], t_b=COSTS["t_b"], t_fb=COSTS["t_fb"])
    except (ConfigError, DeadlockError) as exc:
        return False, f"p={p}, m={m}: the executed order does not replay: {exc}"
    got = (tl.step_ticks, tl.bubble_fraction, tl.peak_in_flight)
    exp = (want.step_ticks, want.bubble_fraction, want.peak_in_flight)
    if got != exp:
        return False, (f"p={p}, m={m}: executed step/bubble/peak {got[0]}, {got[1]}, {list(got[2])} != simulator's "
                       f"{sim} {exp[0]}, {exp[1]}, {list(exp[2])}")
    return True, (f"p={p}, m={m}: the executed order replays to step {got[0]}, bubble {got[1]}, peak {list(got[2])} "
                  f"= simulator's {sim}")


def default_pipeline_examples(world_size: int) -> list[dict]:
    """Every schedule at ``m = 2p`` (a multiple of p, >= 2p for ZB-V and DualPipeV)."""
    return [{"schedule": name, "m": 2 * world_size, "d": 4, "rows_per_mb": 2, "seed": 41} for name in SCHEDULES]


def run_pipelining_checks(world: World, *, examples: Sequence[dict] | None = None,
                          tables: bool = True) -> list[CheckResult]:
    """The table rows (:func:`run_table_checks`, if ``tables``) plus, for each example on
    ``world`` (any object with ``.run``, ``.world_size`` and ``.backend``), its grads,
    executed-order and executed-timeline rows; ``skip`` rows on a backend without send/recv."""
    rows: list[CheckResult] = run_table_checks() if tables else []
    ws, be = world.world_size, world.backend
    for ex in examples or default_pipeline_examples(ws):
        name = ex["schedule"]
        checks = (f"pp.grads.{name}", f"pp.executed_order.{name}", f"pp.executed_timeline.{name}")
        if be not in ("gloo", "nccl"):
            reason = f"backend {be!r} has no point-to-point send/recv; pipelining needs gloo or nccl processes"
            rows += [CheckResult(c, be, SKIP, ws, 0, detail=reason) for c in checks]
            continue
        try:
            results = world.run(pipeline_rank, ex)
        except DistributedError as exc:
            rows += [_row(c, be, ws, False, f"m={ex['m']}: {describe_failure(exc)}", bound=None) for c in checks]
            continue
        worst = max(r["max_error"] for r in results)
        ok = all(r["bitwise"] for r in results)
        rows.append(_row(checks[0], be, ws, ok, f"m={ex['m']}: gradients bitwise equal to the unsplit model" if ok
                         else f"m={ex['m']}: max gradient error {worst:.3e}; bitwise expected", max_error=worst))
        diffs = [(rk, [tuple(a) for a in res["executed"]], _flat(res["table"])) for rk, res in enumerate(results)
                 if [tuple(a) for a in res["executed"]] != _flat(res["table"])]
        if diffs:
            rk, done, tab = diffs[0]
            k = next((i for i, (a, b) in enumerate(zip(done, tab, strict=False)) if a != b), min(len(done), len(tab)))
            detail = f"p={ws}, m={ex['m']}, rank {rk}: first difference at position {k}: executed {done[k:k + 3]} " \
                     f"vs table {tab[k:k + 3]}"
        else:
            detail = f"p={ws}, m={ex['m']}: every rank executed its table's compute order"
        rows.append(_row(checks[1], be, ws, not diffs, detail))
        sim_ok, sim_detail = _executed_vs_simulator(name, ws, ex["m"], results)
        rows.append(_row(checks[2], be, ws, sim_ok, sim_detail))
    return rows

