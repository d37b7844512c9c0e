"""Pipeline parallelism: schedules of p stages over m micro-batches, simulated exactly.

- ``reference``: the public names (``simulate``, ``replay``, ``schedule_order``, ``placement``,
  ``from_torch_actions``); ``actions`` (actions, spans, limits), ``order`` (an order as arrays,
  its checks and dependencies), ``simulator`` (the engine: a prefix maximum per rank, sweeps over
  the ranks), ``timeline`` (the figures; spans, grid and Gantt chart on demand), ``plain`` (the
  one-action-at-a-time replay, the engine's oracle), ``schedules`` (GPipe, 1F1B, interleaved,
  looped BFS; shapes and placement), ``zero_bubble`` (ZB-H1, ZB-H2, interleaved ZB, ZB-V),
  ``dualpipe`` (DualPipe, DualPipeV), ``build`` (helpers);
- ``forms`` (+ ``forms_zero_bubble``): step, busy and idle ticks, both bubble conventions, the
  stash, the split schedules' bubbles with and without a barrier, parameter copies, the
  published formulas with their regimes;
- ``strategies``: (schedule, p, m, v, t_f, t_b); split-backward cases; perturbed orders;
- ``properties`` (+ ``properties_zero_bubble``): simulator == closed forms for every schedule,
  engine == plain replay, W after its I, the published stash bounds;
- ``mutants``: the bubble ratio labelled as a fraction of total time; a stash that ignores m; the
  engine stopped after one sweep; W before its I; DeepSeek's B read as Qi et al.'s; ZB-H1 with its
  weight passes deferred;
- ``proofs``: the GPipe bubble, fraction = ratio / (1 + ratio), interleaved = 1F1B / v, the
  bubble vanishing as m grows, the two readings of B;
- ``tables``, ``checks``, ``findings``: torch.distributed.pipelining's tables and real worlds
  against the simulator (torch imported inside functions), and the recorded torch findings.

Sources: Huang et al. 2019, "GPipe" (arXiv:1811.06965); Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (arXiv:2104.04473),
§2.2; Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism" (arXiv:2211.05953); Qi et al.
2023, "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241); DeepSeek-AI 2024, "DeepSeek-V3
Technical Report" (arXiv:2412.19437), §3.2.1; the lesson "Scaling and distributed training"
(adapted in part from *AI Engineering from Scratch*), "Pipeline bubble". docs/PIPELINES.md.

Public API: this package, ``distcheck.parallel.pp``: the names of ``__all__``, served on first
access from its internal modules (``reference``). Every module inside the package is internal; its
closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "Schedule", "SCHEDULES", "SPLIT_BACKWARD", "KINDS", "Action", "Span", "Timeline", "DeadlockError",
    "schedule_order", "placement", "replay", "simulate", "from_torch_actions", "MAX_ACTIONS", "MAX_GRID_CELLS",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference",))
