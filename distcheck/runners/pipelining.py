"""``torch.distributed.pipelining`` schedules: their tables, what they execute, and their gradients.

Three properties.

``pp.table.<Schedule>`` (no process group, backend ``"torch-table"``)
    Each schedule's own per-rank action table (``pipeline_order``) is built
    without a process group, the way torch's schedule visualizer does it
    (``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops``:
    the schedule class is instantiated over ``mock.create_autospec(PipelineStage)``
    stages that only carry ``group_rank``, ``group_size`` and ``num_stages``).
    The table is replayed with :func:`distcheck.pipeline.replay` (``None``
    slots are idle placeholders: the order is replayed, blanks are not
    counted) under the lesson's tick costs (F = 1, B = 2; I = W = 1 when the
    backward is split) and must give the same ``step_ticks``,
    ``bubble_fraction`` and ``peak_in_flight`` as
    :func:`distcheck.pipeline.simulate` (GPipe -> ``gpipe``, 1F1B -> ``1f1b``,
    Interleaved1F1B -> ``interleaved``). Zero-bubble tables
    (``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
    ``ScheduleDualPipeV``) have no distcheck simulator: for them the table
    must replay as a complete, deadlock-free order, and the row reports its
    step time, bubble and peak. A disagreement is a FAIL reported with the
    smallest ``(p, m)`` of the scan. In torch 2.13 ``Schedule1F1B``'s table is
    wrong on the last rank (it starts at micro-batch 1 and names micro-batch
    ``m``, which does not exist; smallest case p = 1, m = 1): that exact detail
    is a recorded finding (:mod:`distcheck.runners.findings`).

``pp.executed_order.<Schedule>`` (gloo/NCCL)
    On a real world, the compute actions each rank actually runs (recorded by
    wrapping the stage's ``forward_one_chunk`` / ``backward_one_chunk`` /
    ``backward_weight_one_chunk``) must equal the rank's table, blanks
    dropped. A difference is a FAIL (the 1F1B one, exactly as recorded, a finding).

``pp.executed_timeline.<Schedule>`` (gloo/NCCL; schedules with a simulator)
    The executed orders of all ranks, replayed, give the simulator's step
    time, bubble and peak in flight. (For Schedule1F1B this passes while the
    table fails: torch runs the right order, only its table is wrong.)

``pp.grads.<Schedule>`` (gloo/NCCL)
    The parameters' gradients after one ``step`` equal those of the unsplit
    model run on the whole batch, **bitwise**: inputs and targets are small
    integers, weights integers / 8, the layers Linear + ReLU, the loss a sum
    of squares with ``scale_grads=False``, so every per-micro-batch gradient
    and the accumulation over micro-batches are exact in float64.

Point-to-point send/recv is required, so the world schedules need gloo or
NCCL processes; the threaded backend has no send/recv (``skip``).
"""

from __future__ import annotations

from typing import Sequence

from distcheck.errors import ConfigError, check_choice, check_positive_int
from distcheck.report import CheckResult
from distcheck.runners.collectives import iter_pools, result_row, run_guarded, skip_row

__all__ = [
    "SCHEDULES",
    "torch_table",
    "table_timeline",
    "check_table",
    "run_table_checks",
    "pipeline_rank",
    "default_pipeline_examples",
    "run_pipelining_checks",
]

#: torch schedule class name -> (distcheck simulator name or None, stages per rank v, placement style)
SCHEDULES: dict[str, tuple[str | None, int, str]] = {
    "ScheduleGPipe": ("gpipe", 1, "loop"),
    "Schedule1F1B": ("1f1b", 1, "loop"),
    "ScheduleInterleaved1F1B": ("interleaved", 2, "loop"),
    "ScheduleInterleavedZeroBubble": (None, 2, "loop"),
    "ScheduleZBVZeroBubble": (None, 2, "v"),
    "ScheduleDualPipeV": (None, 2, "v"),
}


def _schedule_class(name: str):
    from torch.distributed.pipelining import schedules

    check_choice("schedule", name, tuple(SCHEDULES))
    return getattr(schedules, name)


def torch_table(schedule: str, p: int, m: int, v: int | None = None):
    """The schedule's ``pipeline_order`` for ``p`` ranks and ``m`` micro-batches, without a process group.

    Returns ``list[list[_Action | None]]`` (index = rank). ``v`` defaults to
    the schedule's stages per rank (:data:`SCHEDULES`). Raises whatever torch
    raises for shapes it refuses (e.g. ValueError for m not a multiple of the
    rounds of Interleaved1F1B).
    """
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    check_positive_int("p", p)
    check_positive_int("m", m)
    v = SCHEDULES[schedule][1] if v is None else v
    return get_schedule_ops(_schedule_class(schedule), p, m, num_stages_per_rank=v)


def table_timeline(schedule: str, p: int, m: int):
    """``replay`` of the torch table under t_f = 1, t_b = 2 (I = W = 1)."""
    from distcheck import pipeline

    v = SCHEDULES[schedule][1]
    return pipeline.replay(pipeline.from_torch_actions(torch_table(schedule, p, m)), v * p, m, t_f=1, t_b=2)


def check_table(schedule: str, p: int, m: int) -> tuple[bool | None, str]:
    """Compare one table with the simulator. Returns ``(ok, detail)``.

    ``ok`` is None when torch or the simulator refuses the shape (torch's
    Interleaved1F1B accepts m that is not a multiple of p, distcheck's
    ``interleaved`` does not).
    """
    from distcheck import pipeline

    sim_name, v, _ = SCHEDULES[schedule]
    try:
        table = torch_table(schedule, p, m)
    except (ValueError, AssertionError, RuntimeError) as exc:
        return None, f"torch refuses p={p}, m={m}: {str(exc).splitlines()[0][:120]}"
    try:
        tl = pipeline.replay(pipeline.from_torch_actions(table), v * p, m, t_f=1, t_b=2)
    except (ConfigError, pipeline.DeadlockError) as exc:
        return False, f"p={p}, m={m}: torch's table does not replay: {exc}"
    got = (tl.step_ticks, tl.bubble_fraction, tl.peak_in_flight)
    if sim_name is None:
        return True, f"p={p}, m={m}: step {tl.step_ticks} ticks, bubble {tl.bubble_fraction}, peak {list(tl.peak_in_flight)}"
    try:
        sim = pipeline.simulate(sim_name, p, m, v)
    except ConfigError as exc:  # e.g. torch's flexible interleaving (m not a multiple of p)
        return None, f"distcheck's simulator refuses p={p}, m={m}: {exc}"
    want = (sim.step_ticks, sim.bubble_fraction, sim.peak_in_flight)
    if got != want:
        return False, (f"p={p}, m={m}: torch table step/bubble/peak {got[0]}, {got[1]}, {list(got[2])} "
                       f"!= simulator {want[0]}, {want[1]}, {list(want[2])}")
    return True, f"p={p}, m={m}: step {tl.step_ticks}, bubble {tl.bubble_fraction}, peak {list(tl.peak_in_flight)} = simulator"


def run_table_checks(schedules: Sequence[str] | None = None, *, max_p: int = 4, max_m: int = 8) -> list[CheckResult]:
    """One row per schedule: scan ``1 <= p <= max_p``, ``p <= m <= max_m`` (smallest first) and stop at the first disagreement.

    Shapes torch refuses are counted out (not examples). A schedule torch
    refuses at every scanned shape gets a ``skip`` row. The tables are built
    in this one process without a process group, so every row has
    ``world_size`` 1 and backend ``"torch-table"``; the p and m of the shapes
    (the smallest disagreeing one, or the scanned range) are in the detail.
    """
    rows = []
    for name in schedules or SCHEDULES:
        check = f"pp.table.{name}"
        tried, first_fail, last = 0, None, ""
        for p in range(1, max_p + 1):
            for m in range(p, max_m + 1):
                ok, detail = check_table(name, p, m)
                if ok is None:
                    continue
                tried += 1
                last = detail
                if not ok:
                    first_fail = detail
                    break
            if first_fail:
                break
        if tried == 0:
            rows.append(skip_row(check, "torch-table", 1, "torch refuses every scanned (p, m)"))
            continue
        ok = first_fail is None
        # no world runs here: world_size is 1 (one process); the shapes are in the detail
        rows.append(result_row(check, "torch-table", 1, tried, ok, bound=0.0,
                               detail=(f"smallest disagreement: {first_fail}" if not ok else
                                       f"all {tried} shapes of p = 1..{max_p}, m = p..{max_m} agree; last {last}")))
    return rows


# --------------------------------------------------------------------------- real world


def _blocks(num_stages: int, d: int, seed: int):
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


def _sum_sq_loss(y, t):
    return 0.5 * (y - t).pow(2).sum()


def _record(stage, log: list) -> None:
    """Wrap a stage's compute methods so each call appends (kind, stage, micro-batch)."""
    fwd, bwd, bww = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    idx = stage.stage_index

    def forward_one_chunk(fwd_chunk_id, *a, **k):
        log.append(("F", idx, fwd_chunk_id))
        return fwd(fwd_chunk_id, *a, **k)

    def backward_one_chunk(bwd_chunk_id, *a, **k):
        full = k.get("full_backward", a[1] if len(a) > 1 else True)
        log.append(("B" if full else "I", idx, bwd_chunk_id))
        return bwd(bwd_chunk_id, *a, **k)

    def backward_weight_one_chunk(bwd_chunk_id, *a, **k):
        log.append(("W", idx, bwd_chunk_id))
        return bww(bwd_chunk_id, *a, **k)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def pipeline_rank(ctx, example: dict) -> dict:
    """Rank function: one ``step`` of a torch schedule vs the unsplit model.

    ``example``: ``{"schedule": name in SCHEDULES, "m": micro-batches,
    "d": width, "rows_per_mb": int, "seed": int}``; ``p`` = world size.

    Returns (plain Python): ``max_error`` and ``bitwise`` over the gradients of
    this rank's stages, ``executed`` (list of ``(kind, stage, mb)`` in run
    order) and ``table`` (this rank's compute actions from the schedule's own
    ``pipeline_order``, blanks dropped, same format).
    """
    import torch
    from torch.distributed.pipelining import PipelineStage

    from distcheck import pipeline

    name = check_choice("schedule", example["schedule"], tuple(SCHEDULES))
    _, v, style = SCHEDULES[name]
    p, r = ctx.world_size, ctx.rank
    m = check_positive_int("m", example["m"])
    d = check_positive_int("d", example.get("d", 4))
    rows = check_positive_int("rows_per_mb", example.get("rows_per_mb", 2))
    num_stages = v * p
    blocks = _blocks(num_stages, d, int(example.get("seed", 0)))
    if style == "v":
        mine = [r, 2 * p - 1 - r]
    else:
        mine = [r + k * p for k in range(v)]
    import copy

    log: list = []
    stages = []
    for s in mine:
        st = PipelineStage(copy.deepcopy(blocks[s]).to(ctx.device), s, num_stages, ctx.device)
        _record(st, log)
        stages.append(st)
    cls = _schedule_class(name)
    sched = cls(stages[0] if v == 1 else stages, n_microbatches=m, loss_fn=_sum_sq_loss, scale_grads=False)
    gen = torch.Generator().manual_seed(int(example.get("seed", 0)) + 1)
    x = torch.randint(-2, 3, (m * rows, d), generator=gen).double().to(ctx.device)
    t = torch.randint(-2, 3, (m * rows, d), generator=gen).double().to(ctx.device)
    args = (x,) if 0 in mine else ()
    kwargs = {"target": t} if num_stages - 1 in mine else {}
    sched.step(*args, **kwargs)
    # reference: the unsplit model on the whole batch
    ref = torch.nn.Sequential(*[copy.deepcopy(b) for b in blocks]).to(ctx.device)
    _sum_sq_loss(ref(x), t).backward()
    worst, bitwise = 0.0, True
    for st, s in zip(stages, mine):
        for a, b in zip(st.submod.parameters(), ref[s].parameters()):
            worst = max(worst, (a.grad - b.grad).abs().max().item())
            bitwise = bitwise and torch.equal(a.grad, b.grad)
    table = [(a.kind, a.stage, a.microbatch) for a in pipeline.from_torch_actions({r: sched.pipeline_order[r]})[r]]
    return {"max_error": float(worst), "bitwise": bool(bitwise), "executed": log, "table": table}


def _executed_vs_simulator(schedule: str, p: int, m: int, executed: list) -> tuple[bool | None, str]:
    """Replay what the ranks executed and compare with :func:`distcheck.pipeline.simulate` (None: no simulator)."""
    from distcheck import pipeline

    sim_name, v, _ = SCHEDULES[schedule]
    if sim_name is None:
        return None, ""
    order = {rk: [pipeline.Action(k, mb, st) for k, st, mb in acts] for rk, acts in enumerate(executed)}
    try:
        tl = pipeline.replay(order, v * p, m, t_f=1, t_b=2)
        sim = pipeline.simulate(sim_name, p, m, v)
    except (ConfigError, pipeline.DeadlockError) as exc:
        return False, f"p={p}, m={m}: executed order does not replay against the simulator: {exc}"
    got = (tl.step_ticks, tl.bubble_fraction, tl.peak_in_flight)
    want = (sim.step_ticks, sim.bubble_fraction, sim.peak_in_flight)
    if got != want:
        return False, f"p={p}, m={m}: executed step/bubble/peak {got[0]}, {got[1]}, {list(got[2])} != simulator {want[0]}, {want[1]}, {list(want[2])}"
    return True, f"p={p}, m={m}: executed order replays to step {got[0]}, bubble {got[1]}, peak {list(got[2])} = simulator"


def default_pipeline_examples(world_size: int) -> list[dict]:
    """Every schedule of :data:`SCHEDULES` at ``m = 2p`` (a multiple of p, >= 2p - 1 for ZBV/DualPipeV)."""
    return [{"schedule": name, "m": 2 * world_size, "d": 4, "rows_per_mb": 2, "seed": 41} for name in SCHEDULES]


def run_pipelining_checks(pool_or_world_sizes=(2,), *, backend: str = "gloo", examples: Sequence[dict] | None = None,
                          timeout_s: float = 60.0, tables: bool = True) -> list[CheckResult]:
    """Table rows (:func:`run_table_checks`, if ``tables``) plus, per world and schedule, grads and executed-order rows."""
    rows: list[CheckResult] = run_table_checks() if tables else []
    for pool, ws, be, skip in iter_pools(pool_or_world_sizes, backend, timeout_s):
        for ex in examples or default_pipeline_examples(ws):
            names = (f"pp.grads.{ex['schedule']}", f"pp.executed_order.{ex['schedule']}")
            if skip or be not in ("gloo", "nccl"):
                reason = skip or f"backend {be!r} has no point-to-point send/recv; pipelining needs gloo or nccl processes"
                rows += [skip_row(nm, be, ws, reason) for nm in names]
                continue
            results, err = run_guarded(pool, pipeline_rank, ex)
            if err:
                rows += [result_row(nm, be, ws, 1, False, detail=f"m={ex['m']}: {err}") for nm in names]
                continue
            worst = max(r["max_error"] for r in results)
            ok = all(r["bitwise"] for r in results)
            rows.append(result_row(names[0], be, ws, 1, ok, max_error=worst, bound=0.0,
                                   detail=f"m={ex['m']}: gradients bitwise equal to the unsplit model" if ok
                                   else f"m={ex['m']}: max gradient error {worst:.3e}; bitwise expected"))
            diffs = [(rk, res["executed"], res["table"]) for rk, res in enumerate(results)
                     if [tuple(a) for a in res["executed"]] != [tuple(a) for a in res["table"]]]
            if diffs:
                rk, ex_order, tab = diffs[0]
                k = next((i for i, (a, b) in enumerate(zip(ex_order, tab)) if tuple(a) != tuple(b)), min(len(ex_order), len(tab)))
                detail = (f"p={ws}, m={ex['m']}, rank {rk}: first difference at position {k}: executed "
                          f"{ex_order[k:k + 3]} vs table {tab[k:k + 3]}")
            else:
                detail = f"p={ws}, m={ex['m']}: every rank executed its table's compute order"
            rows.append(result_row(names[1], be, ws, 1, not diffs, bound=0.0, detail=detail))
            sim_ok, sim_detail = _executed_vs_simulator(ex["schedule"], ws, ex["m"], [r["executed"] for r in results])
            if sim_ok is not None:
                rows.append(result_row(f"pp.executed_timeline.{ex['schedule']}", be, ws, 1, sim_ok, bound=0.0,
                                       detail=sim_detail))
    return rows
