"""The compositions of the ``training-step`` contract (numpy only): the axes a target may draw, the layouts of a world
size (:func:`layouts`), the ``layout`` and ``axes`` options (:func:`parse_layout`).

The axes are the dense step's ``dp_replicate``, ``dp_shard``, ``tp`` and ``pp`` (drawn by default), ``cp`` (a mesh
dim) and ``ep`` (borrowed from the ``dp x cp`` ranks under a named placement,
:class:`~distcheck.core.vocab.ExpertPlacement`), drawn when named (``--option axes=all`` names all six), in float64
only (:data:`LOW_PRECISION_AXES` says why float32 and bfloat16 draw neither).
"""

from __future__ import annotations

from itertools import product
from typing import Any

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.core.vocab import Axis, ExpertPlacement, Schedule, names
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.parallel.step.reference import StepLayout

__all__ = ["AXES", "DEFAULT_AXES", "ALL", "OWN_MODEL_AXES", "EP_PLACEMENTS", "PLACEMENT_KEY", "PP_SCHEDULES",
           "LOW_PRECISION_AXES", "parse_layout", "layouts", "axes_option", "target_axes", "allowed",
           "low_precision_refused"]

#: the step's axes in the order its compositions are shown (the vocabulary's names)
AXES: tuple[str, ...] = tuple(a.value for a in (Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.TP, Axis.PP, Axis.CP,
                                                 Axis.EP))
#: the axes drawn unless the target or the axes option names others: the dense step's (cp and ep are drawn when
#: named, ``--option axes=all`` naming all six: a parallelize function that predates them is not held to them)
DEFAULT_AXES: tuple[str, ...] = tuple(a.value for a in (Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.TP, Axis.PP))
#: the axes option's word for every axis
ALL = "all"
#: the axes a StepTarget with its own model draws unless it names its axes: its model has no pipeline split (pp
#: is added when it gives its own ``pipeline`` hook), and no attention core or MoE layers distcheck knows (a user
#: model's context or expert parallelism is named)
OWN_MODEL_AXES: tuple[str, ...] = tuple(a.value for a in (Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.TP))
#: where ep's ranks come from (the vocabulary's names): every placement is drawn where it fits
EP_PLACEMENTS: tuple[str, ...] = names(ExpertPlacement)
#: the layout option's key for ep's placement
PLACEMENT_KEY = "ep_placement"
#: the pipeline schedules drawn under pp > 1 (torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B)
PP_SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B)


def parse_layout(text: str) -> StepLayout:
    """``"dp_shard=2,tp=2"`` or ``"dp_shard=2,cp=2,ep=4,ep_placement=megatron"`` as a :class:`StepLayout` (axes
    left out are 1; ``ep_placement`` defaults to ``torchtitan`` when ep > 1). Raises ConfigError naming the option
    for an unknown axis, an axis set twice, a degree that is not a positive int, an unknown placement, or a layout
    :class:`StepLayout` refuses (an ep its placement's ranks do not hold)."""
    degrees: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in (*AXES, PLACEMENT_KEY):
            raise ConfigError("option layout", text, f"axis {name!r} must be one of {', '.join(AXES)} (or "
                              f"{PLACEMENT_KEY}={'|'.join(EP_PLACEMENTS)})")
        if name in degrees:
            raise ConfigError("option layout", text, f"sets {name} twice")
        if name == PLACEMENT_KEY:
            degrees[name] = value.strip()
            if degrees[name] not in EP_PLACEMENTS:
                raise ConfigError("option layout", text, f"{PLACEMENT_KEY} must be one of {', '.join(EP_PLACEMENTS)}")
            continue
        try:
            degrees[name] = check_positive_int(f"option layout {name}", int(value))
        except ValueError:
            raise ConfigError("option layout", text, f"{name} must be a positive integer") from None
    if degrees.get(Axis.EP.value, 1) > 1:
        degrees.setdefault(PLACEMENT_KEY, ExpertPlacement.TORCHTITAN.value)
    elif PLACEMENT_KEY in degrees:
        raise ConfigError("option layout", text, f"names {PLACEMENT_KEY} without ep > 1")
    try:
        return StepLayout(**degrees)
    except ConfigError as exc:
        raise ConfigError("option layout", text, str(exc)) from None


def layouts(world_size: int) -> list[StepLayout]:
    """Every ``dp_replicate x dp_shard x tp x pp x cp`` factorisation of ``world_size`` with tp in {1, 2, 4}, pp in
    {1, 2} and cp in {1, 2, 4} (pp = 2 x tp = 2 included: each stage's decoder under the tensor-parallel plan;
    cp with tp too, not with pp), and for each with tp = pp = 1 every ep > 1 that each placement of
    :data:`EP_PLACEMENTS` borrows from its data-parallel ranks (experts are not tensor-parallel, and the MoE
    decoder has no pipeline split), the simplest first (fewest axes above 1, then dense before expert-parallel,
    then FSDP before HSDP before tp before pp before cp)."""
    found = [StepLayout(dr, ds, tp, pp, cp) for dr, ds, tp, pp, cp in product(range(1, world_size + 1), repeat=5)
             if dr * ds * tp * pp * cp == world_size and tp in (1, 2, 4) and pp in (1, 2) and cp in (1, 2, 4)
             and (cp == 1 or pp == 1)]
    experts = []
    for lay in found:
        if lay.tp > 1 or lay.pp > 1:
            continue
        for ep in range(2, lay.dp_cp + 1):
            for placement in EP_PLACEMENTS:
                try:
                    experts.append(StepLayout(lay.dp_replicate, lay.dp_shard, 1, 1, lay.cp, ep, placement))
                except ConfigError:  # this placement's ranks do not hold ep
                    continue
    return sorted(found + experts, key=lambda lay: (sum(getattr(lay, a) > 1 for a in AXES), lay.ep > 1, lay.cp,
                                                    lay.pp, lay.tp, lay.dp_replicate, lay.ep,
                                                    EP_PLACEMENTS.index(lay.ep_placement) if lay.ep > 1 else 0))


def axes_option(text: str) -> tuple[str, ...]:
    """The ``axes`` option, ``"dp_replicate,dp_shard"``, as a tuple (the empty option: the dense step's four,
    dp_replicate, dp_shard, tp and pp; ``all``: the six, cp and ep too). ConfigError naming the option for an axis
    that is not one of the six, one named twice, or a value that names none."""
    if text.strip() == ALL:
        return AXES
    names = tuple(filter(None, (p.strip() for p in text.split(","))))
    for name in names:
        if name not in AXES:
            raise ConfigError("option axes", text, f"axis {name!r} must be one of {', '.join(AXES)}")
    if len(set(names)) < len(names):
        raise ConfigError("option axes", text, "names an axis twice")
    if text.strip() and not names:
        raise ConfigError("option axes", text, f"names no axis: give one or more of {', '.join(AXES)}, "
                          f"comma-separated, or {ALL}")
    return names or DEFAULT_AXES


def target_axes(axes: Any, shown: str) -> tuple[str, ...]:
    """A :class:`StepTarget`'s ``axes`` checked: a tuple (or list) of distinct mesh dim names, possibly empty.
    ProtocolError naming the target otherwise (a bare string included: ``("dp_replicate",)``, not
    ``"dp_replicate"``)."""
    if isinstance(axes, str) or not isinstance(axes, (tuple, list)) or not all(isinstance(a, str) for a in axes):
        raise ProtocolError("target", shown, f"StepTarget axes={axes!r} must be a tuple of mesh dim names, e.g. "
                            "axes=(\"dp_replicate\",)")
    bad = [a for a in axes if a not in AXES]
    if bad:
        raise ProtocolError("target", shown, f"StepTarget axes {bad} must be among {', '.join(AXES)}")
    if len(set(axes)) < len(axes):
        raise ProtocolError("target", shown, f"StepTarget axes={tuple(axes)!r} names an axis twice")
    return tuple(axes)


def allowed(world_size: int, options: dict) -> list[StepLayout]:
    """:func:`layouts` of ``world_size`` with every axis outside the ``axes`` option at 1."""
    allowed = axes_option(options.get("axes", ""))
    return [lay for lay in layouts(world_size) if all(getattr(lay, a) == 1 for a in AXES if a not in allowed)]


#: why float32 and bfloat16 draw no cp and no ep (the training-step contract's doc): the axis -> the reason
LOW_PRECISION_AXES = {
    Axis.CP.value: "the ring's online softmax merges each query's attention blocks in another order than the single "
                   "device's one softmax, in the compute dtype: new roundings whose constants are not measured (the "
                   "criterion's c and floor are derived or measured for dp, pp and tp only)",
    Axis.EP.value: "the MoE router's top-k is discontinuous: one rounding of the parallel run's own (the experts' "
                   "rows grouped otherwise) can route a later layer's token to another expert than the single device "
                   "does, a difference no multiple of the single device's error bounds; and the single-device step "
                   "in a low precision runs each dp rank's micro-batches alone, where the load-balancing loss is over "
                   "the global micro-batch",
}


def low_precision_refused(options: dict) -> list[str]:
    """The axes of :data:`LOW_PRECISION_AXES` that ``options`` would draw above 1 (the pinned layout's, else
    the axes option's, a StepTarget's own axes being set there by ``resolve``)."""
    if options.get("layout"):
        lay = parse_layout(options["layout"])
        return [a for a in LOW_PRECISION_AXES if getattr(lay, a) > 1]
    return [a for a in LOW_PRECISION_AXES if a in axes_option(options.get("axes", ""))]
