"""A quantity's own constraints: conditions on its inputs outside which its formula does not apply.

A :class:`Constraint` is declared data: the text a verdict names, where the condition comes from,
the inputs it reads and an exact test on their values. A quantity declares its constraints in
``Quantity.requires`` (:class:`distcheck.audit.quantity.Quantity`); the closed forms of the catalogue,
whose own ``constraints`` are descriptive text, get theirs from :data:`DECLARED` by name pattern.

A claim whose inputs (defaults filled) break a constraint of its quantity is ``not-checkable``,
with the constraint named: the formula describes no schedule, layout or model with those inputs,
so no figure can be judged against it (``pp.bubble_fraction.interleaved`` at m = 6, p = 4:
Megatron-LM's interleaved schedule refuses a number of micro-batches that the pipeline size does
not divide). An alternative reading (:mod:`distcheck.audit.conventions`) whose quantity's
constraints fail reproduces no figure.

Sources: Narayanan et al. 2021 (SC'21), "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", §2.2.2, and Megatron-LM's interleaved schedule
(``forward_backward_pipelining_with_interleaving``), which refuses m not divisible by p; Qi et al.
2023, "Zero Bubble Pipeline Parallelism" (the interleaved zero-bubble forms' regime, as
``distcheck.parallel.pp.forms_zero_bubble`` states it); Dubey et al. 2024, "The Llama 3 Herd of
Models", §3.3.2 (one layer removed from the first and the last stage).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from distcheck.core.validate import check_type

__all__ = ["Constraint", "DECLARED", "declared_for", "broken"]


@dataclass(frozen=True)
class Constraint:
    """One condition on a quantity's inputs.

    ``text`` is what a verdict names (``"m % p == 0"``), ``source`` where it comes from, ``inputs``
    the names ``test`` reads; ``test(values)`` takes the exact input values (Fractions, defaults
    filled) and returns True when the condition holds.
    """

    text: str
    source: str
    inputs: tuple[str, ...]
    test: Callable[[Mapping[str, Fraction]], bool]

    def as_dict(self) -> dict[str, object]:
        return {"constraint": self.text, "source": self.source, "inputs": list(self.inputs)}


_MEGATRON_INT = ("Megatron-LM's interleaved schedule requires it (it refuses a number of micro-batches the "
                 "pipeline-parallel size does not divide); Narayanan et al. 2021 §2.2.2")
INTERLEAVED_M_DIVISIBLE_BY_P = Constraint(
    "m % p == 0 (the interleaved schedule needs m divisible by p)", _MEGATRON_INT, ("m", "p"),
    lambda v: Fraction(v["m"]) % Fraction(v["p"]) == 0)
INTERLEAVED_V_AT_LEAST_2 = Constraint(
    "v >= 2 (an interleaved schedule places at least two model chunks on each rank)", _MEGATRON_INT, ("v",),
    lambda v: v["v"] >= 2)
_QI = "Qi et al. 2023, 'Zero Bubble Pipeline Parallelism' (the regime of distcheck's interleaved zero-bubble forms)"
ZB_M_AT_LEAST_P = Constraint("m >= p", _QI, ("m", "p"), lambda v: v["m"] >= v["p"])
ZB_INTERLEAVED_ROUNDS = Constraint(
    "m % max(1, m // p) == 0", _QI, ("m", "p"),
    lambda v: Fraction(v["m"]) % max(1, int(Fraction(v["m"]) // Fraction(v["p"]))) == 0)
TRIM_ENDS_DIVISIBLE = Constraint(
    "p divides num_layers + 2 trimmed (every middle stage holds the same number of layers)",
    "Dubey et al. 2024 (Llama 3) §3.3.2: one layer removed from the first and the last stage", (
        "num_layers", "p", "trimmed"),
    lambda v: (Fraction(v["num_layers"]) + 2 * Fraction(v["trimmed"])) % Fraction(v["p"]) == 0)

#: (closed-form name pattern, its constraints): the executable constraints of catalogue quantities
DECLARED: tuple[tuple[str, tuple[Constraint, ...]], ...] = (
    ("pp.*.interleaved", (INTERLEAVED_V_AT_LEAST_2, INTERLEAVED_M_DIVISIBLE_BY_P)),
    ("pp.*.interleaved_zb", (ZB_M_AT_LEAST_P, ZB_INTERLEAVED_ROUNDS)),
)


def declared_for(name: str, input_names: tuple[str, ...]) -> tuple[Constraint, ...]:
    """The constraints :data:`DECLARED` gives the quantity ``name`` (those whose inputs it has).
    Raises ConfigError when ``name`` is not a str."""
    check_type("name", name, str, "must be a quantity name (a str)")
    out: list[Constraint] = []
    for pattern, constraints in DECLARED:
        if fnmatch.fnmatchcase(name, pattern):
            out.extend(c for c in constraints if set(c.inputs) <= set(input_names) and c not in out)
    return tuple(out)


def broken(constraints: tuple[Constraint, ...], values: Mapping[str, Fraction]) -> list[Constraint]:
    """The constraints among ``constraints`` that ``values`` (defaults filled) break; a constraint
    whose inputs are not all given is not tested (the claim is then not-checkable for the missing input)."""
    check_type("values", values, Mapping, "must map input names to exact values")
    return [c for c in constraints if all(n in values for n in c.inputs) and not c.test(values)]
