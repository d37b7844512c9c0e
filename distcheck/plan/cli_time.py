"""``distcheck plan time``: the layouts that fit, ranked by step time, each term shown; the same data as a table,
JSON, and a Markdown/HTML report with a stacked-bar figure."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from distcheck.plan.cli_output import EXIT_FAIL, EXIT_OK, _check_outputs, _console, _exact, _write_outputs

if TYPE_CHECKING:
    from distcheck.plan.steptime import StepTime
    from distcheck.plan.timeplan import TimePlan
    from distcheck.reportdoc import Table

#: the columns of the ranking (table, Markdown, HTML)
COLUMNS = ("#", "tp", "cp", "pp", "dp", "ZeRO", "m", "step s", "compute s", "tp s", "cp s", "pp s", "dp s",
           "bubble s", "hidden s", "tokens/s", "MFU", "HFU", "GB/GPU", "crosses")
#: the most bars the figure draws (the shown layouts, and the fastest that crosses a node)
MAX_BARS = 40


def _efficiency(text: str) -> Fraction:
    from distcheck.core.errors import ConfigError

    try:
        value = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        raise ConfigError("--compute-efficiency", text, "must be a number, like 0.6 or 3/5") from None
    if not 0 < value <= 1:
        raise ConfigError("--compute-efficiency", text, "must be a fraction of the peak, 0 < X <= 1")
    return value


def _inputs(args: argparse.Namespace) -> tuple[Any, ...]:
    from distcheck.core.errors import ConfigError
    from distcheck.core.validate import check_positive_int
    from distcheck.plan import Hardware, Workload, resolve_model
    from distcheck.plan.hardware import accelerator, parse_figure, parse_overrides
    from distcheck.plan.moe import resolve_moe
    from distcheck.plan.steptime import Assumptions, parse_overlap

    if args.model is not None and resolve_moe(args.model) is not None:
        raise ConfigError("--model", args.model, "is a mixture-of-experts model: plan time times dense models (its "
                                                 "FLOPs: distcheck.parallel.flops.moe_training_flops_per_token; its "
                                                 "memory: plan memory)")
    if args.params is not None:
        raise ConfigError("--params", args.params, "has no shape, and a step time needs one: give --model or the "
                                                   "shape (--hidden-size, --num-layers, ...)")
    model = resolve_model(args.model, hidden_size=args.hidden_size, num_layers=args.num_layers,
                          ffn_hidden_size=args.ffn_hidden_size, num_heads=args.num_heads,
                          num_kv_heads=args.num_kv_heads, vocab_size=args.vocab_size)
    overrides: dict[str, Any] = dict(parse_overrides(args.hw))
    for flag, figure, value in (("--gpus-per-node", "gpus_per_node", args.gpus_per_node),
                                ("--gpu-memory", "hbm_bytes", args.gpu_memory)):
        if value is not None:
            if figure in overrides:
                raise ConfigError(flag, value, f"repeats --hw {figure}: give one of the two")
            overrides[figure] = parse_figure(figure, str(value), flag)
    acc = accelerator(args.hardware, overrides)
    hardware = Hardware(gpus=args.gpus, gpu_memory=acc.hbm_bytes, gpus_per_node=acc.gpus_per_node,
                        reserve=args.reserve)
    workload = Workload(seq_len=args.seq_len, micro_batch_size=args.micro_batch,
                        num_microbatches=args.num_microbatches, recompute=args.recompute,
                        sequence_parallel=args.sequence_parallel, bytes_per_param=args.bytes_per_param,
                        schedule=args.schedule)
    if args.global_batch is not None:
        check_positive_int("--global-batch", args.global_batch)
    assumptions = Assumptions(efficiency=_efficiency(args.compute_efficiency), overlap=parse_overlap(args.overlap))
    return model, hardware, workload, acc, assumptions


def _s(x: Fraction) -> str:
    return f"{float(x):,.3f}"


def _hidden(st: StepTime) -> Fraction:
    """Seconds of communication the assumed overlaps hide (not part of the step)."""
    return sum((x.seconds - x.exposed for x in st.axes.values()), Fraction(0))


def _row(i: int, st: StepTime) -> list[str]:
    lay, t = st.layout, st.terms
    return [str(i), str(lay.tp), str(lay.cp), str(lay.pp), str(lay.dp), str(lay.zero), str(st.num_microbatches),
            _s(st.seconds), _s(t["compute"]), _s(t["tp"]), _s(t["cp"]), _s(t["pp"]), _s(t["dp"]), _s(t["bubble"]),
            _s(_hidden(st)), f"{float(st.tokens_per_second):,.0f}", f"{float(st.mfu):.1%}", f"{float(st.hfu):.1%}",
            f"{float(Fraction(st.estimate.total)) / 1e9:,.2f}", ",".join(st.crossing) or "-"]


def _layout_json(i: int, st: StepTime, reason: str | None) -> dict:
    return {
        "rank": i, "layout": st.layout.as_dict(), "label": st.layout.label, "num_microbatches": st.num_microbatches,
        "tokens_per_step": st.tokens_per_step, "step_time_s": _exact(st.seconds),
        "terms_s": {k: _exact(v) for k, v in st.terms.items()}, "hidden_s": _exact(_hidden(st)),
        "tokens_per_second": _exact(st.tokens_per_second), "mfu": _exact(st.mfu), "hfu": _exact(st.hfu),
        "model_flops_per_token": _exact(st.model_flops_per_token),
        "hardware_flops_per_token": _exact(st.hardware_flops_per_token),
        "memory_bytes": _exact(st.estimate.total), "fits": st.estimate.fits,
        "pipeline": {"step_ticks": st.step_ticks, "busy_ticks": st.busy_ticks},
        "axes": {a: {"seconds": _exact(x.seconds), "exposed_s": _exact(x.exposed), "bytes_per_gpu": _exact(x.bytes),
                     "collectives": x.collectives, "nodes": x.placement.nodes, "ranks_per_node": x.placement.per_node,
                     "busbw_bytes_per_s": _exact(x.busbw), "overlap": x.overlap} for a, x in st.axes.items()},
        "crosses_nodes": list(st.crossing), "reason": reason,
    }


def _header(p: TimePlan) -> str:
    hw, wl, acc = p.hardware, p.workload, p.accelerator
    nodes = f"{hw.nodes} node{'s' if hw.nodes > 1 else ''} of {hw.gpus_per_node}"
    return (f"{p.model.name} ({p.model.params:,} parameters) on {hw.gpus} {acc.title} ({nodes}), "
            f"{float(Fraction(hw.gpu_memory)) / 1e9:,.2f} GB each; global batch {p.global_batch} x {wl.seq_len} "
            f"tokens, micro-batch {wl.micro_batch_size}, {wl.recompute} recompute, {wl.schedule}")


def _verdict(p: TimePlan) -> str:
    if not p.ranked:
        return (f"Nothing fits {float(Fraction(p.hardware.usable_bytes)) / 1e9:,.2f} GB with activations under these "
                f"settings ({p.not_fitting} layouts sized; try --recompute full, a smaller --micro-batch or more GPUs)")
    st = p.ranked[0]
    return (f"Fastest that fits: {st.layout.label}, {_s(st.seconds)} s per step, "
            f"{float(st.tokens_per_second):,.0f} tokens/s, MFU {float(st.mfu):.1%}")


def _highlights(p: TimePlan, shown: int) -> list[int]:
    """Indices of the reasons to print: the shown layouts', and the fastest that crosses with TP and with CP."""
    keep = [i for i in p.reasons if i < shown]
    for axis in ("tp", "cp"):
        first = next((i for i, st in enumerate(p.ranked) if axis in st.crossing), None)
        if first is not None and first not in keep:
            keep.append(first)
    return sorted(keep)


def _figure_text(figure: str, value: Any) -> str:
    """A catalogue figure in its usual unit: '989.5 TFLOP/s', '80 GB', '450 GB/s', '8.4 us', '8'."""
    v = float(Fraction(value))
    if figure == "peak_flops":
        return f"{v / 1e12:,.1f} TFLOP/s"
    if figure == "hbm_bytes":
        return f"{v / 1e9:,.4g} GB"
    if figure.endswith("bandwidth"):
        return f"{v / 1e9:,.4g} GB/s"
    if figure.startswith("latency"):
        return f"{v * 1e6:,.4g} us"
    return str(value)


def _tables(p: TimePlan) -> list[Table]:
    from distcheck.reportdoc import Table

    ranked = Table("The layouts that fit, ranked by step time", COLUMNS,
                   tuple(tuple(_row(i, st)) for i, st in enumerate(p.ranked, 1)),
                   note="seconds per step by term, after overlap; hidden = communication the assumed overlaps hide "
                        "(not in the step); m = micro-batches per replica at the global batch; crosses = the axes "
                        "whose groups span nodes")
    reasons = Table("Layouts whose TP or CP crosses a node", ("#", "why"),
                    tuple((str(i + 1), r) for i, r in sorted(p.reasons.items())))
    acc = p.accelerator
    hw = Table(f"Hardware: {acc.title}", ("figure", "value", "source"),
               tuple((f, _figure_text(f, getattr(acc, f)), acc.source(f)) for f in dict(acc.sources)))
    return [ranked, reasons, hw]


def _figure(p: TimePlan, shown: int) -> Any:
    from distcheck import viz

    idx = list(range(min(shown, MAX_BARS, len(p.ranked))))
    for axis in ("tp", "cp"):
        first = next((i for i, st in enumerate(p.ranked) if axis in st.crossing), None)
        if first is not None and first not in idx:
            idx.append(first)
    idx.sort()
    bars = [(f"#{i + 1} {p.ranked[i].layout.label}", p.ranked[i].terms) for i in idx]
    marked = [k for k, i in enumerate(idx) if p.ranked[i].crossing]
    title = (f"{p.model.name} on {p.hardware.gpus} {p.accelerator.title}: step time by term\n"
             f"global batch {p.global_batch} x {p.workload.seq_len} tokens, {float(p.assumptions.efficiency):.0%} of "
             "peak")
    return viz.time_bars(bars, marked=marked, title=title)


def _json(p: TimePlan) -> dict:
    hw, wl, a = p.hardware, p.workload, p.assumptions
    return {
        "model": {"name": p.model.name, "params": p.model.params},
        "hardware": {"gpus": hw.gpus, "gpus_per_node": hw.gpus_per_node, "gpu_memory_bytes": _exact(hw.gpu_memory),
                     "reserve_bytes": _exact(hw.reserve),
                     "accelerator": {k: (v if k in ("name", "title", "sources") else _exact(v))
                                     for k, v in p.accelerator.as_dict().items()}},
        "workload": {"seq_len": wl.seq_len, "micro_batch_size": wl.micro_batch_size, "global_batch": p.global_batch,
                     "recompute": wl.recompute, "sequence_parallel": wl.sequence_parallel,
                     "bytes_per_param": wl.bytes_per_param, "schedule": wl.schedule},
        "assumptions": {"compute_efficiency": _exact(a.efficiency), "overlap": dict(a.overlap)},
        "conventions": list(p.conventions),
        "not_fitting": p.not_fitting, "skipped": p.skipped,
        "layouts": [_layout_json(i, st, p.reasons.get(i - 1)) for i, st in enumerate(p.ranked, 1)],
    }


def run_time(args: argparse.Namespace) -> int:
    """Run ``distcheck plan time`` (module doc); returns the exit code, raises ConfigError on bad input."""
    from distcheck.core.errors import ConfigError
    from distcheck.plan.timeplan import plan_time
    from distcheck.progress import Progress

    _check_outputs(args)
    if args.top < 1:
        raise ConfigError("--top", args.top, "must be >= 1")
    model, hardware, workload, acc, assumptions = _inputs(args)
    with Progress("timing layouts", quiet=args.quiet) as bar:
        p = plan_time(model, hardware, workload, acc, assumptions, args.global_batch,
                      on_progress=lambda done, total: bar.update(completed=done, total=total))
    shown = len(p.ranked) if args.all else min(args.top, len(p.ranked))
    header, verdict = _header(p), _verdict(p)
    reasons = [p.reasons[i] for i in _highlights(p, shown)]
    if args.format == "json":
        print(json.dumps({**_json(p), "verdict": verdict}, indent=2))
    else:
        _print(p, header, verdict, reasons, shown)
    if (args.figure is not None or args.report is not None) and p.ranked:
        caption = "Step time of each layout by term (seconds); outlined in red: TP or CP crosses a node"
        figs = [(_figure(p, shown), caption, "step-time")]
        _write_outputs(args, figs, f"distcheck plan time: {model.name} on {hardware.gpus} GPUs",
                       [header, verdict, *reasons, *(f"Convention: {c}" for c in p.conventions)], _tables(p))
    return EXIT_OK if p.ranked else EXIT_FAIL


def _print(p: TimePlan, header: str, verdict: str, reasons: list[str], shown: int) -> None:
    from rich.markup import escape
    from rich.table import Table as RichTable

    console = _console()
    console.print(f"[bold]distcheck plan time[/]: {escape(header)}", highlight=False)
    for c in p.conventions:
        console.print(f"  [dim]{escape(c)}[/]", highlight=False)
    console.print()
    console.print(f"[bold]{escape(verdict)}[/]", highlight=False)
    extra = f"; {p.skipped} skipped (dp x micro-batch does not divide the global batch)" if p.skipped else ""
    console.print(f"{len(p.ranked)} layouts fit, {p.not_fitting} do not{extra}.", highlight=False)
    if not p.ranked:
        return
    table = RichTable(title=f"layouts that fit, by step time ({shown} of {len(p.ranked)})")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "crosses" else "right", no_wrap=True)
    for i, st in enumerate(p.ranked[:shown], 1):
        row = _row(i, st)
        if st.crossing:
            row[-1] = f"[red]{row[-1]}[/]"
        table.add_row(*row)
    console.print(table)
    if shown < len(p.ranked):
        console.print(f"[dim]{len(p.ranked) - shown} more: --all, or --format json[/]", highlight=False)
    for line in reasons:
        console.print(escape(line), highlight=False)
