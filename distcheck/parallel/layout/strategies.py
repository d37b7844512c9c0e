"""Hypothesis strategies of 3D layouts: valid ParallelConfigs, and configs that break exactly one rule.

Public path: :mod:`distcheck.strategies` (Hypothesis' conventions are listed there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from distcheck.core.validate import check_at_least, check_interval, check_optional_bool
from distcheck.core.vocab import LAYOUT_ORDER
from distcheck.engine.strategies import defines

if TYPE_CHECKING:
    from distcheck.parallel.layout.reference import ParallelConfig

__all__ = ["parallel_configs", "InvalidParallelConfig", "invalid_parallel_configs"]


AXIS_NAMES = tuple(axis.value for axis in LAYOUT_ORDER)


def _v_parallel_configs(*, min_tp: int, max_tp: int, min_pp: int, max_pp: int, min_dp: int, max_dp: int,
                        min_cp: int, max_cp: int, max_ep: int, max_world_size: int, min_gpus_per_node: int,
                        max_gpus_per_node: int, any_order: bool) -> None:
    for a in AXIS_NAMES:
        check_interval(f"min_{a}", locals()[f"min_{a}"], f"max_{a}", locals()[f"max_{a}"])
    check_at_least("max_ep", max_ep, 1)
    check_at_least("max_world_size", max_world_size, 1)
    check_interval("min_gpus_per_node", min_gpus_per_node, "max_gpus_per_node", max_gpus_per_node)
    check_optional_bool("any_order", any_order)
    least = min_tp * min_pp * min_dp * min_cp
    if least > max_world_size:
        raise InvalidArgument(
            f"Cannot have max_world_size={max_world_size} < min_tp*min_cp*min_pp*min_dp = "
            f"{min_tp}*{min_cp}*{min_pp}*{min_dp} = {least}"
        )


@defines(_v_parallel_configs)
def parallel_configs(
    draw: st.DrawFn,
    *,
    min_tp: int = 1, max_tp: int = 8,
    min_pp: int = 1, max_pp: int = 8,
    min_dp: int = 1, max_dp: int = 16,
    min_cp: int = 1, max_cp: int = 1,
    max_ep: int = 1,
    max_world_size: int = 256,
    min_gpus_per_node: int = 1, max_gpus_per_node: int = 8,
    any_order: bool = False,
) -> ParallelConfig:
    """A valid :class:`distcheck.parallel.layout.ParallelConfig` with ``world_size <= max_world_size``.

    - ``min_<axis>``/``max_<axis>`` for tp, pp, dp, cp: degree bounds (>= 1);
      defaults tp 1..8, pp 1..8, dp 1..16, cp 1..1.
    - ``max_ep``: ep is drawn among the divisors of dp*cp up to this (default 1).
    - ``max_world_size``: >= the product of the minimum degrees; default 256.
    - ``min_gpus_per_node``/``max_gpus_per_node``: default 1..8.
    - ``any_order``: False (default): Llama 3's order tp-cp-pp-dp; True: a random permutation.
    """
    from distcheck.parallel.layout.reference import ParallelConfig

    mins = {"tp": min_tp, "cp": min_cp, "pp": min_pp, "dp": min_dp}
    maxs = {"tp": max_tp, "cp": max_cp, "pp": max_pp, "dp": max_dp}
    degrees: dict[str, int] = {}
    budget = max_world_size
    for i, a in enumerate(AXIS_NAMES):
        rest = prod(mins[b] for b in AXIS_NAMES[i + 1:])
        high = min(maxs[a], budget // rest)
        degrees[a] = draw(st.integers(mins[a], max(mins[a], high)))
        budget //= degrees[a]
    data = degrees["dp"] * degrees["cp"]
    ep = draw(st.sampled_from([e for e in range(1, min(max_ep, data) + 1) if data % e == 0]))
    gpn = draw(st.integers(min_gpus_per_node, max_gpus_per_node))
    order = tuple(draw(st.permutations(AXIS_NAMES))) if any_order else None
    return ParallelConfig(tp=degrees["tp"], cp=degrees["cp"], pp=degrees["pp"], dp=degrees["dp"], ep=ep,
                          gpus_per_node=gpn, order=order)


@dataclass(frozen=True)
class InvalidParallelConfig:
    """Keyword arguments that ParallelConfig must reject, and the field its ConfigError must name."""

    kwargs: dict = field(hash=False)
    field: str
    reason: str


def _v_invalid_parallel_configs() -> None:
    pass


@defines(_v_invalid_parallel_configs)
def invalid_parallel_configs(draw: st.DrawFn) -> InvalidParallelConfig:
    """An :class:`InvalidParallelConfig`: one rule of ParallelConfig broken, the others kept.

    Kinds: a degree < 1 or not an int (field = that degree), ``world_size`` not the
    product of the degrees, ``ep`` not dividing ``dp*cp``, an unknown or repeated axis
    in ``order``, ``order`` omitting an axis of degree > 1, an unknown ``ep_placement``.
    """
    base = {a: draw(st.integers(1, 4)) for a in AXIS_NAMES}
    kind = draw(st.sampled_from(["degree", "not_int", "world_size", "ep", "order_unknown", "order_repeat",
                                 "order_missing", "ep_placement", "gpus_per_node"]))
    if kind == "degree":
        a = draw(st.sampled_from(AXIS_NAMES + ("ep",)))
        return InvalidParallelConfig({**base, a: draw(st.integers(-3, 0))}, a, "degree < 1")
    if kind == "not_int":
        a = draw(st.sampled_from(AXIS_NAMES))
        return InvalidParallelConfig({**base, a: draw(st.sampled_from([True, 2.0, "2", None]))}, a, "degree not an int")
    if kind == "world_size":
        product = prod(base.values())
        wrong = draw(st.integers(1, 4 * product).filter(lambda w: w != product))
        return InvalidParallelConfig({**base, "world_size": wrong}, "world_size", "world_size != product of degrees")
    if kind == "ep":
        data = base["dp"] * base["cp"]
        ep = draw(st.integers(2, 2 * data + 2).filter(lambda e: data % e != 0))
        return InvalidParallelConfig({**base, "ep": ep}, "ep", "ep does not divide dp*cp")
    if kind == "order_unknown":
        bad = draw(st.sampled_from(["xp", "sp", "fsdp", "TP"]))
        return InvalidParallelConfig({**base, "order": ("tp", bad, "pp", "dp")}, "order", "unknown axis")
    if kind == "order_repeat":
        a = draw(st.sampled_from(AXIS_NAMES))
        return InvalidParallelConfig({**base, "order": (a, a)}, "order", "repeated axis")
    if kind == "order_missing":
        a = draw(st.sampled_from(AXIS_NAMES))
        base[a] = max(base[a], 2)
        return InvalidParallelConfig({**base, "order": tuple(b for b in AXIS_NAMES if b != a)}, "order",
                                     f"order omits {a} of degree > 1")
    if kind == "ep_placement":
        return InvalidParallelConfig({**base, "ep_placement": draw(st.sampled_from(["inside", "dp", ""]))},
                                     "ep_placement", "unknown placement")
    return InvalidParallelConfig({**base, "gpus_per_node": draw(st.integers(-2, 0))}, "gpus_per_node",
                                 "gpus_per_node < 1")
