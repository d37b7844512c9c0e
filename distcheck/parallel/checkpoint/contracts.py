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

from distcheck.engine.contracts.contract import Contract, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, make_target, resolve
from distcheck.engine.world import RankContext

__all__ = ["CkptCase", "CheckpointContract", "METADATA_BYTES_PER_FILE", "METADATA_BYTES_PER_ITEM", "bytes_bound",
           "BULK_ROWS", "bulk", "AVOIDED", "tp_dim_choices"]

#: bound on a file's fixed overhead (a zip end record, ``.metadata``'s header), bytes
METADATA_BYTES_PER_FILE = 4096
#: bound on one saved item's overhead (its zip records and its ``.metadata`` entry), bytes
METADATA_BYTES_PER_ITEM = 4096


@dataclass(frozen=True)
class CkptCase:
    """One example: tensors ``params`` (float64 arrays, cast to ``dtype``), the gradients of ``steps``
    Adam steps and of the next one (``grads``), saved under ``(layout_a, dims_a)``, loaded under
    ``(layout_b, dims_b)``."""

    world_size: int
    dtype: str
    params: tuple
    grads: tuple
    layout_a: str
    dims_a: tuple
    layout_b: str
    dims_b: tuple

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [p.shape for p in self.params]

    def __repr__(self) -> str:
        return (f"CkptCase(N={self.world_size}, {self.dtype}, shapes={self.shapes}, steps={len(self.grads) - 1}, "
                f"save {self.layout_a}{list(self.dims_a)}, load {self.layout_b}{list(self.dims_b)}, "
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


def _cases(world_size: int, dtype: str, load_world_size: int | None = None) -> st.SearchStrategy[CkptCase]:
    """Cases saved at ``world_size`` ranks and loaded at ``load_world_size`` (default the same): each layout
    drawn from those its world can hold (``layouts_at``: the 2-D one from 4 ranks)."""
    from distcheck.parallel.checkpoint.reference import layout_dims, layouts_at

    at_load = world_size if load_world_size is None else load_world_size

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
        (a, da), (b, db) = layout(world_size), layout(at_load)
        return CkptCase(world_size, dtype, params, grads, a, da, b, db)

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


class CheckpointContract(Contract):
    """Save under one layout, load under another (see the module doc)."""

    name = "checkpoint"
    parallelism = "checkpoint"
    min_world_size = 2
    min_world_reason = ("one rank holds every tensor whole under every layout: a loader that assumes equal "
                        "shards or the saving layout is right there")
    summary = "a save/load pair: state bitwise after a reshard, the next step the saved run's, bytes the closed form"
    properties: ClassVar[tuple[PropertySpec, ...]] = _PROPERTIES
    dtypes = ("float64", "float32")

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        if not (callable(getattr(obj, "save", None)) and callable(getattr(obj, "load", None))):
            raise ProtocolError("target", ref or repr(obj), "must have callable save(state, path) and "
                                                            "load(state, path)")
        return make_target(obj, ref, "save_load"), options

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[CkptCase]:
        return _cases(world_size, dtype)

    def run_rank(self, ctx: RankContext, target: Target, case: CkptCase, dtype: str, options: dict) -> dict:
        from distcheck.parallel.checkpoint.harness import round_trip

        obj = resolve(target)
        return round_trip(ctx, obj.save, obj.load, case)

    def check(self, case: CkptCase, results: list, world_size: int, dtype: str, options: dict
              ) -> dict[str, Outcome]:
        from distcheck.parallel.checkpoint.reference import layouts_at

        note = AVOIDED if "fsdp_tp" in layouts_at(world_size) else ""

        def verdict(bad: list[tuple[int, str]]) -> Outcome:
            if not bad:
                return Outcome(True, max_error=0.0, bound=0.0, note=note)
            return Outcome(False, bound=0.0, ranks=tuple(sorted({r for r, _ in bad})),
                           message="; ".join(f"rank {r}: {m}" for r, m in bad[:4]))

        trip = [(r, m) for r, res in enumerate(results) for m in _diff("loaded", res["saved"], res["loaded"])]
        nxt = [(r, m) for r, res in enumerate(results)
               for m in _diff("after the next step", res["next"], res["loaded_next"])]
        nxt += [(r, m) for r, res in enumerate(results) for m in _diff("loaded", {
            k: v for k, v in res["saved"].items() if k.endswith(".step")}, res["loaded"])]
        form, top = bytes_bound(case, results[0]["files"])
        got = results[0]["bytes"]
        size = [] if form <= got <= top else [(0, f"{got} B in {results[0]['files']} files, closed form "
                                                  f"checkpoint.bytes_total.adam {form} B, bound {top} B")]
        return {"round_trip": verdict(trip), "next_step": verdict(nxt), "bytes": verdict(size)}
