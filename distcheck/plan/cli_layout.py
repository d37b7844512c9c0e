"""``distcheck plan layout``: rank groups, node boundaries and the DeviceMesh to build."""

from __future__ import annotations

import argparse
import json
from typing import TypedDict

from distcheck.plan.cli_output import EXIT_OK, _check_outputs, _console, _write_outputs

#: the largest world whose groups ``plan layout`` lists (from the first four of each axis beyond 64 ranks)
_MAX_LISTED_WORLD = 2**16


class _AxisInfo(TypedDict):
    """One axis of ``plan layout``: its groups (None beyond the listed sizes) and whether each is node-local."""

    axis: str
    degree: int
    num_groups: int
    node_local: bool
    groups: list[list[int]] | None


def _fmt_group(group: list[int]) -> str:
    """``[0,1,2,3]``, or ``[0,128,256,…,16256] (128 ranks)`` for a group of more than 8 ranks."""
    if len(group) <= 8:
        return "[" + ",".join(map(str, group)) + "]"
    return "[" + ",".join(map(str, group[:3])) + f",…,{group[-1]}] ({len(group)} ranks)"


def run_layout(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from distcheck.parallel import layout as layout_ref
    from distcheck.reportdoc import Table

    _check_outputs(args)
    cfg = layout_ref.ParallelConfig(tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, gpus_per_node=args.gpus_per_node)
    world, order = cfg.world_size, cfg.order
    assert world is not None and isinstance(order, tuple), "ParallelConfig.__post_init__ resolves both"
    axes = [a for a in ("tp", "cp", "pp", "dp") if cfg.degree(a) > 1] or ["tp"]
    listed = world <= 64
    info: list[_AxisInfo] = []
    for a in axes:
        local = layout_ref.groups_node_local(cfg, a)
        groups = layout_ref.groups(cfg, a) if world <= _MAX_LISTED_WORLD else None
        info.append({"axis": a, "degree": cfg.degree(a), "num_groups": cfg.num_groups(a), "node_local": local,
                     "groups": groups if listed else (groups[:4] if groups else None)})
    head = (f"{' × '.join(f'{a} {cfg.degree(a)}' for a in order if cfg.degree(a) > 1) or '1 rank'} = "
            f"{world} ranks on {-(-world // cfg.gpus_per_node)} node(s) of {cfg.gpus_per_node}, "
            f"order {'-'.join(order)} (innermost first)")
    if args.format == "json":
        print(json.dumps({"world_size": world, "gpus_per_node": cfg.gpus_per_node, "order": list(order),
                          "mesh_shape": list(layout_ref.mesh_shape(cfg)),
                          "mesh_dim_names": list(layout_ref.mesh_dim_names(cfg)), "axes": info}, indent=2))
    else:
        console = _console()
        console.print(f"[bold]distcheck plan layout[/]: {escape(head)}", highlight=False)
        console.print(f"  torch: init_device_mesh(device, {layout_ref.mesh_shape(cfg)}, "
                      f"mesh_dim_names={layout_ref.mesh_dim_names(cfg)})", highlight=False, markup=False)
        for d in info:
            where = "each inside a node" if d["node_local"] else "crossing nodes"
            console.print(f"{d['axis']}: {d['num_groups']} groups of {d['degree']}, {where}", highlight=False)
            if d["groups"] is not None:
                more = "" if listed else f" ... ({d['num_groups'] - len(d['groups'])} more)"
                console.print("  " + " ".join(_fmt_group(g) for g in d["groups"]) + more, highlight=False, markup=False)
    if args.figure is not None or args.report is not None:
        from distcheck import viz

        figs = [(viz.layout_diagram(cfg), f"Rank groups: {head}", "layout")]
        table = Table("Rank groups", ("axis", "degree", "groups", "inside a node", "ranks"),
                      tuple((d["axis"], str(d["degree"]), str(d["num_groups"]), "yes" if d["node_local"] else "no",
                             " ".join(_fmt_group(g) for g in (d["groups"] or []))) for d in info))
        _write_outputs(args, figs, f"distcheck plan layout: {head}", [head], [table])
    return EXIT_OK
