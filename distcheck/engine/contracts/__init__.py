"""The contract machinery: what a contract is, how its cases are compared across ranks, and the
rank-side harness for sharded torch layers. The contracts themselves live with their
parallelism (``distcheck/parallel/<name>/contracts.py``); the engine that runs them (Hypothesis
in the parent, every example on every rank of a world), the certificate and the command line
are :mod:`distcheck.certify`, whose public names (``Contract``, ``contracts()``, ``get_contract``,
``register_contract``, ...) these modules provide.

- :mod:`~distcheck.engine.contracts.contract`: the :class:`Contract` base class, ``PropertySpec``,
  ``Option``, ``Outcome``; the registry, filled by discovery;
- :mod:`~distcheck.engine.contracts.checks`: cross-rank comparisons (every rank against the
  reference, bitwise or within a bound; replicated results against each other; collectives);
- :mod:`~distcheck.engine.contracts.bounds`: running error bounds for the bounded regime;
- :mod:`~distcheck.engine.contracts.layer`: the rank-side harness of a sharded torch layer;
- :mod:`~distcheck.engine.contracts.sharded`: ``ShardedLayerContract``, the base of the
  contracts whose target is a torch layer with sharded parameters;
- :mod:`~distcheck.engine.contracts.targets`: ``module:object`` targets, found again on every rank;
- :mod:`~distcheck.engine.contracts.errors`: ``ProtocolError``, ``TargetError``, ``CertificationFailed``.

Importing this package imports nothing; torch is imported inside functions only.
"""
