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

Public paths: :mod:`distcheck.dp`, :mod:`distcheck.forms.dp`, :mod:`distcheck.props.dp`,
:mod:`distcheck.props.accumulation`.
"""
