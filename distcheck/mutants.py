"""Known-wrong implementations (mutants) and the properties that must kill them: the public path.

Each mutant is a small function with the same signature as the implementation slot of one
property (see :mod:`distcheck.props`), carrying one mistake that real code makes.
:func:`kill_mutants` runs each mutant's property with the mutant as ``impl`` and expects it
to FAIL on the property's own claim (a wrong value, bound or count), with a shrunk
counterexample. A mutant that survives means the property is too weak; a mutant that raises
is *broken* (a crash proves nothing about the property). Either way ``distcheck check``
FAILs the "mutants killed k/n" row and names it.

Where they live: each parallelism package registers its mutants in
``distcheck/parallel/<name>/mutants.py`` (that module's docstring is the table of its
mistakes and the property that kills each); the machinery is :mod:`distcheck.engine.mutants`.
This module finds every one (:data:`MUTANTS`), and serves each mutant's function under its
function name: ``from distcheck.mutants import row_parallel_bias_every_rank``.
"""

from __future__ import annotations

from distcheck.engine.mutants import Mutant, kill_mutant, kill_mutants, mutants, registry

__all__ = ["Mutant", "MUTANTS", "mutants", "kill_mutant", "kill_mutants"]

#: name -> Mutant, every registered mutant (the engine's registry itself)
MUTANTS = registry()


def __getattr__(name: str) -> object:
    """Every registered mutant's function by its function name, wherever its package defines it."""
    for m in MUTANTS.values():
        if m.function.__name__ == name:
            return m.function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
