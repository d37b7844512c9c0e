"""The property engine: what runs the parallelism packages' properties, mutants and proofs.

- :mod:`~distcheck.engine.discovery`: the parallelism packages under :mod:`distcheck.parallel`
  and their role modules, found by walking the package (no list of names anywhere);
- :mod:`~distcheck.engine.catalogue`: the closed-form catalogue (every package's ``forms``);
- :mod:`~distcheck.engine.registry`: :class:`~distcheck.engine.registry.Property`, the registry
  and the edge cases;
- :mod:`~distcheck.engine.runner`: ``run_property`` and ``run_suite`` (Hypothesis without pytest),
  seeds, failure rows;
- :mod:`~distcheck.engine.mutants`: known-wrong implementations and ``kill_mutants``;
- :mod:`~distcheck.engine.proofs`: sympy proofs between closed forms;
- :mod:`~distcheck.engine.run`: ``run_all``, the properties stage of ``distcheck check``;
- :mod:`~distcheck.engine.strategies`: the machinery the packages' Hypothesis strategies share;
- :mod:`~distcheck.engine.profiles`: Hypothesis settings profiles (dev, ci, thorough).

The engine imports only :mod:`distcheck.core`; it reaches the packages above it by name,
through discovery. Its public paths are :mod:`distcheck.props`, :mod:`distcheck.mutants`,
:mod:`distcheck.closed_form`, :mod:`distcheck.strategies` and :mod:`distcheck.engine.profiles`.
"""
