"""``distcheck plan memory``: every layout ranked with a recommendation, or one layout's breakdown."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from distcheck.plan.cli_output import EXIT_FAIL, EXIT_OK, _check_outputs, _console, _exact, _frac, _gbv, _write_outputs

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from rich.console import Console

    from distcheck.plan.estimate import Estimate
    from distcheck.plan.inputs import Hardware, Layout, Workload
    from distcheck.plan.model import ModelSpec
    from distcheck.plan.planner import Plan
    from distcheck.reportdoc import Table


def _memory_inputs(args: argparse.Namespace) -> tuple[ModelSpec, Hardware, Workload]:
    from distcheck.plan import Hardware, Workload, resolve_model

    model = resolve_model(args.model, params=args.params, hidden_size=args.hidden_size, num_layers=args.num_layers,
                          ffn_hidden_size=args.ffn_hidden_size, num_heads=args.num_heads,
                          num_kv_heads=args.num_kv_heads, vocab_size=args.vocab_size)
    hardware = Hardware(gpus=args.gpus, gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                        reserve=args.reserve)
    workload = Workload(seq_len=args.seq_len, micro_batch_size=args.micro_batch,
                        num_microbatches=args.num_microbatches, recompute=args.recompute,
                        sequence_parallel=args.sequence_parallel, bytes_per_param=args.bytes_per_param,
                        schedule=args.schedule)
    return model, hardware, workload


def _explicit_layout(args: argparse.Namespace, model: ModelSpec, hardware: Hardware,
                     workload: Workload) -> Layout | None:
    from distcheck.core.errors import ConfigError
    from distcheck.core.validate import check_positive_int
    from distcheck.plan import Layout
    from distcheck.plan.estimate import check_model_rules

    given = {a: getattr(args, a) for a in ("tp", "pp", "dp", "cp", "zero")}
    if all(v is None for v in given.values()):
        return None
    degrees = {a: (1 if given[a] is None else given[a]) for a in ("tp", "pp", "cp")}
    for a, v in degrees.items():
        check_positive_int(a, v)
    check_model_rules(model, workload, degrees["tp"], degrees["pp"], degrees["cp"])
    if given["dp"] is None:
        inner = degrees["tp"] * degrees["pp"] * degrees["cp"]
        if hardware.gpus % inner:
            raise ConfigError("gpus", hardware.gpus, f"must be divisible by tp*cp*pp = {degrees['tp']}*{degrees['cp']}*"
                                                     f"{degrees['pp']} = {inner} (dp = gpus / (tp*cp*pp))")
        given["dp"] = hardware.gpus // inner
    return Layout(tp=degrees["tp"], pp=degrees["pp"], dp=given["dp"], cp=degrees["cp"],
                  zero=0 if given["zero"] is None else given["zero"])


def _header(model: ModelSpec, hardware: Hardware, workload: Workload) -> str:
    from distcheck.plan.planner import gb

    nodes = f"{hardware.nodes} node{'s' if hardware.nodes > 1 else ''} of {hardware.gpus_per_node}"
    reserve = f", {gb(hardware.reserve)} reserved" if hardware.reserve else ""
    return (f"{model.name} ({model.params:,} parameters) on {hardware.gpus} GPUs ({nodes}) of "
            f"{gb(hardware.gpu_memory)}{reserve}; seq_len {workload.seq_len}, micro-batch {workload.micro_batch_size}, "
            f"{workload.num_microbatches} micro-batches per step, {workload.schedule}")


def _lesson_lines(p: Plan) -> list[str]:
    from distcheck.plan.planner import gb

    cap = gb(p.hardware.usable_bytes)
    ddp = "fits" if p.ddp_state <= p.hardware.usable_bytes else "does not fit"
    lines = [f"Before activations: DDP keeps the whole state on every GPU, {gb(p.ddp_state)} per GPU: {ddp} {cap}."]
    if p.smallest_split is None:
        lines.append("No TP × PP split (ZeRO-0) fits before activations on these GPUs.")
    else:
        tp, pp, state = p.smallest_split
        lines.append(f"The smallest TP × PP split that fits before activations (ZeRO-0): TP {tp} × PP {pp}, "
                     f"{gb(state)} per GPU.")
    return lines


def _estimate_row(i: int, e: Estimate) -> list[str]:
    lay = e.layout
    comm = _gbv(e.comm_total) + ("" if e.comm_complete else "+")
    return [str(i), str(lay.tp), str(lay.cp), str(lay.pp), str(lay.dp), str(lay.zero), _gbv(e.state),
            _gbv(e.activations), _gbv(e.total), f"{float(e.memory_fraction):.0%}", "yes" if e.fits else "no",
            f"{float(e.bubble_fraction):.1%}", comm, lay.question]


_COLUMNS = ("#", "tp", "cp", "pp", "dp", "ZeRO", "state GB", "activations GB", "total GB", "of GPU", "fits",
            "bubble", "comm GB/step", "question")


def _layouts_table(estimates: Sequence[Estimate], title: str, ranking: str) -> Table:
    from distcheck.reportdoc import Table

    return Table(title, _COLUMNS, tuple(tuple(_estimate_row(i, e)) for i, e in enumerate(estimates, 1)),
                 note=f"{ranking}. state = weights + gradients + optimizer state; comm = bytes each GPU sends per step "
                      "(tp + pp + cp + dp); question = the lesson's question the layout answers (1 DDP, 2 ZeRO-1/2, "
                      "3 ZeRO-3, 4 TP and PP, '4 (TP alone)' TP without PP, 5 context parallel); '+' marks a total "
                      "without the parts that need the model's shape")


def _estimate_json(e: Estimate) -> dict:
    return {
        "layout": e.layout.as_dict(), "label": e.layout.label, "question": e.layout.lesson_step,
        "question_label": e.layout.question,
        "params_per_gpu": _exact(e.params_per_gpu),
        "bytes": {k: _exact(v) for k, v in
                  (("weights", e.weights), ("gradients", e.gradients), ("optimizer", e.optimizer),
                   ("activations", e.activations), ("state", e.state), ("total", e.total))},
        "activations_per_layer": _exact(e.activations_per_layer), "layers_per_stage": e.layers_per_stage,
        "in_flight": e.in_flight, "fits": e.fits, "fits_before_activations": e.fits_before_activations,
        "bubble_fraction": _exact(e.bubble_fraction),
        "comm_bytes_per_step": {k: _exact(v) for k, v in e.comm.items()}, "comm_total": _exact(e.comm_total),
    }


def _inputs_json(model: ModelSpec, hardware: Hardware, workload: Workload) -> dict:
    return {
        "model": {"name": model.name, "params": model.params},
        "hardware": {"gpus": hardware.gpus, "gpus_per_node": hardware.gpus_per_node,
                     "gpu_memory_bytes": _exact(hardware.gpu_memory), "reserve_bytes": _exact(hardware.reserve)},
        "workload": {"seq_len": workload.seq_len, "micro_batch_size": workload.micro_batch_size,
                     "num_microbatches": workload.num_microbatches, "recompute": workload.recompute,
                     "sequence_parallel": workload.sequence_parallel, "bytes_per_param": workload.bytes_per_param,
                     "schedule": workload.schedule},
    }


def _memory_figures(model: ModelSpec, hardware: Hardware, workload: Workload, chosen: Layout,
                    fmt_caption: str) -> list[tuple[Figure, str, str]]:
    """The memory chart and, for up to 64 ranks, the chosen layout's diagram, as (Figure, caption, name)."""
    from distcheck import viz
    from distcheck.parallel import layout as layout_ref
    from distcheck.plan.charts import memory_chart_data

    chart = memory_chart_data(model, hardware, workload, chosen)
    figs = [(viz.memory_bars(**chart.viz_args()), f"Memory per GPU: ZeRO stages 0-3 under DP and for {fmt_caption}, "
                                                  "with the GPU's capacity line", "memory")]
    if hardware.gpus <= viz.MAX_DIAGRAM_RANKS:
        cfg = layout_ref.ParallelConfig(tp=chosen.tp, pp=chosen.pp, dp=chosen.dp, cp=chosen.cp,
                                        gpus_per_node=hardware.gpus_per_node)
        figs.append((viz.layout_diagram(cfg), f"Rank groups of {chosen.label}", "layout"))
    return figs


def run_memory(args: argparse.Namespace) -> int:
    from distcheck.core.errors import ConfigError
    from distcheck.plan import conventions, estimate, plan
    from distcheck.plan.planner import SORT_KEYS, gb, sort_estimates
    from distcheck.progress import Progress

    _check_outputs(args)
    if args.top < 1:
        raise ConfigError("--top", args.top, "must be >= 1")
    from distcheck.plan.cli_moe import moe_model, run_moe

    moe = moe_model(args)
    if moe is not None:
        if getattr(args, "sort", None) is not None:
            raise ConfigError("--sort", args.sort, "applies to dense layouts; MoE layouts are listed smallest memory "
                                                   "per GPU first")
        return run_moe(args, *moe)
    by = getattr(args, "sort", None) or "lesson"
    model, hardware, workload = _memory_inputs(args)
    chosen = _explicit_layout(args, model, hardware, workload)
    console = _console()
    header = _header(model, hardware, workload)
    if chosen is not None:
        if getattr(args, "sort", None) is not None:
            raise ConfigError("--sort", args.sort, "orders the table of every layout; it does not apply to one "
                                                   "given layout (--tp, --pp, --dp, --cp, --zero)")
        e = estimate(model, hardware, workload, chosen)
        return _report_one(args, console, model, hardware, workload, e, header, conventions(model, workload))
    with Progress("sizing layouts", quiet=args.quiet) as bar:
        result = plan(model, hardware, workload,
                      on_progress=lambda done, total: bar.update(completed=done, total=total))
    lesson = _lesson_lines(result)
    ordered = sort_estimates(result.estimates, by)
    ranking = f"Ranked by {by} (--sort): {SORT_KEYS[by]}"
    rec = result.recommended
    verdict = (f"Recommendation: {rec.layout.label} (question {rec.layout.question}), {gb(rec.total)} per GPU"
               if rec else f"Nothing fits {gb(hardware.usable_bytes)} with activations under these settings "
                           "(try --recompute full, a smaller --micro-batch or more GPUs)")
    if args.format == "json":
        data = _inputs_json(model, hardware, workload)
        data.update({
            "conventions": list(result.conventions), "ddp_state_bytes": _exact(result.ddp_state),
            "smallest_tp_pp_before_activations": (None if result.smallest_split is None else
                                                  {"tp": result.smallest_split[0], "pp": result.smallest_split[1],
                                                   "state_bytes": _exact(result.smallest_split[2])}),
            "questions": [{"step": q.step, "question": q.question, "answer": q.answer, "reason": q.reason,
                           "best": None if q.best is None else q.best.layout.as_dict()} for q in result.questions],
            "recommended": None if rec is None else _estimate_json(rec),
            "sort": {"by": by, "rule": SORT_KEYS[by]},
            "layouts": [_estimate_json(e) for e in ordered],
        })
        print(json.dumps(data, indent=2))
    else:
        _print_plan(console, result, header, lesson, verdict, args, ordered, ranking)
    shown = rec.layout if rec is not None else result.estimates[0].layout
    if args.figure is not None or args.report is not None:
        figs = _memory_figures(model, hardware, workload, shown, shown.label)
        from distcheck.reportdoc import Table

        questions = Table("The lesson's order of questions", ("question", "asked", "answer", "figures"),
                          tuple((str(q.step), q.question, "yes" if q.answer else "no", q.reason)
                                for q in result.questions))
        # the questions once: in their table, not again among the notes
        _write_outputs(args, figs, f"distcheck plan memory: {model.name} on {hardware.gpus} GPUs",
                       [header, verdict, *lesson, *(f"Convention: {c}" for c in result.conventions)],
                       [questions, _layouts_table(ordered, f"Every valid layout, ranked by {by}", ranking)])
    return EXIT_OK if rec is not None else EXIT_FAIL


def _print_plan(console: Console, result: Plan, header: str, lesson: list[str], verdict: str,
                args: argparse.Namespace, ordered: Sequence[Estimate], ranking: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]distcheck plan memory[/]: {escape(header)}", highlight=False)
    for c in result.conventions:
        console.print(f"  [dim]{escape(c)}[/]", highlight=False)
    console.print()
    for line in lesson:
        console.print(escape(line), highlight=False)
    console.print()
    for line in result.reasons():
        console.print(escape(line), highlight=False)
    console.print(f"[bold]{escape(verdict)}[/]", highlight=False)
    shown = ordered if args.all else ordered[: args.top]
    console.print(escape(ranking), highlight=False)
    table = Table(title=f"layouts, ranked ({len(shown)} of {len(result.estimates)})")
    for col in _COLUMNS:
        table.add_column(col, justify="left" if col in ("fits",) else "right", no_wrap=True)
    for i, e in enumerate(shown, 1):
        row = _estimate_row(i, e)
        row[10] = "[green]yes[/]" if e.fits else "[red]no[/]"
        table.add_row(*row)
    console.print(table)
    if len(shown) < len(result.estimates):
        console.print(f"[dim]{len(result.estimates) - len(shown)} more: --all, or --format json[/]", highlight=False)


def _report_one(args: argparse.Namespace, console: Console, model: ModelSpec, hardware: Hardware, workload: Workload,
                e: Estimate, header: str, convs: list[str]) -> int:
    from rich.markup import escape
    from rich.table import Table as RichTable

    from distcheck.plan.planner import gb
    from distcheck.reportdoc import Table

    cap = gb(hardware.usable_bytes)
    conv = workload.convention
    per_param = {"weights": conv.weights, "gradients": conv.grads, "optimizer": conv.optimizer}
    sharded_from = {"weights": 3, "gradients": 2, "optimizer": 1}
    rows: list[tuple[str, ...]] = []
    for comp in ("weights", "gradients", "optimizer"):
        shard = f" / {e.layout.shard_ranks} (ZeRO-{e.layout.zero})" if e.layout.zero >= sharded_from[comp] else ""
        rows.append((comp, f"{per_param[comp]} B/param × {float(Fraction(e.params_per_gpu)):,.0f} params{shard}",
                     gb(getattr(e, comp))))
    if e.activations is None:
        rows.append(("activations", "not counted (no model shape)", "-"))
    else:
        rows.append(("activations", f"{gb(e.activations_per_layer)} per layer × {e.layers_per_stage} layers × "
                                    f"{e.in_flight} in flight", gb(e.activations)))
    rows.append(("total", f"{float(e.memory_fraction):.1%} of {gb(hardware.gpu_memory)}", gb(e.total)))
    verdict = (f"{e.layout.label}: {gb(e.total)} per GPU {'fits' if e.fits else 'does NOT fit'} {cap} "
               f"({'fits' if e.fits_before_activations else 'does not fit'} before activations); bubble "
               f"{_frac(e.bubble_fraction)} = {float(e.bubble_fraction):.1%}; sends "
               + (f"{gb(e.comm_total)}" if e.comm_complete else f"at least {gb(e.comm_total)} (tp, pp and cp need the "
                                                                "model's shape)") + " per GPU per step")
    comm_rows = tuple((axis, gb(v) if v is not None else "needs the model shape") for axis, v in e.comm.items())
    if args.format == "json":
        data = _inputs_json(model, hardware, workload)
        data.update({"conventions": convs, "estimate": _estimate_json(e)})
        print(json.dumps(data, indent=2))
    else:
        console.print(f"[bold]distcheck plan memory[/]: {escape(header)}", highlight=False)
        for c in convs:
            console.print(f"  [dim]{escape(c)}[/]", highlight=False)
        t = RichTable(title=f"{e.layout.label}: memory per GPU")
        for col in ("part", "how", "bytes"):
            t.add_column(col, justify="right" if col == "bytes" else "left")
        for r in rows:
            t.add_row(*(escape(x) for x in r))
        console.print(t)
        ct = RichTable(title="bytes each GPU sends per step")
        ct.add_column("axis")
        ct.add_column("bytes", justify="right")
        for r in comm_rows:
            ct.add_row(*r)
        console.print(ct)
        style = "green" if e.fits else "bold red"
        console.print(f"[{style}]{escape(verdict)}[/]", highlight=False)
    if args.figure is not None or args.report is not None:
        figs = _memory_figures(model, hardware, workload, e.layout, e.layout.label)
        tables = [Table(f"{e.layout.label}: memory per GPU", ("part", "how", "bytes"), tuple(rows)),
                  Table("Bytes each GPU sends per step", ("axis", "bytes"), comm_rows)]
        _write_outputs(args, figs, f"distcheck plan memory: {model.name}, {e.layout.label}",
                       [header, verdict, *(f"Convention: {c}" for c in convs)], tables)
    return EXIT_OK if e.fits else EXIT_FAIL


