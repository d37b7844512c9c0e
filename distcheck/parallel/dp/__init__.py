"""Data parallelism and gradient accumulation: shard gradients combined by an all-reduce, and
micro-batch gradients combined over steps.

- ``reference``: shards of a batch, least-squares and MLP gradients, the plain and the
  example-weighted all-reduce, the plain mean's bias and its float bound; ``accumulation``:
  token-level losses and gradient accumulation under each normalisation;
- ``forms``: the weight an example gets (1/(N n_k) under a plain mean, 1/n exactly), shard
  sizes, the plain mean's error coefficient, the accumulation weights;
- ``strategies``: shard counts and sizes, batches split into shards, sequences split into
  micro-batches two ways;
- ``properties``: equal shards bitwise, unequal shards weighted, the plain mean's bias, any
  shards within the derived bound; accumulation independent of the split;
- ``mutants``: a plain mean over unequal shards; a mean of per-micro-batch means.

Sources: the lesson "Scaling and distributed training" (adapted in part from *AI
Engineering from Scratch*), §3 ("Data parallelism is exact", the unequal-shards challenge);
Higham 2002, *Accuracy and Stability of Numerical Algorithms*, §3.1 (the bounds).

Public API: this package, ``distcheck.parallel.dp``: the names of ``__all__``, served on first
access from its internal modules (``reference``, ``accumulation``). Every module inside the package
is internal; its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "UNIT_ROUNDOFF", "gamma", "shard_sizes", "split_batch", "mse_loss", "mse_grad", "mse_grad_sum",
    "MLP_PARAM_NAMES", "mlp_init", "mlp_loss_and_grad", "mlp_grad", "mlp_grad_sum", "shard_grads", "plain_mean",
    "weighted_mean", "data_parallel_grad", "plain_mean_bias", "mse_dp_error_bound", "token_mse_loss",
    "token_mse_grad", "token_mse_grad_sum", "AccumulationResult", "accumulate_grads",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "accumulation"))
