"""Explanations of a wrong figure by one missing or extra component.

A parameter count off by exactly one component is a common slip: the final norm left out,
a tied embedding counted twice, biases counted in a model without them. For a quantity
with component flags (``tied``, ``final_norm``, ``norm_weights``, ``norm_biases``,
``qkv_bias``, ``mlp_bias``, ``out_bias``: ``params.decoder_only``, ``params.layer``, ...),
:func:`one_component` flips each flag in turn; when the difference it makes is exactly
what separates the printed figure from the recomputed value (within the figure's
rounding), the explanation names that component and its size. The verdict does not
change: the figure still disagrees with the model as described; the explanation says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction

__all__ = ["COMPONENT_FLAGS", "one_component"]

#: flag input -> what the difference it makes is, when the figure counts it and the model does not (or the reverse)
COMPONENT_FLAGS = {
    "tied": "the output head's vocab_size x hidden_size weights (a tied embedding counted once, or twice)",
    "final_norm": "the final norm's weights",
    "norm_weights": "the norm weights",
    "norm_biases": "the norm biases",
    "qkv_bias": "the q, k, v biases",
    "mlp_bias": "the MLP biases",
    "out_bias": "the attention output biases",
}


def one_component(flags: tuple[str, ...], values: Mapping[str, Fraction], value: Fraction, claimed: Fraction,
                  step: Fraction, factor: Fraction, compute: Callable[[dict], Fraction]) -> str | None:
    """``"; the difference, N params, is exactly <component>"`` when flipping one flag of ``flags``
    reproduces ``claimed`` (in the claim's unit: values divided by ``factor``) within ``step / 2``;
    None otherwise. ``compute(values)`` recomputes the quantity (exact)."""
    found = []
    for flag in flags:
        if flag not in COMPONENT_FLAGS:
            continue
        flipped = dict(values)
        flipped[flag] = 1 - Fraction(values.get(flag, 0))
        try:
            other = Fraction(compute(flipped))
        except (ArithmeticError, ValueError, TypeError):  # ConfigError included (a ValueError): an inconsistent
            # flip (e.g. norm biases without norm weights) is not an explanation
            continue
        diff = other - value
        if diff != 0 and abs(other / factor - claimed) <= step / 2:
            found.append(f"{COMPONENT_FLAGS[flag]} ({'+' if diff > 0 else '-'}{int(abs(diff)):,} params, {flag} = "
                         f"{int(flipped[flag])})")
    if not found:
        return None
    return "; the difference is exactly " + " or ".join(found)
