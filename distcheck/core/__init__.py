"""The core every other part of distcheck stands on; it imports nothing above it.

- :mod:`~distcheck.core.errors`: the one exception hierarchy (ConfigError names the field,
  its value and the rule);
- :mod:`~distcheck.core.validate`: the one set of input checks that raise those errors;
- :mod:`~distcheck.core.vocab`: the names of the field written once, as ``StrEnum``s
  (schedules, collectives, mesh axes, verdicts);
- :mod:`~distcheck.core.units`: byte units (GB = 1e9, GiB = 2**30);
- :mod:`~distcheck.core.exactness`: when results must be bit-identical, and the bound otherwise;
- :mod:`~distcheck.core.closed_form`: a named sympy formula with its source, and the registry
  the parallelism packages' ``forms`` modules add to;
- :mod:`~distcheck.core.results`: the result row every check returns, and its verdict;
- :mod:`~distcheck.core.atomic`: write a file whole or not at all.

Importing this package imports nothing, and ``import distcheck`` imports none of it.
"""
