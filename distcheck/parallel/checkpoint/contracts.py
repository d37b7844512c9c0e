"""The ``checkpoint`` contract: a user's ``save(state, path)`` / ``load(state, path)`` pair, certified on a
real world by a save under one layout and a load under another.

Target: any object with callable attributes ``save`` and ``load`` (a module, a class of static methods, an
instance), called on every rank with torch's ``get_state_dict(model, optimizer)`` as ``{"model": ...,
"optim": ...}`` and one folder every rank names alike; ``load`` fills the state in place (as ``dcp.load``)
or replaces its entries. ``distcheck.parallel.checkpoint.plans:TORCH_DCP`` is torch.distributed.checkpoint.

Each example draws 1 to 3 tensors of 1 or 2 dimensions (sizes 1 to 7: uneven shards) and ends with a
*bulk* tensor of 2**16 elements (multiples of 1/8, from a drawn seed), so that the tensors'
bytes outweigh the metadata bound below: a lost moment falls under the closed form and a second copy above
the bound. Adam takes 1 or 2 steps on drawn gradients; the two layouts are drawn over the world
(replicated, FSDP2's ``fully_shard``, DTensor tp with a shard dimension per tensor, and from 4 ranks their
2-D composition ``fsdp_tp``: FSDP2 over tp on a ``(dp, tp=2)`` DeviceMesh; ``layouts_at``); see
:mod:`distcheck.parallel.checkpoint.harness` for the rank side.

The loading world is drawn apart from the saving one (option ``reshard``, default true): at N ranks the load
runs on N, on N - 1 (from 3 ranks) or on 2N up to 4 ranks (:func:`load_worlds`: 2 -> 4, 3 -> 2 and 4, 4 -> 3),
each layout drawn from those its own world holds, the tensors' shards uneven on both sides. That is a job
restarted on 3 nodes after saving on 4: a loader that reads one file per *loading* rank and never records how
many ranks saved is right on the world it saved on and wrong there. The other worlds are pools of their own,
one per size, beside the certified world (:meth:`CheckpointContract.companion_worlds`; the engine opens them
with the certified world's backend and timeout, the pool's timeout bounding each of the two world steps); the
saving world writes into a folder the parent makes and removes, then the loading world reads it. With
``reshard=false`` every example saves and loads on the certified world alone (a world launched by torchrun, which
opens none beside it). The "Compositions drawn" table lists the worlds of each example (``4 -> 3``).

One composition is never drawn (:data:`AVOIDED`, :func:`tp_dim_choices`): ``fsdp_tp`` with tp along a dimension
other than 0 that leaves a tp rank no element (a width-1 dim 1 over tp = 2). torch 2.13's ``fully_shard`` gives
that rank a (0, 0) local shard where its placements give (rows, 0), and ``full_tensor()``, which reads the
state whole, hangs: the recorded finding ``torch.fully_shard.empty_tp_shard``
(:mod:`distcheck.parallel.checkpoint.findings`; row ``checkpoint.fsdp_tp.empty_tp_shard`` of ``distcheck
check``; ``docs/repro/torch_fsdp_tp_hang.py``). Such a tensor is drawn with tp along dim 0 or replicated on tp
instead, and every verdict from 4 ranks says so in its note.

Properties:

* ``round_trip`` (bitwise): after the load every parameter, Adam moment and step count, whole, is bitwise
  what was saved (a load copies bits; nothing is recomputed).
* ``next_step`` (bitwise): the parameters after one more Adam step on the same gradient equal the saved
  run's next step, bit for bit: Adam is elementwise, so equal state gives equal bits, and a step count that
  is not restored changes the bias corrections.
* ``bytes`` (exact): the folder holds at least the closed form ``checkpoint.bytes_total.adam`` (parameters
  and moments in the dtype, a 4-byte step per tensor: every element once) and at most that plus
  :data:`METADATA_BYTES_PER_FILE` per file and :data:`METADATA_BYTES_PER_ITEM` per saved item (each
  writer's shard of a parameter and of its two moments, each step count, and the optimizer's pickled
  ``param_groups``). The constants are not derived from a format: they bound what torch 2.13's
  ``FileSystemWriter`` adds, measured at about 1.6 KB per item (``torch.save``'s zip records and 64-byte
  alignment for one tensor: ``len(buf) - nbytes`` of ``torch.save(t, buf)``), about 0.2 KB per item in
  ``.metadata`` and about 1 KB fixed per file, with a factor of two of margin. A format that writes less
  than the closed form has lost part of the state; one that writes more than the bound writes a copy (a
  replicated tensor saved by every rank) or carries more than metadata.

Below 2 ranks nothing is sharded: every layout is the whole tensor, and a loader that assumes equal shards
or the saving layout is right there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st

from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, resolve
from distcheck.engine.world import RankContext

__all__ = ["CkptCase", "CheckpointContract", "METADATA_BYTES_PER_FILE", "METADATA_BYTES_PER_ITEM", "bytes_bound",
           "BULK_ROWS", "bulk", "AVOIDED", "tp_dim_choices", "load_worlds", "MAX_LARGER_LOAD_WORLD", "save_side",
           "load_side"]

#: bound on a file's fixed overhead (a zip end record, ``.metadata``'s header), bytes
METADATA_BYTES_PER_FILE = 4096
#: bound on one saved item's overhead (its zip records and its ``.metadata`` entry), bytes
METADATA_BYTES_PER_ITEM = 4096


@dataclass(frozen=True)
class CkptCase:
    """One example: tensors ``params`` (float64 arrays, cast to ``dtype``), the gradients of ``steps``
    Adam steps and of the next one (``grads``), saved under ``(layout_a, dims_a)``, loaded under
    ``(layout_b, dims_b)`` on ``load_world_size`` ranks (None: the saving world's ``world_size``)."""

    world_size: int
    dtype: str
    params: tuple
    grads: tuple
    layout_a: str
    dims_a: tuple
    layout_b: str
    dims_b: tuple
    load_world_size: int | None = None

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [p.shape for p in self.params]

    @property
    def load_world(self) -> int:
        """Ranks of the world that loads: :attr:`load_world_size`, else the saving world's."""
        return self.world_size if self.load_world_size is None else self.load_world_size

    def __repr__(self) -> str:
        at = f" at {self.load_world}" if self.load_world != self.world_size else ""
        return (f"CkptCase(N={self.world_size}, {self.dtype}, shapes={self.shapes}, steps={len(self.grads) - 1}, "
                f"save {self.layout_a}{list(self.dims_a)}, load{at} {self.layout_b}{list(self.dims_b)}, "
                f"params={[p.tolist() for p in self.params[:-1]]}, bulk of {self.params[-1].size})")


#: rows of the bulk tensor every case ends with (module doc): a power of two, so that its shards are even and
#: the uneven ones are the drawn tensors'
BULK_ROWS = 2**16


def bulk(rows: int, seed: int) -> np.ndarray:
    """The bulk tensor: ``rows`` multiples of 1/8 in [-1, 1], a function of ``seed``."""
    return ((np.arange(rows, dtype=np.int64) * (2 * seed + 1)) % 17 - 8) / 8


#: the composition the cases never draw, and why (module doc); the note of every verdict from 4 ranks
AVOIDED = ("fsdp_tp never draws tp along a dim other than 0 that leaves a tp rank no element (a width-1 dim 1): "
           "torch 2.13's fully_shard gives that rank a (0, 0) shard and full_tensor() hangs (recorded finding "
           "torch.fully_shard.empty_tp_shard)")


def tp_dim_choices(kind: str, shape: tuple[int, ...]) -> list[int | None]:
    """The tp dimensions a tensor of ``shape`` may be drawn with under layout ``kind`` (``tp`` or ``fsdp_tp``):
    None (replicated on tp) or any of its dimensions, but, under ``fsdp_tp``, no dimension other than 0 whose
    split over tp (:data:`~distcheck.parallel.checkpoint.reference.TP_2D`) leaves a rank nothing (:data:`AVOIDED`)."""
    from distcheck.parallel.checkpoint.reference import TP_2D, shard_bounds

    dims: list[int | None] = [None, *range(len(shape))]
    if kind != "fsdp_tp":
        return dims
    return [d for d in dims if d is None or d == 0 or all(hi > lo for lo, hi in shard_bounds(shape[d], TP_2D))]


#: the largest load world drawn larger than the saving world (:func:`load_worlds`): the 2-D layout's smallest
MAX_LARGER_LOAD_WORLD = 4


def load_worlds(world_size: int) -> tuple[int, ...]:
    """The worlds a checkpoint saved at ``world_size`` ranks is also loaded on (module doc): one rank fewer (from
    3 ranks: a loader must then read every saved file, not one per loading rank) and twice as many, at most
    :data:`MAX_LARGER_LOAD_WORLD` (fewer files than loading ranks): 2 -> 4; 3 -> 2, 4; 4 -> 3; N -> N - 1 above.
    Uneven shards throughout: a tensor of 5 rows is 3 + 2 at 2 ranks, 2 + 2 + 1 at 3, 2 + 2 + 1 + 0 at 4."""
    from distcheck.core.validate import check_positive_int

    check_positive_int("world_size", world_size)
    smaller = (world_size - 1,) if world_size >= 3 else ()
    larger = min(2 * world_size, MAX_LARGER_LOAD_WORLD)
    return smaller + ((larger,) if larger > world_size else ())


def _cases(world_size: int, dtype: str, load_world_size: int | tuple[int, ...] | None = None
           ) -> st.SearchStrategy[CkptCase]:
    """Cases saved at ``world_size`` ranks and loaded at ``load_world_size`` (default the same; a tuple: one of
    them drawn, shrinking towards the first): each layout drawn from those its world can hold (``layouts_at``:
    the 2-D one from 4 ranks)."""
    from distcheck.parallel.checkpoint.reference import layout_dims, layouts_at

    loads = ((world_size,) if load_world_size is None else
             (load_world_size,) if isinstance(load_world_size, int) else tuple(load_world_size))

    eighths = st.integers(-8, 8).map(lambda k: k / 8)

    @st.composite
    def draw(draw: st.DrawFn) -> CkptCase:
        shapes = draw(st.lists(st.lists(st.integers(1, 7), min_size=1, max_size=2).map(tuple), min_size=1,
                               max_size=3))

        def array(shape: tuple[int, ...]) -> np.ndarray:
            n = int(np.prod(shape))
            return np.array(draw(st.lists(eighths, min_size=n, max_size=n)), dtype=np.float64).reshape(shape)

        def layout(n: int) -> tuple[str, tuple[int | None, ...]]:
            kind = draw(st.sampled_from(layouts_at(n)))
            tp = ([draw(st.sampled_from(tp_dim_choices(kind, s))) for s in shapes] if kind in ("tp", "fsdp_tp")
                  else None)
            return kind, layout_dims(kind, shapes, tp)

        steps = draw(st.integers(1, 2))
        rows, seed = BULK_ROWS, draw(st.integers(1, 16))
        params = (*(array(s) for s in shapes), bulk(rows, seed))
        grads = tuple((*(array(s) for s in shapes), bulk(rows, seed + k + 1)) for k in range(steps + 1))
        shapes = [*shapes, (rows,)]
        at_load = draw(st.sampled_from(loads))
        (a, da), (b, db) = layout(world_size), layout(at_load)
        return CkptCase(world_size, dtype, params, grads, a, da, b, db,
                        None if at_load == world_size else at_load)

    return draw()


_PROPERTIES = (
    PropertySpec("round_trip", "after the load every parameter, Adam moment and step count is bitwise what was "
                               "saved", "bitwise"),
    PropertySpec("next_step", "the next Adam step after the load is bitwise the saved run's next step", "bitwise"),
    PropertySpec("bytes", "the folder holds the closed form checkpoint.bytes_total.adam plus at most the stated "
                          "metadata bound", "exact"),
)


def bytes_bound(case: CkptCase, files: int) -> tuple[int, int]:
    """``(closed form, upper bound)`` of the bytes a checkpoint of ``case`` writes in ``files`` files."""
    from distcheck.engine.catalogue import form_value
    from distcheck.parallel.checkpoint.reference import shard_boxes

    b = np.dtype(case.dtype).itemsize
    P, T = sum(int(np.prod(s)) for s in case.shapes), len(case.shapes)
    form = int(form_value("checkpoint.bytes_total.adam", params=P, tensors=T, param_bytes=b, moment_bytes=b))
    items = 0
    for s, d in zip(case.shapes, case.dims_a, strict=True):
        boxes = shard_boxes(s, case.layout_a, d, case.world_size)
        writers = len({box for box in boxes if all(hi > lo for lo, hi in box)})
        items += 3 * writers + 1
    items += 1  # the optimizer's param_groups
    return form, form + METADATA_BYTES_PER_FILE * files + METADATA_BYTES_PER_ITEM * items


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _diff(what: str, want: dict, got: dict) -> list[str]:
    bad = []
    for key, v in want.items():
        if key not in got:
            bad.append(f"{what} {key}: missing")
        elif not _same(v, got[key]):
            w, g = np.asarray(v), np.asarray(got[key])
            at = 0
            if w.shape == g.shape:
                at = int(np.flatnonzero(w.ravel() != g.ravel())[0]) if (w != g).any() else 0
            bad.append(f"{what} {key}{list(w.shape)}: from flat index {at} expected {w.ravel()[at:at + 4].tolist()}, "
                       f"got {g.ravel()[at:at + 4].tolist()} ({g.dtype}{list(g.shape)})")
    return bad


def save_side(ctx: RankContext, target: Target, case: CkptCase, path: str) -> dict:
    """Rank side of the saving world of a case loaded elsewhere: the harness's ``save_rank`` with the target's
    ``save`` into ``path``."""
    from distcheck.parallel.checkpoint.harness import save_rank

    return save_rank(ctx, resolve(target).save, case, path)


def load_side(ctx: RankContext, target: Target, case: CkptCase, path: str) -> dict:
    """Rank side of the loading world: the harness's ``load_rank`` with the target's ``load`` from ``path``."""
    from distcheck.parallel.checkpoint.harness import load_rank

    return load_rank(ctx, resolve(target).load, case, path)


class CheckpointContract(Contract):
    """Save under one layout, load under another (see the module doc)."""

    name = "checkpoint"
    parallelism = "checkpoint"
    min_world_size = 2
    min_world_reason = ("one rank holds every tensor whole under every layout: a loader that assumes equal "
                        "shards or the saving layout is right there")
    summary = "a save/load pair: state bitwise after a reshard, the next step the saved run's, bytes the closed form"
    properties: ClassVar[tuple[PropertySpec, ...]] = _PROPERTIES
    options: ClassVar[tuple[Option, ...]] = (
        Option("reshard", True, bool, "load on another world too: N - 1 ranks (from 3) and 2N up to 4 (2 -> 4, "
                                      "3 -> 2 and 4, 4 -> 3), pools opened beside the certified world; false: "
                                      "save and load on the certified world alone"),
    )
    dtypes = ("float64", "float32")
    preload = ("torch.distributed.fsdp", "torch.distributed.checkpoint")

    def companion_worlds(self, world_size: int, options: dict) -> tuple[int, ...]:
        """:func:`load_worlds` under ``reshard`` (the default), else none; none below the smallest world."""
        if not options.get("reshard", True) or self.cannot_fail(world_size, options) is not None:
            return ()
        return load_worlds(world_size)

    def one_world_options(self, options: dict) -> dict | None:
        """``reshard`` false: save and load on the certified world alone."""
        return {**options, "reshard": False}

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        if not (callable(getattr(obj, "save", None)) and callable(getattr(obj, "load", None))):
            raise ProtocolError("target", ref or repr(obj), "must have callable save(state, path) and "
                                                            "load(state, path)")
        return make_target(obj, ref, "save_load"), options

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[CkptCase]:
        return _cases(world_size, dtype, (world_size, *self.companion_worlds(world_size, options)))

    def composition(self, case: CkptCase) -> dict[str, str]:
        return {"worlds": f"{case.world_size} -> {case.load_world}"}

    def run_case(self, world_of: Any, target: Target, case: CkptCase, dtype: str, options: dict,
                 timeout_s: float | None = None) -> list:
        """One example: on one world, :meth:`run_rank`; else the saving world's ``save_rank`` then the loading
        world's ``load_rank`` on a folder made here and removed after, each under ``timeout_s``. The results
        are the loading ranks', each with the saving world's ``saved``, ``next``, ``bytes`` and ``files``."""
        import shutil
        import tempfile

        timeout = {} if timeout_s is None else {"timeout_s": timeout_s}
        if case.load_world == case.world_size:
            return world_of(case.world_size).run(_round_trip, self, target, case, dtype, options, **timeout)
        path = tempfile.mkdtemp(prefix="distcheck-ckpt-")
        try:
            saved = world_of(case.world_size).run(save_side, target, case, path, **timeout)
            loaded = world_of(case.load_world).run(load_side, target, case, path, **timeout)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        first = {k: v for k, v in saved[0].items() if k != "local"}
        return [{**first, "loaded": got["loaded"], "loaded_next": got["next"]} for got in loaded]

    def run_rank(self, ctx: RankContext, target: Target, case: CkptCase, dtype: str, options: dict) -> dict:
        from distcheck.parallel.checkpoint.harness import round_trip

        obj = resolve(target)
        return round_trip(ctx, obj.save, obj.load, case)

    def check(self, case: CkptCase, results: list, world_size: int, dtype: str, options: dict
              ) -> dict[str, Outcome]:
        from distcheck.parallel.checkpoint.reference import layouts_at

        worlds = (world_size, *self.companion_worlds(world_size, options))
        note = AVOIDED if any("fsdp_tp" in layouts_at(n) for n in worlds) else ""

        where = (f"saved at {case.world_size} ranks, loaded at {case.load_world} (ranks of the loading world): "
                 if case.load_world != case.world_size else "")

        def verdict(bad: list[tuple[int, str]], where: str = where) -> Outcome:
            if not bad:
                return Outcome(True, max_error=0.0, bound=0.0, note=note)
            return Outcome(False, bound=0.0, ranks=tuple(sorted({r for r, _ in bad})),
                           message=where + "; ".join(f"rank {r}: {m}" for r, m in bad[:4]))

        trip = [(r, m) for r, res in enumerate(results) for m in _diff("loaded", res["saved"], res["loaded"])]
        nxt = [(r, m) for r, res in enumerate(results)
               for m in _diff("after the next step", res["next"], res["loaded_next"])]
        nxt += [(r, m) for r, res in enumerate(results) for m in _diff("loaded", {
            k: v for k, v in res["saved"].items() if k.endswith(".step")}, res["loaded"])]
        form, top = bytes_bound(case, results[0]["files"])
        got = results[0]["bytes"]
        size = [] if form <= got <= top else [(0, f"{got} B in {results[0]['files']} files, closed form "
                                                  f"checkpoint.bytes_total.adam {form} B, bound {top} B")]
        return {"round_trip": verdict(trip), "next_step": verdict(nxt), "bytes": verdict(size, "")}


def _round_trip(ctx: RankContext, contract: CheckpointContract, target: Target, case: CkptCase, dtype: str,
                options: dict) -> dict:
    return contract.run_rank(ctx, target, case, dtype, options)
