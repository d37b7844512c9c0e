"""torchtitan's ``ParallelDims`` (rank-layout contract, through the fake backend).

``torchtitan.distributed.parallel_dims.ParallelDims(dp_replicate, dp_shard, cp, tp, pp, ep,
world_size).build_mesh()`` builds the meshes every rank uses. The adapter draws degrees
(``dp_shard`` sometimes -1, derived from the world size), builds the meshes as every rank
of a fake world in turn (:func:`distcheck.runners.fake.run_fake`: no process starts, no
collective runs) and collects, for each mesh name, the group each rank belongs to. They are
compared with :func:`distcheck.mesh_layout.torchtitan_layout` and, for tp, cp, pp and the
whole data-parallel group (``batch``), with :class:`distcheck.layout.ParallelConfig` with
``dp = dp_replicate * dp_shard`` under the same order.
"""

from __future__ import annotations

from hypothesis import strategies as st

from distcheck.libs.badinput import Probe, check_bad_input
from distcheck.libs.layouts import LayoutTarget, check_layout
from distcheck.libs.targets import dist_version

DIST = "torchtitan"
TITLE = "torchtitan ParallelDims"
CONTRACT = "rank layout"
#: the largest world drawn (every rank builds its meshes once per configuration)
MAX_WORLD = 16
NAMES = ("pp", "batch", "loss", "dp_replicate", "dp_shard", "dp", "cp", "tp", "ep", "efsdp")


def _configs():
    def with_ep(c):
        host = c["dp_shard"] * c["cp"] * c["tp"]
        eps = [d for d in range(1, host + 1) if host % d == 0]
        return st.tuples(st.sampled_from(eps), st.booleans()).map(
            lambda t: dict(c, ep=t[0], dp_shard=-1 if t[1] else c["dp_shard"],
                           world_size=c["dp_replicate"] * c["dp_shard"] * c["cp"] * c["tp"] * c["pp"]))

    base = st.fixed_dictionaries({k: st.integers(1, 2) for k in ("dp_replicate", "cp", "tp", "pp")}
                                 | {"dp_shard": st.integers(1, 4)})
    small = base.filter(lambda c: c["dp_replicate"] * c["dp_shard"] * c["cp"] * c["tp"] * c["pp"] <= MAX_WORLD)
    return small.flatmap(with_ep)


def _rank_groups(ctx, cfg):
    import logging

    from torchtitan.distributed.parallel_dims import ParallelDims

    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    kw = {k: v for k, v in cfg.items() if k != "world_size"}
    dims = ParallelDims(**kw, world_size=ctx.world_size)
    dims.build_mesh()
    return {name: [int(r) for r in mesh.mesh.flatten().tolist()] for name, mesh in dims._single_axis_meshes.items()}


def _groups(cfg: dict) -> dict:
    from distcheck.runners.fake import run_fake

    world = cfg["world_size"]
    seen: dict[str, set] = {}
    for rank in range(world):
        for name, group in run_fake(_rank_groups, cfg, world_size=world, rank=rank).items():
            seen.setdefault(name, set()).add(tuple(sorted(group)))
    return {name: [list(g) for g in groups] for name, groups in seen.items()}


def _order(cfg: dict) -> str:
    return "tp-cp-dp_shard-dp_replicate-pp (ep borrowed from tp-cp-dp_shard)"


def _reference(cfg: dict) -> dict:
    from distcheck.layout import ParallelConfig, groups
    from distcheck.mesh_layout import derive_degree, torchtitan_layout

    kw = {k: v for k, v in cfg.items() if k != "world_size"}
    mine = torchtitan_layout(**kw, world_size=cfg["world_size"])
    out = {name: mine.groups(name) for name in NAMES}
    shard = kw["dp_shard"] if kw["dp_shard"] != -1 else derive_degree(
        cfg["world_size"], dp_replicate=kw["dp_replicate"], cp=kw["cp"], tp=kw["tp"], pp=kw["pp"])
    # distcheck's one-dp layout: dp = dp_replicate * dp_shard under the same order
    whole = ParallelConfig(tp=kw["tp"], cp=kw["cp"], pp=kw["pp"], dp=kw["dp_replicate"] * shard, order="tp-cp-dp-pp")
    out.update({"tp": groups(whole, "tp"), "cp": groups(whole, "cp"), "pp": groups(whole, "pp"),
                "batch": groups(whole, "dp"), "dp": groups(whole, "dp")})
    return out


def layout_target() -> LayoutTarget:
    return LayoutTarget("torchtitan.parallel_dims", f"{DIST} {dist_version(DIST)}", _configs(), _groups, _reference,
                        _order)


PROBES = (
    Probe("dp_replicate=0", "ParallelDims(dp_replicate=0, dp_shard=2, cp=1, tp=1, pp=1, ep=1, world_size=2).dp_replicate"),
    Probe("tp=-2", "ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=-2, pp=1, ep=1, world_size=4).dp_shard"),
    Probe("dp_shard=3 in a world of 4", "ParallelDims(dp_replicate=1, dp_shard=3, cp=1, tp=1, pp=1, ep=1, world_size=4).dp_shard"),
    Probe("dp_shard=-1 with tp=3 in a world of 4", "ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=3, pp=1, ep=1, world_size=4).dp_shard"),
    Probe("dp_shard=-2", "ParallelDims(dp_replicate=1, dp_shard=-2, cp=1, tp=1, pp=1, ep=1, world_size=4).dp_shard"),
    Probe("ep=3 not dividing dp_shard*cp*tp=2", "ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=1, ep=3, world_size=2).ep"),
)
SETUP = "from torchtitan.distributed.parallel_dims import ParallelDims"


def rows(max_examples: int, seed: int):
    lib = f"{DIST} {dist_version(DIST)}"
    return [check_layout(layout_target(), max_examples=max_examples, seed=seed),
            check_bad_input("torchtitan.parallel_dims", lib, SETUP, PROBES)]
