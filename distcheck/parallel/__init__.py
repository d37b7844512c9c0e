"""One package per parallelism: ``distcheck/parallel/<name>/``.

Each package holds everything about one strategy in modules named by role (reference,
forms, strategies, properties, mutants, proofs, ...; :mod:`distcheck.engine.discovery`
lists them). Nothing lists the packages: the engine finds them by walking this package.
Packages import each other's ``reference`` modules only, and never what sits above them
(the world machinery, the audit, the command line).
"""
