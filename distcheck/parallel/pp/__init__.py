"""Pipeline parallelism: schedules of p stages over m micro-batches, simulated tick by tick.

- ``reference``: the orders of GPipe, 1F1B and interleaved 1F1B and ``simulate``; ``actions``
  (actions, spans, limits) and ``timeline`` (replay of any per-rank order, bubble, stash,
  Gantt chart); the adapter from ``torch.distributed.pipelining``'s action tables;
- ``forms``: step, busy and idle ticks, both bubble conventions, peak micro-batches in flight;
- ``strategies``: (schedule, p, m, v, t_f, t_b) respecting each schedule's constraints;
- ``properties``: simulator == closed forms, for every schedule, m < p included;
- ``mutants``: the bubble ratio labelled as a fraction of total time; a stash that ignores m;
- ``proofs``: the GPipe bubble, fraction = ratio / (1 + ratio), interleaved = 1F1B / v, the
  bubble vanishing as m grows.

Sources: Huang et al. 2019, "GPipe" (arXiv:1811.06965); Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (arXiv:2104.04473),
§2.2; the lesson "Scaling and distributed training" (adapted in part from *AI Engineering
from Scratch*), "Pipeline bubble".

Public paths: :mod:`distcheck.pipeline`, :mod:`distcheck.forms.pipeline`, :mod:`distcheck.props.pipeline`.
"""
