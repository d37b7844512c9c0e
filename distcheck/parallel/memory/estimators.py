"""Memory estimators as certify targets: what an estimator is, the conventions it may follow, the exact fit.

An :class:`Estimator` is a function from a configuration (parameters P, data-parallel
ranks N, options such as the largest layer) to bytes per GPU, for one ZeRO stage. The
memory-estimator contract (:mod:`distcheck.parallel.memory.contracts`) fits its figures to
``a·P + b·P/N + c`` and names the convention that gives (a, b):

- :func:`fit`: exact evaluation at P0 and 2 P0 (P0 = :data:`FIT_PARAMS`, divisible by every
  small N) and N = 1 and 2 gives ``a`` (bytes per parameter replicated on every rank),
  ``b`` (bytes per parameter sharded over the N ranks) and a constant ``c`` (bytes that do
  not scale with P, e.g. DeepSpeed's largest-layer buffer);
- :data:`STATE_CONVENTIONS`: bytes of weights, gradients and optimizer state per parameter,
  split by the stage as the ZeRO paper does (Rajbhandari et al. 2020, "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models", Figure 1: stage 1 shards the
  optimizer state, stage 2 also the gradients, stage 3 also the weights);
  :func:`conventions_for` names those whose split is the fit's (and, when the estimator
  gives its components, whose components match them one by one); :func:`total_rule` says
  whether a total is the sum or the maximum of its components;
- :func:`read_printed` reads a printed figure (``"18.63GB"``) for the printed-unit check
  (GB = 1e9 bytes, GiB = 2**30 bytes).

Figures are exact: an int, a Fraction, or a float taken at its exact binary value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_callable, check_int, check_type

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "StateConvention",
    "STATE_CONVENTIONS",
    "Fit",
    "Estimator",
    "EstimatorFamily",
    "FIT_PARAMS",
    "MAX_PARAMS",
    "MAX_RANKS_DRAWN",
    "fit",
    "fit_from",
    "components_per_param",
    "named_conventions",
    "conventions_for",
    "total_rule",
    "describe_fit",
    "read_printed",
    "DECIMAL_UNITS",
    "BINARY_READING",
    "number",
]

#: P0 of the exact fit: divisible by 2**12 and by every integer up to 16
FIT_PARAMS = 2**12 * 3**2 * 5 * 7 * 11 * 13
#: the largest parameter count drawn (10 trillion); larger counts overflow float arithmetic in some targets
MAX_PARAMS = 10**13
#: the most data-parallel ranks drawn
MAX_RANKS_DRAWN = 2**20

Options = Mapping[str, object]


@dataclass(frozen=True)
class StateConvention:
    """Bytes per parameter of weights, gradients and optimizer state (K), and where the convention
    comes from. :meth:`split` gives (replicated, sharded) bytes per parameter at a ZeRO stage."""

    name: str
    weights: int
    grads: int
    optimizer: int
    source: str

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer

    def split(self, stage: int) -> tuple[int, int]:
        """(replicated, sharded) bytes per parameter at ``stage`` (ZeRO paper, Figure 1)."""
        sharded = (self.optimizer if stage >= 1 else 0) + (self.grads if stage >= 2 else 0) \
            + (self.weights if stage >= 3 else 0)
        return self.total - sharded, sharded

    @property
    def short(self) -> str:
        """The name up to its colon: ``"K = 16"``, ``"fp32 gradients on top of 16-bit ones"``."""
        return self.name.split(":", 1)[0]

    def describe(self) -> str:
        return f"{self.name} ({self.weights} + {self.grads} + {self.optimizer} = {self.total} B/param)"


#: the conventions an estimator's figures are named by (weights, gradients, optimizer state)
STATE_CONVENTIONS: tuple[StateConvention, ...] = (
    StateConvention("K = 12: 16-bit weights and gradients, fp32 master copy, Adam m and v", 2, 2, 12,
                    "ZeRO paper (Rajbhandari et al. 2020) section 3.1 and Figure 1"),
    StateConvention("K = 8: moments only, no fp32 master copy", 2, 2, 8,
                    "'Chapter 26: Distributed Training' memory table"),
    StateConvention("K = 6: fp32 master copy and 8-bit moments", 2, 2, 6, "bitsandbytes 8-bit Adam"),
    StateConvention("K = 14: 16-bit weights and gradients, 14 B/param of optimizer state", 2, 2, 14,
                    "ZeRO paper Figure 1 form with K = 14"),
    StateConvention("K = 16: 16-bit weights and gradients, 16 B/param of optimizer state", 2, 2, 16,
                    "ZeRO paper Figure 1 form with K = 16"),
    StateConvention("fp32 gradients instead of 16-bit ones", 2, 4, 12,
                    "Megatron-LM theoretical memory (18 B/param; 6 + 12/d with the distributed optimizer)"),
    StateConvention("fp32 gradients on top of 16-bit ones", 2, 6, 12,
                    "DeepSpeed ZeRO-2 estimator comment: "
                    "2 grads 16-bit + 4 grads 32-bit + 4 params 32-bit + 8 moments"),
    StateConvention("fp32 weights with no separate master copy", 4, 4, 8,
                    "fp32 training with Adam (no mixed precision)"),
)


def number(q: Fraction) -> str:
    """An exact number as the contract prints it: ``18``, ``29/3``."""
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


@dataclass(frozen=True)
class Fit:
    """Bytes per GPU = ``replicated`` P + ``sharded`` P / N + ``constant`` (exact Fractions)."""

    replicated: Fraction
    sharded: Fraction
    constant: Fraction

    def predict(self, params: int, n: int) -> Fraction:
        return self.replicated * params + self.sharded * params / n + self.constant

    def describe(self) -> str:
        c = f" + {number(self.constant)}" if self.constant else ""
        return f"{number(self.replicated)}·P + {number(self.sharded)}·P/N{c}"


@dataclass(frozen=True)
class Estimator:
    """A target of the memory-estimator contract (``distcheck certify MODULE:ESTIMATOR --contract
    memory-estimator``).

    Attributes:
        name: the estimator's name in reports, e.g. ``"deepspeed.zero2"``.
        distribution: the PyPI distribution it comes from (its version goes into the certificate),
            or None for an estimator of the current checkout.
        stage: the ZeRO stage its figures are for (0: nothing sharded).
        bytes_per_gpu: ``(params, n, options) -> bytes`` (int, float or Fraction).
        options: ``params -> strategy`` of the options drawn with P (default: no options).
        fit_options: the options of the exact fit (must be valid at :data:`FIT_PARAMS`).
        components: optional ``(params, n, options) -> {component: bytes}``; the keys
            ``weights``, ``grads`` and ``optimizer`` are matched against conventions.
        printed: optional ``(params, n, options) -> text`` the target prints for its figure
            (a number followed by a unit, e.g. ``"18.63GB"``).
        depends_on_n: False for an estimator without data parallelism (accelerate's).

    Raises ConfigError for a name that is not a str, a stage outside 0..3 or a figure function
    that is not callable.
    """

    name: str
    distribution: str | None
    stage: int
    bytes_per_gpu: Callable[[int, int, Options], object]
    options: Callable[[int], SearchStrategy[Options]] | None = None
    fit_options: Options = field(default_factory=dict)
    components: Callable[[int, int, Options], Mapping[str, object]] | None = None
    printed: Callable[[int, int, Options], str] | None = None
    depends_on_n: bool = True

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a name such as 'deepspeed.zero2'")
        check_int("stage", self.stage, min_value=0, max_value=3)
        check_callable("bytes_per_gpu", self.bytes_per_gpu)

    def evaluate(self, params: int, n: int, options: Options) -> Fraction:
        """The target's figure as an exact Fraction (a float is taken at its exact value).
        Raises ConfigError when the target returns something that is not a finite number."""
        value = self.bytes_per_gpu(params, n, options)
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
            raise ConfigError(f"{self.name} result", value, "must be a number of bytes")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self.name} result", value, "must be finite")
        return Fraction(value)

    def draws(self) -> SearchStrategy[tuple[int, int, dict]]:
        """The strategy of (P, N, options) examples: P in [1, :data:`MAX_PARAMS`], N in
        [1, :data:`MAX_RANKS_DRAWN`] (1 when the estimate does not depend on N)."""
        from hypothesis import strategies as st

        opts = self.options or (lambda p: st.just({}))
        n = st.integers(1, MAX_RANKS_DRAWN) if self.depends_on_n else st.just(1)
        return st.integers(1, MAX_PARAMS).flatmap(lambda p: st.tuples(st.just(p), n, opts(p)))


@dataclass(frozen=True)
class EstimatorFamily:
    """The estimators of one library across ZeRO stages (``--contract memory-estimator-stages``).

    Raises ConfigError unless ``estimators`` are two or more Estimators of distinct stages.
    """

    name: str
    estimators: tuple[Estimator, ...]

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a name such as 'deepspeed.zero'")
        check_type("estimators", self.estimators, tuple, "must be a tuple of Estimators")
        for e in self.estimators:
            check_type("estimators", e, Estimator, "must hold Estimators only")
        if len(self.estimators) < 2 or len({e.stage for e in self.estimators}) != len(self.estimators):
            raise ConfigError("estimators", [e.name for e in self.estimators],
                              "must be two or more estimators of distinct stages")

    @property
    def by_stage(self) -> tuple[Estimator, ...]:
        return tuple(sorted(self.estimators, key=lambda e: e.stage))

    @property
    def distribution(self) -> str | None:
        return self.by_stage[-1].distribution


def fit_from(f1: Fraction, f2: Fraction, g1: Fraction) -> Fit:
    """The fit from the figures at (P0, 1), (P0, 2) and (2 P0, 1) (see the module docstring)."""
    constant = 2 * f1 - g1
    sharded = 2 * (f1 - f2) / FIT_PARAMS
    replicated = (f1 - constant) / FIT_PARAMS - sharded
    return Fit(replicated, sharded, constant)


def fit(est: Estimator, options: Options | None = None) -> Fit:
    """The exact fit of ``est`` at ``options`` (default: its ``fit_options``)."""
    opts = est.fit_options if options is None else options
    f1 = est.evaluate(FIT_PARAMS, 1, opts)
    f2 = est.evaluate(FIT_PARAMS, 2, opts) if est.depends_on_n else f1
    return fit_from(f1, f2, est.evaluate(2 * FIT_PARAMS, 1, opts))


def components_per_param(est: Estimator, options: Options) -> dict[str, Fraction] | None:
    """``est``'s components at (P0, N = 1, ``options``) in bytes per parameter; None when it gives none."""
    if est.components is None:
        return None
    return {k: Fraction(v) / FIT_PARAMS for k, v in est.components(FIT_PARAMS, 1, options).items()}  # type: ignore[call-overload]


def named_conventions(est: Estimator) -> list[StateConvention]:
    """The conventions that reproduce ``est``'s fit at its ``fit_options`` (see :func:`describe_fit`)."""
    return conventions_for(est.stage, fit(est), components_per_param(est, est.fit_options))


def conventions_for(stage: int, f: Fit, components: Mapping[str, Fraction] | None = None) -> list[StateConvention]:
    """The conventions whose (replicated, sharded) split at ``stage`` is the fit's; when
    ``components`` (bytes per parameter) name weights, grads and optimizer, those must match too."""
    out = []
    for conv in STATE_CONVENTIONS:
        if (Fraction(conv.split(stage)[0]), Fraction(conv.split(stage)[1])) != (f.replicated, f.sharded):
            continue
        if components and all(k in components for k in ("weights", "grads", "optimizer")):
            if (components["weights"], components["grads"], components["optimizer"]) != \
                    (conv.weights, conv.grads, conv.optimizer):
                continue
        out.append(conv)
    return out


def total_rule(total: Fraction, components: Mapping[str, Fraction]) -> str | None:
    """``"sum"`` when ``total`` is the sum of ``components``, ``"max"`` when it is their maximum
    (and not their sum), None otherwise."""
    values = list(components.values())
    if not values:
        return None
    if total == sum(values, Fraction(0)):
        return "sum"
    if total == max(values):
        return "max"
    return None


def describe_fit(stage: int, f: Fit, components: Mapping[str, Fraction] | None,
                 options: Options) -> tuple[str, list[StateConvention]]:
    """(text, conventions) of a fit: the fitted form, the bytes per parameter replicated and sharded, the
    conventions that reproduce it (or "no documented convention reproduces it") and, with components
    (bytes per parameter), whether the total is their sum or their maximum."""
    convs = conventions_for(stage, f, components)
    at = f" (at {', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""
    text = (f"bytes per GPU = {f.describe()}{at}: {number(f.replicated)} B/param replicated, {number(f.sharded)} "
            f"B/param sharded over N at ZeRO stage {stage}")
    text += f"; convention: {'; '.join(c.describe() for c in convs)}" if convs \
        else "; no documented convention reproduces it"
    if components:
        listed = ", ".join(f"{k} {number(v)}" for k, v in components.items())
        rule = total_rule(f.replicated + f.sharded, components)
        if rule == "max":
            resident = sum((components[k] for k in ("weights", "grads", "optimizer") if k in components), Fraction(0))
            text += (f"; the total is the maximum of its components ({listed} B/param), not their sum "
                     f"({number(sum(components.values(), Fraction(0)))}); weights, gradients and optimizer state "
                     f"together are {number(resident)} B/param")
        elif rule == "sum":
            text += f"; the total is the sum of its components ({listed} B/param)"
        else:
            text += f"; the total is neither the sum nor the maximum of its components ({listed} B/param)"
    return text, convs


_PRINTED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(bytes|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")
#: a printed unit -> bytes in one of it (GB = 1e9, GiB = 2**30: distcheck.core.units)
DECIMAL_UNITS = {"bytes": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                 "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
#: a decimal unit -> the binary size it is mistaken for, and the name of the mistake
BINARY_READING = {"KB": (2**10, "KiB printed as KB"), "MB": (2**20, "MiB printed as MB"),
                  "GB": (2**30, "GiB printed as GB"), "TB": (2**40, "TiB printed as TB")}


def read_printed(text: str) -> tuple[Fraction, Fraction, str]:
    """(figure, half of its last digit's step, unit) of a printed size like ``"18.63GB"``.
    Raises ConfigError for text that is not a number followed by a byte unit."""
    m = _PRINTED.match(text) if isinstance(text, str) else None
    if not m:
        raise ConfigError("printed", text, "must be a number followed by a byte unit, e.g. '18.63GB'")
    digits = m[1].split(".", 1)[1] if "." in m[1] else ""
    return Fraction(m[1]), Fraction(1, 2 * 10 ** len(digits)), m[2]
