"""The inputs of a plan: the GPUs (:class:`Hardware`), the step (:class:`Workload`) and one
parallel layout (:class:`Layout`), each a frozen dataclass that validates itself, and the
names they take (recomputation, schedules, ZeRO stages, the parts of a GPU's memory).
:mod:`distcheck.plan.estimate` sizes a layout from them and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.errors import ConfigError
from distcheck.core.units import parse_bytes
from distcheck.core.validate import MAX_RANKS, check_choice, check_nonnegative_int, check_positive_int
from distcheck.core.vocab import Axis, Schedule
from distcheck.parallel import memory as memory_ref

__all__ = ["RECOMPUTE", "SCHEDULES", "ZERO_STAGES", "COMPONENTS", "COMM_AXES", "LESSON_STEPS", "ACTIVATION_BYTES",
           "MAX_GPU_BYTES", "Hardware", "Workload", "Layout"]

RECOMPUTE = ("none", "selective", "full")
#: pipeline schedules the planner sizes (the closed forms of :mod:`distcheck.parallel.pp.forms`)
SCHEDULES = (Schedule.ONE_F_ONE_B.value, Schedule.GPIPE.value)
ZERO_STAGES = (0, 1, 2, 3)
#: the parts of a GPU's memory, bottom to top in the charts
COMPONENTS = ("weights", "gradients", "optimizer", "activations")
COMM_AXES = (Axis.TP.value, Axis.PP.value, Axis.CP.value, Axis.DP.value)
#: the lesson's order of questions ("Choosing a strategy"), and a fifth beyond it
LESSON_STEPS = {
    1: "DDP",
    2: "ZeRO-1/2",
    3: "ZeRO-3 / FSDP",
    4: "TP inside a node, PP across nodes",
    5: "context parallelism (beyond the lesson's order)",
}
#: bytes of one activation element (16-bit), as Korthikanti et al. 2022 Table 2 assumes
ACTIVATION_BYTES = 2


def _exact(q: Fraction) -> int | Fraction:
    return int(q) if q.denominator == 1 else q


#: the most memory one GPU may have, in bytes: 2**50 (1 PiB), over 5,000 times today's largest GPUs (a larger
#: figure is a typo, and its plan would print dozens of digits)
MAX_GPU_BYTES = 2**50


def _bytes(field_name: str, value: object, *, allow_zero: bool = False) -> int | Fraction:
    if isinstance(value, str):
        try:
            value = parse_bytes(value)
        except ConfigError as exc:
            raise ConfigError(field_name, exc.value, exc.rule) from None  # exc.value: a short form of a long text
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise ConfigError(field_name, value, "must be a number of bytes (int or Fraction) or a size like '80 GB'")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(field_name, value, "must be >= 0 bytes" if allow_zero else "must be > 0 bytes")
    if value > MAX_GPU_BYTES:
        raise ConfigError(field_name, value, f"must be <= {MAX_GPU_BYTES:,} bytes (2**50 = 1 PiB, the most one GPU "
                                             "may have here)")
    return value


@dataclass(frozen=True)
class Hardware:
    """The GPUs a run gets.

    Args:
        gpus: GPUs in the run (1 .. 2**24); a whole number of nodes, or fewer
            GPUs than one node holds.
        gpu_memory: bytes of one GPU: an int or Fraction, or ``"80 GB"`` /
            ``"80 GiB"`` (GB = 1e9 bytes, GiB = 2**30); at most :data:`MAX_GPU_BYTES` (1 PiB).
        gpus_per_node: GPUs per server (default 8); tensor-parallel groups stay
            inside one.
        reserve: bytes of each GPU kept back (CUDA context, communication
            buffers, fragmentation), default 0; a layout fits when its total is
            at most ``gpu_memory - reserve``.

    Raises ConfigError naming the field: a non-integer or non-positive count,
    ``gpus`` not a whole number of nodes, a size that does not parse, or a
    reserve that leaves no memory.
    """

    gpus: int
    gpu_memory: int | Fraction | str
    gpus_per_node: int = 8
    reserve: int | Fraction | str = 0

    def __post_init__(self) -> None:
        check_positive_int("gpus", self.gpus)
        check_positive_int("gpus_per_node", self.gpus_per_node)
        if self.gpus > MAX_RANKS:
            raise ConfigError("gpus", self.gpus, f"must be <= {MAX_RANKS} (2**24)")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ConfigError("gpus", self.gpus, f"must be a multiple of gpus_per_node={self.gpus_per_node} "
                                                 f"(whole nodes) or at most {self.gpus_per_node}")
        gpu_memory = _bytes("gpu_memory", self.gpu_memory)
        reserve = _bytes("reserve", self.reserve, allow_zero=True)
        object.__setattr__(self, "gpu_memory", gpu_memory)
        object.__setattr__(self, "reserve", reserve)
        if reserve >= gpu_memory:
            raise ConfigError("reserve", reserve, f"must be less than gpu_memory={gpu_memory} bytes")

    @property
    def usable_bytes(self) -> int | Fraction:
        """``gpu_memory - reserve``: what a layout may fill."""
        return _exact(Fraction(self.gpu_memory) - Fraction(self.reserve))

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)


@dataclass(frozen=True)
class Workload:
    """What one training step does.

    Args:
        seq_len: tokens per sequence s (>= 1).
        micro_batch_size: sequences per micro-batch b (>= 1).
        num_microbatches: micro-batches per step m (>= 1), per data-parallel
            replica: the pipeline's micro-batches, or gradient-accumulation
            steps without a pipeline.
        recompute: ``"none"``, ``"selective"`` or ``"full"`` (Korthikanti et al. 2022).
        sequence_parallel: split the non-tensor-parallel activations by tp too
            (default True; it changes nothing at tp = 1).
        bytes_per_param: a convention of :data:`distcheck.parallel.memory.CONVENTIONS`.
        schedule: ``"1f1b"`` (default) or ``"gpipe"``.

    Raises ConfigError naming the field.
    """

    seq_len: int = 2048
    micro_batch_size: int = 1
    num_microbatches: int = 8
    recompute: str = "selective"
    sequence_parallel: bool = True
    bytes_per_param: str = "mixed_adamw"
    schedule: str = Schedule.ONE_F_ONE_B.value

    def __post_init__(self) -> None:
        check_positive_int("seq_len", self.seq_len)
        check_positive_int("micro_batch_size", self.micro_batch_size)
        check_positive_int("num_microbatches", self.num_microbatches)
        check_choice("recompute", self.recompute, RECOMPUTE)
        if not isinstance(self.sequence_parallel, bool):
            raise ConfigError("sequence_parallel", self.sequence_parallel, "must be a bool")
        memory_ref.bytes_per_param(self.bytes_per_param)  # validates the name
        check_choice("schedule", self.schedule, SCHEDULES)

    @property
    def convention(self) -> memory_ref.BytesPerParam:
        return memory_ref.bytes_per_param(self.bytes_per_param)


@dataclass(frozen=True)
class Layout:
    """One parallel layout: ``tp * pp * dp * cp`` GPUs and a ZeRO stage (0 = plain DDP)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    zero: int = 0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp"):
            check_positive_int(name, getattr(self, name))
        check_nonnegative_int("zero", self.zero)
        if self.zero not in ZERO_STAGES:
            raise ConfigError("zero", self.zero, "must be 0, 1, 2 or 3")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def shard_ranks(self) -> int:
        """The ranks ZeRO shards over and gradients are averaged over: ``dp * cp``."""
        return self.dp * self.cp

    @property
    def lesson_step(self) -> int:
        """Which of the lesson's questions this layout answers (keys of :data:`LESSON_STEPS`)."""
        if self.cp > 1:
            return 5
        if self.tp * self.pp > 1:
            return 4
        return {0: 1, 1: 2, 2: 2, 3: 3}[self.zero]

    @property
    def question(self) -> str:
        """The lesson's question this layout answers, as the plan shows it: :attr:`lesson_step`, with
        ``"4 (TP alone)"`` for a question-4 layout without pipeline stages (``pp == 1``), which uses no
        "PP across nodes"."""
        if self.lesson_step == 4 and self.pp == 1:
            return "4 (TP alone)"
        return str(self.lesson_step)

    @property
    def label(self) -> str:
        """``"TP 8 × PP 2 × DP 4, ZeRO-1"`` (degrees of 1 left out, except DP)."""
        parts = [f"{name} {v}" for name, v in (("TP", self.tp), ("CP", self.cp), ("PP", self.pp)) if v > 1]
        parts.append(f"DP {self.dp}")
        return " × ".join(parts) + f", ZeRO-{self.zero}"

    def as_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "zero": self.zero}


