"""The names of the field, written once: every module that names a schedule, a collective,
a mesh axis or a verdict takes it from here.

Each vocabulary is a :class:`enum.StrEnum`: a member IS its string
(``Schedule.GPIPE == "gpipe"``, ``f"{Axis.TP}" == "tp"``), so plain strings from users,
answer keys and command lines compare equal to the members, and JSON output, reprs of
cases and error messages keep the plain strings (use :func:`names` for a tuple of them).

Property suites are not a vocabulary: they are the parallelism packages under
:mod:`distcheck.parallel`, found by walking it (:mod:`distcheck.engine.discovery`).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Schedule", "Collective", "PointToPoint", "ContextParallel", "Router", "Axis", "LAYOUT_ORDER",
           "ExpertPlacement", "Verdict", "names"]


class _Name(StrEnum):
    """A name that reads as its string everywhere: ``str``, ``format`` and ``repr``
    (``repr(Schedule.GPIPE) == "'gpipe'"``), so cases, rows and messages holding a member
    print exactly as they would holding the plain string."""

    def __repr__(self) -> str:
        return repr(self.value)


class Schedule(_Name):
    """Pipeline schedules the simulator runs (:mod:`distcheck.parallel.pp`).

    - ``gpipe``: all forwards, then all backwards (Huang et al. 2019, "GPipe");
    - ``1f1b``: PipeDream-Flush, one forward one backward in the steady state
      (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
      Clusters Using Megatron-LM", §2.2.1);
    - ``interleaved``: v model chunks per rank (same paper, §2.2.2);
    - ``looped_bfs``: v chunks per rank, every micro-batch through one chunk before the next
      (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism"; torch's ``ScheduleLoopedBFS``);
    - ``zb_h1``, ``zb_h2``: the backward split into input-gradient (I) and weight-gradient (W)
      passes, the weight passes moved into the bubble (Qi et al. 2023, "Zero Bubble Pipeline
      Parallelism", §2.1 and §2.2);
    - ``interleaved_zb``: ZB-H1 over v chunks per rank (torch's ``ScheduleInterleavedZeroBubble``);
    - ``zb_v``: two chunks per rank in a V (Qi et al. 2023, §6, ZB-V);
    - ``dualpipe``, ``dualpipev``: two pipelines in opposite directions with overlapped
      forward and backward pairs (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §3.2.1;
      the DualPipe repository's ``DualPipe`` and ``DualPipeV``).
    """

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    LOOPED_BFS = "looped_bfs"
    ZB_H1 = "zb_h1"
    ZB_H2 = "zb_h2"
    INTERLEAVED_ZB = "interleaved_zb"
    ZB_V = "zb_v"
    DUALPIPE = "dualpipe"
    DUALPIPEV = "dualpipev"


class Collective(_Name):
    """Collectives, named as torch.distributed names them (nccl-tests ``doc/PERFORMANCE.md``
    gives the bytes each sends)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"


class PointToPoint(_Name):
    """Point-to-point exchanges, not collectives: ``send_recv``, every rank sends one block to the next and
    receives one from the previous (torch.distributed's ``send``/``recv``, ``batch_isend_irecv``): the ring
    attention's pass (:mod:`distcheck.parallel.cp`)."""

    SEND_RECV = "send_recv"


class ContextParallel(_Name):
    """The ways of splitting attention over cp ranks (:mod:`distcheck.parallel.cp`).

    - ``ring``: K/V blocks rotate around the ring, partials merged by the online softmax (Liu et al.
      2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context");
    - ``all_gather``: K and V all-gathered before attention ("The Llama 3 Herd of Models", §3.3.2);
    - ``ulysses``: all-to-all from sequence shards to head shards and back (Jacobs et al. 2023,
      "DeepSpeed Ulysses").
    """

    RING = "ring"
    ALL_GATHER = "all_gather"
    ULYSSES = "ulysses"


class Router(_Name):
    """Where a mixture-of-experts router takes its softmax (:mod:`distcheck.parallel.ep`).

    - ``softmax_then_topk``: the softmax over all experts, then the k largest; the gates are those
      probabilities, not renormalised (Fedus et al. 2021, "Switch Transformers", §2.1, eq. 1-2, k = 1);
    - ``topk_then_softmax``: the k largest logits, then the softmax over those k (Mixtral's
      ``MixtralSparseMoeBlock``; GShard's top-2 gates renormalised to sum to 1 are the same numbers,
      Lepikhin et al. 2020, "GShard", Algorithm 1).
    """

    SOFTMAX_THEN_TOPK = "softmax_then_topk"
    TOPK_THEN_SOFTMAX = "topk_then_softmax"


class Axis(_Name):
    """Axes of a parallel layout (a device mesh): tensor, context, pipeline, data and expert
    parallelism. The first five members are the axes of :class:`distcheck.parallel.layout.ParallelConfig`
    in Llama 3's layout order, innermost first, with ``ep`` after them (it is carved out of
    dp x cp; "The Llama 3 Herd of Models", §3.3.2). The last two split dp in two, as hybrid
    sharded data parallelism (HSDP) does and torchtitan's ``ParallelDims`` names them:
    ``dp_replicate`` (replicas) and ``dp_shard`` (ranks one replica is sharded over); they are
    axes of :class:`distcheck.parallel.layout.AxisLayout`, not of ``ParallelConfig``.
    """

    TP = "tp"
    CP = "cp"
    PP = "pp"
    DP = "dp"
    EP = "ep"
    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"


#: the axes of the rank grid in Llama 3's layout order, innermost first: tp, cp, pp, dp
#: ("The Llama 3 Herd of Models", §3.3.2, Table 4); ep is carved out of dp x cp, not an axis of its own
LAYOUT_ORDER: tuple[Axis, ...] = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)


class ExpertPlacement(_Name):
    """Which ranks expert parallelism borrows in a training step's layout (:mod:`distcheck.parallel.step`), ep
    being no axis of the dense mesh (experts not tensor-parallel: expert tp = 1 in both):

    - ``torchtitan``: ep from the ``dp_shard x cp`` ranks of one replica, cp innermost (ep a multiple of cp, a
      divisor of dp_shard cp); the experts' data parallelism is the strided complement there, HSDP over
      ``dp_replicate`` (torchtitan's ``ParallelDims``: ``dp_shard_in_ep x cp`` is ep, ``dp_shard_mod_ep`` the
      experts' FSDP);
    - ``megatron``: ep from all the ``dp x cp`` data-parallel ranks, cp innermost, across replicas too (ep a
      divisor of dp cp); the experts' data parallelism is the strided complement over them (Megatron-core's
      ``RankGenerator`` expert layout, ``tp-cp-ep-dp-pp``, with cp folded into the data ranks).

    The two give the same ep groups whenever ep divides dp_shard cp; they differ in the experts' data-parallel
    groups when dp_replicate > 1, and Megatron's alone may span replicas.
    """

    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"


class Verdict(_Name):
    """The verdict of one result row. Each member IS its string (``Verdict.PASS == "pass"``), so
    rows built with plain strings compare equal and ``--format json`` writes the strings.

    - ``pass``: the check held.
    - ``FAIL``: it did not, or it could not run as it should (a crash, a timeout, a broken
      mutant, a failure no recorded finding explains exactly). The run exits 1.
    - ``skip``: it cannot run here; the detail names the reason.
    - ``finding``: the check FAILED with exactly the symptom of a recorded upstream
      discrepancy (:mod:`distcheck.engine.findings`); reported with its evidence, not a
      failure of the run.
    """

    PASS = "pass"
    FAIL = "FAIL"
    SKIP = "skip"
    FINDING = "finding"


def names(vocabulary: type[StrEnum]) -> tuple[str, ...]:
    """The members of ``vocabulary`` as plain strings, in definition order:
    ``names(Schedule)[:3] == ("gpipe", "1f1b", "interleaved")``."""
    return tuple(member.value for member in vocabulary)
