"""Checkpoint properties: resharding is bitwise, the step count survives, the bytes are the closed forms,
and an interrupted save loses nothing.

Implementation slots:

* ``load(checkpoint, dims, world_size) -> Loaded`` (:func:`distcheck.parallel.checkpoint.load`): a loader
  of a :class:`~distcheck.parallel.checkpoint.Checkpoint` under another layout;
* ``checkpoint_bytes(shapes, dims, world_size, *, param_bytes, moment_bytes, step_bytes) -> (per_rank,
  total)`` (:func:`distcheck.parallel.checkpoint.checkpoint_bytes`);
* ``save(root, files, *, name, hook=None)`` (:func:`distcheck.parallel.checkpoint.save_swap`): a saver of
  a checkpoint folder, with the kill points' hook.

Exactness: loading copies bits, so every comparison is bitwise (``np.array_equal`` on the same dtype, and
the bytes of each array); Adam's next step is elementwise, so the loaded shards' step equals the saved
run's step on the same elements bit for bit. Bytes are exact integers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from fractions import Fraction
from types import ModuleType
from typing import Any

import numpy as np

from distcheck.core.errors import ImplementationError, PropertyFailure
from distcheck.engine.catalogue import form_value as _form
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.checkpoint import strategies as cs

__all__ = ["reshard_bitwise", "reshard_step", "bytes_closed_form", "atomic_swap", "Killed"]


class Killed(BaseException):
    """The kill point of an interrupted save: raised from the hook, a BaseException so that no ``except
    Exception`` of the saver can catch it (a SIGKILL runs no handler); the files written so far stay on
    disk as a killed process leaves them (every write is an unbuffered ``os.write``)."""


def _ref() -> ModuleType:
    from distcheck.parallel.checkpoint import reference

    return reference


def _load(*args: Any, **kwargs: Any) -> Any:
    return _ref().load(*args, **kwargs)


def _bytes(*args: Any, **kwargs: Any) -> Any:
    return _ref().checkpoint_bytes(*args, **kwargs)


def _save(*args: Any, **kwargs: Any) -> Any:
    from distcheck.parallel.checkpoint.swap import save_swap

    return save_swap(*args, **kwargs)


def _state(case: cs.ReshardCase) -> tuple[dict[str, np.ndarray], list[int | None], list[int | None]]:
    """Parameters and moments as one state, each moment sharded as its parameter."""
    state, dims = {}, []
    for (name, p), dim in zip(case.params.items(), case.dims_a, strict=True):
        state[name] = p
        dims.append(dim)
    for (name, (m, v)), dim in zip(case.moments.items(), case.dims_a, strict=True):
        state[f"{name}.exp_avg"], state[f"{name}.exp_avg_sq"] = m, v
        dims += [dim, dim]
    dims_b = list(case.dims_b) + [d for d in case.dims_b for _ in range(2)]
    return state, dims, dims_b


def _loaded(case: cs.ReshardCase, impl: Callable[..., Any]) -> tuple[dict[str, np.ndarray], list[int | None], Any]:
    ref = _ref()
    state, dims_a, dims_b = _state(case)
    ckpt = ref.save(state, dims_a, case.world_a, case.step)
    got = call_impl("load", impl, ckpt, dims_b, case.world_b)
    if len(got.shards) != case.world_b:
        raise PropertyFailure(f"{case}: shards of {len(got.shards)} ranks", expected=case.world_b,
                              got=len(got.shards))
    return state, dims_b, got


def reshard_bitwise(case: cs.ReshardCase, *, impl: Callable[..., Any] = _load) -> None:
    """Saved under layout A at N ranks, loaded under layout B at M: every rank's shard of every parameter and
    Adam moment is bitwise the shard of what was saved, in its dtype."""
    ref = _ref()
    state, dims_b, got = _loaded(case, impl)
    for r, shards in enumerate(got.shards):
        for (name, full), dim in zip(state.items(), dims_b, strict=True):
            want = ref.shard(full, dim, case.world_b, r)
            have = shards.get(name)
            if have is None or have.dtype != want.dtype or have.shape != want.shape or \
                    have.tobytes() != want.tobytes():
                shown = None if have is None else f"{have.dtype}{list(have.shape)} {have.ravel()[:6].tolist()}"
                raise PropertyFailure(f"{case}: rank {r}'s {name}", expected=f"{want.dtype}{list(want.shape)} "
                                      f"{want.ravel()[:6].tolist()}", got=shown)


def reshard_step(case: cs.ReshardCase, *, impl: Callable[..., Any] = _load) -> None:
    """The step count is restored, and the next Adam step on every loaded shard is bitwise the shard of the
    step the saved run would have taken (bias corrections 1 - beta^t read the step count)."""
    ref = _ref()
    state, dims_b, got = _loaded(case, impl)
    if got.step != case.step:
        raise PropertyFailure(f"{case}: Adam's step count after loading", expected=case.step, got=got.step)
    for name, p in case.params.items():
        m, v = case.moments[name]
        want = ref.adam_step(p, case.grads[name], m, v, case.step)[0]
        dim = dims_b[list(case.params).index(name)]
        for r, shards in enumerate(got.shards):
            g = ref.shard(case.grads[name], dim, case.world_b, r)
            mine = ref.adam_step(shards[name], g, shards[f"{name}.exp_avg"], shards[f"{name}.exp_avg_sq"],
                                 got.step)[0]
            expect = ref.shard(want, dim, case.world_b, r)
            if not np.array_equal(mine, expect, equal_nan=True):
                raise PropertyFailure(f"{case}: rank {r}'s {name} after the next Adam step",
                                      expected=expect.ravel()[:6].tolist(), got=mine.ravel()[:6].tolist())


def bytes_closed_form(case: cs.ReshardCase, *, impl: Callable[..., Any] = _bytes) -> None:
    """Bytes of the checkpoint with and without Adam's state equal checkpoint.bytes_total.{model,adam} under
    every layout, and the reference's saved items; each rank holds checkpoint.bytes_per_rank.replicated under
    DDP and checkpoint.bytes_per_rank.sharded under FSDP2 when N divides every dim 0; a sharded layout's
    ranks together hold the total (the step counts N times)."""
    ref = _ref()
    shapes = case.shapes
    b = case.params[next(iter(case.params))].itemsize
    P, T = sum(int(np.prod(s)) for s in shapes), len(shapes)
    n = case.world_a
    for kind, dims in (("layout A", case.dims_a), ("replicated", (None,) * T), ("fsdp", (0,) * T)):
        per, total = call_impl("checkpoint_bytes", impl, shapes, dims, n, param_bytes=b)
        want = _form("checkpoint.bytes_total.model", params=P, param_bytes=b)
        written = ref.data_bytes(ref.save(case.params, dims, n))
        if Fraction(total) != want or written != want:
            raise PropertyFailure(f"{case}: model bytes in total under {kind}, saved items {written} B", expected=want,
                                  got=total)
        per, total = call_impl("checkpoint_bytes", impl, shapes, dims, n, param_bytes=b, moment_bytes=4,
                               step_bytes=4)
        want = _form("checkpoint.bytes_total.adam", params=P, tensors=T, param_bytes=b)
        if Fraction(total) != want:
            raise PropertyFailure(f"{case}: bytes with Adam's state in total under {kind}", expected=want, got=total)
        if len(per) != n:
            raise PropertyFailure(f"{case}: bytes per rank of {len(per)} ranks", expected=n, got=len(per))
        if kind == "replicated":
            rep = _form("checkpoint.bytes_per_rank.replicated", params=P, tensors=T, param_bytes=b)
            if any(Fraction(x) != rep for x in per):
                raise PropertyFailure(f"{case}: bytes a DDP rank holds", expected=rep, got=list(per))
        if kind == "fsdp":
            if sum(per) != total + (n - 1) * 4 * T:
                raise PropertyFailure(f"{case}: FSDP2 ranks' bytes summed (step counts on each)",
                                      expected=total + (n - 1) * 4 * T, got=sum(per))
            if all(s[0] % n == 0 for s in shapes):
                sh = _form("checkpoint.bytes_per_rank.sharded", params=P, tensors=T, param_bytes=b, world_size=n)
                if any(Fraction(x) != sh for x in per):
                    raise PropertyFailure(f"{case}: bytes an FSDP2 rank holds", expected=sh, got=list(per))


def atomic_swap(case: cs.SwapCase, *, impl: Callable[..., Any] = _save) -> None:
    """A save killed after its first write reaching ``kill_at`` bytes leaves a complete checkpoint loadable:
    the previous one (or the new one, where the kill came after its pointer was in place); a save that
    completes leaves the new one; the next save after a kill succeeds (the staging left behind is no
    obstacle)."""
    from distcheck.parallel.checkpoint.swap import load_swap

    def hook(written: int) -> None:
        if written >= case.kill_at:
            raise Killed(written)

    with tempfile.TemporaryDirectory(prefix="distcheck-swap-") as root:
        call_impl("save", impl, root, case.old, name="a")
        killed = False
        try:
            impl(root, case.new, name="b", hook=hook)
        except Killed:
            killed = True
        except Exception as e:  # a crash of the saver itself, not a verdict on a kill
            why = str(e).replace(root, "<checkpoint folder>")
            raise ImplementationError(f"implementation save raised {type(e).__name__}: {why}", "raised",
                                      type(e).__name__) from e
        try:
            got = load_swap(root)
        except Exception as e:  # noqa: BLE001 (any failure to load is the finding)
            why = str(e).replace(root, "<checkpoint folder>")  # the report stays the same from run to run
            raise PropertyFailure(f"kill at {case.kill_at} B: the latest checkpoint does not load ({why})",
                                  expected=sorted(case.old), got=None) from None
        if got != case.old and got != case.new:
            raise PropertyFailure(f"kill at {case.kill_at} B: a checkpoint that is neither the old nor the new",
                                  expected=sorted(case.old), got=sorted(got))
        if not killed and got != case.new:
            raise PropertyFailure("a save that completed: the latest checkpoint", expected=sorted(case.new),
                                  got=sorted(got))
        call_impl("save", impl, root, case.new, name="c")
        if load_swap(root) != case.new:
            raise PropertyFailure(f"kill at {case.kill_at} B: the save after the kill", expected=sorted(case.new),
                                  got=sorted(load_swap(root)))


def _reshard_edges() -> tuple[cs.ReshardCase, ...]:
    """An uneven FSDP2 save at 2 ranks (5 rows: 3 and 2) loaded at 4 (2, 2, 1, 0); a tp save along dim 1 at 4
    loaded at 3; a replicated save at 1 loaded by FSDP2 at 8 (more ranks than rows)."""
    def case(shapes: list[tuple[int, ...]], a: tuple[str, int, Any], b: tuple[str, int, Any],
             dtype: Any = np.float32) -> cs.ReshardCase:
        from distcheck.parallel.checkpoint.reference import layout_dims

        params = {f"t{i}": (np.arange(np.prod(s), dtype=np.float64).reshape(s) / 8 - 1).astype(dtype)
                  for i, s in enumerate(shapes)}
        moments = {k: (p * 2, abs(p)) for k, p in params.items()}
        grads = {k: p / 4 + 1 for k, p in params.items()}
        da = layout_dims(a[0], shapes, a[2])
        db = layout_dims(b[0], shapes, b[2])
        return cs.ReshardCase(params, moments, 3, grads, a[0], da, a[1], b[0], db, b[1])

    return (case([(5, 3), (5,)], ("fsdp", 2, None), ("fsdp", 4, None)),
            case([(4, 6), (4,)], ("tp", 4, (1, None)), ("tp", 3, (1, None)), np.float64),
            case([(3, 2)], ("replicated", 1, None), ("fsdp", 8, None), np.float16),
            case([(6, 4), (6,)], ("fsdp", 2, None), ("fsdp", 2, None)))


def _swap_edges() -> tuple[cs.SwapCase, ...]:
    """Killed before any byte, in the middle of the first file, just before the pointer, and never."""
    old, new = {"model.bin": b"old" * 5}, {"model.bin": b"new" * 7, "optim.bin": b"m" * 20}
    data = sum(map(len, new.values()))
    return (cs.SwapCase(old, new, 0), cs.SwapCase(old, new, 9), cs.SwapCase(old, new, data + 60),
            cs.SwapCase(old, new, data + 105), cs.SwapCase(old, new, 10**6))


_sig_load = "load(checkpoint, dims, world_size) -> Loaded"
register(Property("checkpoint.reshard.bitwise", cs.reshard_cases, reshard_bitwise,
                  "saved under layout A at N ranks, loaded under B at M: every shard of every parameter and Adam "
                  "moment bitwise what was saved", _load, _sig_load, _reshard_edges))
register(Property("checkpoint.reshard.step", cs.reshard_cases, reshard_step,
                  "the step count restored; the next Adam step after loading bitwise the saved run's", _load,
                  _sig_load, _reshard_edges))
register(Property("checkpoint.bytes.closed_form", cs.reshard_cases, bytes_closed_form,
                  "checkpoint bytes in total == checkpoint.bytes_total.{model,adam} under every layout; per rank "
                  "== checkpoint.bytes_per_rank.{replicated,sharded}, exactly", _bytes,
                  "checkpoint_bytes(shapes, dims, world_size, *, param_bytes, moment_bytes, step_bytes)",
                  _reshard_edges))
register(Property("checkpoint.atomic.swap", cs.swap_cases, atomic_swap,
                  "a save killed at any byte leaves the previous checkpoint loadable and complete; the next save "
                  "succeeds", _save, "save(root, files, *, name, hook=None)", _swap_edges))
