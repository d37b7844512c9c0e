"""``distcheck plan memory`` for a mixture-of-experts model: memory per GPU under ep x dp x tp, with the
model's total and active parameters (:mod:`distcheck.plan.moe`)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from distcheck.plan.cli_output import EXIT_FAIL, EXIT_OK, _console, _exact, _gbv

if TYPE_CHECKING:
    from distcheck.parallel.ep.models import MoEConfig
    from distcheck.plan.moe import MoEEstimate

_MOE_FLAGS = ("num_experts", "experts_per_token", "expert_ffn", "dense_layers", "dense_ffn", "shared_experts")


def moe_model(args: argparse.Namespace) -> tuple[str, MoEConfig] | None:
    """The MoE model the arguments name (a preset or explicit sizes), or None for a dense model. Raises
    ConfigError for MoE sizes without --num-experts, or --ep with a dense model."""
    from distcheck.core.errors import ConfigError
    from distcheck.plan.moe import resolve_moe

    extra = {f: getattr(args, f) for f in _MOE_FLAGS[1:] if getattr(args, f) is not None}
    if args.num_experts is None and extra:
        raise ConfigError(f"--{next(iter(extra)).replace('_', '-')}", next(iter(extra.values())),
                          "needs --num-experts (explicit MoE sizes)")
    found = resolve_moe(args.model, hidden_size=args.hidden_size, num_layers=args.num_layers,
                        vocab_size=args.vocab_size, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                        num_experts=args.num_experts, **extra)
    if found is None and args.ep is not None:
        raise ConfigError("--ep", args.ep, "needs an MoE model (--model deepseek-v3, mixtral-8x7b, or --num-experts)")
    return found


def _row(i: int, e: MoEEstimate) -> list[str]:
    return [str(i), str(e.tp), str(e.ep), str(e.dp), f"{float(e.params_per_gpu) / 1e9:,.3f}", _gbv(e.bytes_per_gpu),
            "yes" if e.fits else "no"]


def _json(e: MoEEstimate) -> dict:
    return {"tp": e.tp, "ep": e.ep, "dp": e.dp, "params_per_gpu": _exact(e.params_per_gpu),
            "bytes_per_gpu": _exact(e.bytes_per_gpu), "fits": e.fits}


def run_moe(args: argparse.Namespace, name: str, cfg: MoEConfig) -> int:
    """Print one layout's figures (--tp and/or --ep given) or every valid layout ranked; exit 0 when the
    layout (or one layout) fits, 1 when none does."""
    from rich.markup import escape
    from rich.table import Table

    from distcheck.core.errors import ConfigError
    from distcheck.plan import Hardware
    from distcheck.plan.moe import CONVENTIONS, moe_estimate, moe_plan
    from distcheck.plan.planner import gb

    for flag in ("pp", "cp", "dp", "zero", "params", "figure", "report"):
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--{flag}", getattr(args, flag), "is not taken with an MoE model (layouts tp x ep x dp, "
                                                                 "dp = gpus / tp)")
    hardware = Hardware(gpus=args.gpus, gpu_memory=args.gpu_memory, gpus_per_node=args.gpus_per_node,
                        reserve=args.reserve)
    if args.tp is not None or args.ep is not None:
        from distcheck.core.validate import check_positive_int

        # 0 is a degree the user gave, not an absent one: it is refused, never read as 1
        tp = 1 if args.tp is None else check_positive_int("tp", args.tp)
        ep = 1 if args.ep is None else check_positive_int("ep", args.ep)
        rows = [moe_estimate(cfg, hardware, args.bytes_per_param, tp=tp, ep=ep)]
    else:
        rows = moe_plan(cfg, hardware, args.bytes_per_param)
        if not rows:
            raise ConfigError("gpus", args.gpus, "leaves no tp x ep x dp layout for this model")
    first = rows[0]
    convs = [*CONVENTIONS, f"bytes per parameter: {args.bytes_per_param} ({first.bytes_per_param} B)"]
    head = (f"{name}: {first.total_params:,} parameters in total, {first.active_params:,} active per token "
            f"(ep.params.total, ep.params.active); {first.dense_params:,} outside the routed experts, "
            f"{first.expert_params:,} in them; {hardware.gpus} GPUs of {gb(hardware.gpu_memory)}")
    ok = any(e.fits for e in rows)
    if args.format == "json":
        print(json.dumps({"model": name, "total_params": first.total_params, "active_params": first.active_params,
                          "dense_params": first.dense_params, "expert_params": first.expert_params,
                          "gpus": hardware.gpus, "usable_bytes": _exact(hardware.usable_bytes),
                          "bytes_per_param": first.bytes_per_param, "conventions": convs,
                          "layouts": [_json(e) for e in rows]}, indent=2))
        return EXIT_OK if ok else EXIT_FAIL
    console = _console()
    console.print(f"[bold]distcheck plan memory[/]: {escape(head)}", highlight=False)
    for c in convs:
        console.print(f"  [dim]{escape(c)}[/]", highlight=False)
    shown = rows if args.all else rows[: args.top]
    table = Table(title=f"MoE layouts, smallest memory per GPU first ({len(shown)} of {len(rows)})")
    for col in ("#", "tp", "ep", "dp", "B params/GPU", "state GB/GPU", "fits"):
        table.add_column(col, justify="left" if col == "fits" else "right", no_wrap=True)
    for i, e in enumerate(shown, 1):
        table.add_row(*_row(i, e))
    console.print(table)
    best = next((e for e in rows if e.fits), None)
    verdict = f"{best.label}: {gb(best.bytes_per_gpu)} per GPU fits" if best else "no layout fits"
    console.print(f"[bold]{escape(verdict)}[/] (usable {escape(gb(hardware.usable_bytes))})", highlight=False)
    return EXIT_OK if ok else EXIT_FAIL
