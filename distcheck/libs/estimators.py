"""The memory-estimator contract: fit a target's figures to a·P + b·P/N, name the convention, check it.

An :class:`Estimator` is a function from a configuration (parameters P, data-parallel
ranks N, options such as the largest layer) to bytes per GPU, for one ZeRO stage.
The contract:

1. **Fit** (check ``<name>.fit``). Evaluated exactly at P0 and 2 P0 (P0 =
   :data:`FIT_PARAMS`, divisible by every small N) and N = 1, 2, the figures give
   ``a`` (bytes per parameter replicated on every rank), ``b`` (bytes per
   parameter sharded over the N ranks) and a constant ``c`` (bytes that do not
   scale with P, e.g. DeepSpeed's largest-layer buffer). The convention is named
   from :data:`STATE_CONVENTIONS`: bytes of weights, gradients and optimizer state
   per parameter, split by the stage as the ZeRO paper does (Rajbhandari et al.
   2020, Figure 1: stage 1 shards the optimizer state, stage 2 also the gradients,
   stage 3 also the weights). When the target also gives its components, a
   convention must match them one by one, and a total that is the *maximum* of
   the components rather than their sum is named. No matching convention is FAIL.
2. **Integer truncation** (``<name>.truncation``): over Hypothesis-drawn (P, N,
   options), ``|f - (a P + b P/N + c)| < 1``: rounding to whole bytes costs less
   than a byte per rank, and the figures really are of the fitted form.
3. **Monotone in N** (``<name>.monotone_n``): more ranks never need more bytes.
4. Over the estimators of one library (:func:`check_family`): **one baseline**
   (``<family>.baseline_n1``): at N = 1 nothing is sharded, so every stage gives
   the same figure; **stage order** (``<family>.stage_order``): a higher stage
   never needs more bytes at the same (P, N).
5. **Printed units** (``<name>.printed_unit``, when the target prints its figure):
   a figure labelled GB is bytes / 1e9 (GB = 1e9, GiB = 2**30); one that is really
   bytes / 2**30 is named "GiB printed as GB".

Every check returns a :class:`distcheck.report.CheckResult` row: ``pass`` with the
convention named, or ``FAIL`` with the smallest counterexample Hypothesis found
(:func:`distcheck.libs.search.falsify`). Recorded upstream discrepancies turn
matching FAIL rows into findings (:mod:`distcheck.libs.findings`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Mapping, Sequence

from hypothesis import strategies as st

from distcheck.errors import ConfigError, check_nonnegative_int
from distcheck.libs.search import DEFAULT_EXAMPLES, falsify
from distcheck.report import FAIL, PASS, CheckResult
from distcheck.validate import check_callable, check_type

__all__ = [
    "StateConvention",
    "STATE_CONVENTIONS",
    "Fit",
    "Estimator",
    "FIT_PARAMS",
    "MAX_PARAMS",
    "MAX_RANKS_DRAWN",
    "fit",
    "conventions_for",
    "total_rule",
    "check_estimator",
    "check_family",
    "read_printed",
]

#: P0 of the exact fit: divisible by 2**12 and by every integer up to 16
FIT_PARAMS = 2**12 * 3**2 * 5 * 7 * 11 * 13
#: the largest parameter count drawn (10 trillion); larger counts overflow float arithmetic in some targets
MAX_PARAMS = 10**13
#: the most data-parallel ranks drawn
MAX_RANKS_DRAWN = 2**20


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
                    "DeepSpeed ZeRO-2 estimator comment: 2 grads 16-bit + 4 grads 32-bit + 4 params 32-bit + 8 moments"),
    StateConvention("fp32 weights with no separate master copy", 4, 4, 8, "fp32 training with Adam (no mixed precision)"),
)


@dataclass(frozen=True)
class Fit:
    """Bytes per GPU = ``replicated`` P + ``sharded`` P / N + ``constant`` (exact Fractions)."""

    replicated: Fraction
    sharded: Fraction
    constant: Fraction

    def predict(self, params: int, n: int) -> Fraction:
        return self.replicated * params + self.sharded * params / n + self.constant

    def describe(self) -> str:
        c = f" + {_num(self.constant)}" if self.constant else ""
        return f"{_num(self.replicated)}·P + {_num(self.sharded)}·P/N{c}"


def _num(q: Fraction) -> str:
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


Options = Mapping[str, object]


@dataclass(frozen=True)
class Estimator:
    """A target of the memory-estimator contract.

    Attributes:
        name: check prefix, e.g. ``"deepspeed.zero2"``.
        library: the distribution it comes from and its version, e.g. ``"deepspeed 0.19.8"``.
        stage: the ZeRO stage its figures are for (0: nothing sharded).
        bytes_per_gpu: ``(params, n, options) -> bytes`` (int, float or Fraction).
        options: ``params -> strategy`` of the options drawn with P (default: no options).
        fit_options: the options of the exact fit (must be valid at :data:`FIT_PARAMS`).
        components: optional ``(params, n, options) -> {component: bytes}``; the keys
            ``weights``, ``grads`` and ``optimizer`` are matched against conventions.
        printed: optional ``(params, n, options) -> text`` the target prints for its figure
            (a number followed by a unit, e.g. ``"18.63GB"``).
        depends_on_n: False for an estimator without data parallelism (accelerate's).
    """

    name: str
    library: str
    stage: int
    bytes_per_gpu: Callable[[int, int, Options], object]
    options: Callable[[int], st.SearchStrategy] | None = None
    fit_options: Options = field(default_factory=dict)
    components: Callable[[int, int, Options], Mapping[str, object]] | None = None
    printed: Callable[[int, int, Options], str] | None = None
    depends_on_n: bool = True

    def __post_init__(self) -> None:
        check_type("name", self.name, str, "must be a check name such as 'deepspeed.zero2'")
        check_nonnegative_int("stage", self.stage)
        if self.stage > 3:
            raise ConfigError("stage", self.stage, "must be 0, 1, 2 or 3")
        check_callable("bytes_per_gpu", self.bytes_per_gpu)

    def evaluate(self, params: int, n: int, options: Options) -> Fraction:
        """The target's figure as an exact Fraction (a float is taken at its exact value)."""
        value = self.bytes_per_gpu(params, n, options)
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
            raise ConfigError(f"{self.name} result", value, "must be a number of bytes")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{self.name} result", value, "must be finite")
        return Fraction(value)

    def draws(self) -> st.SearchStrategy:
        """(P, N, options) examples."""
        opts = self.options or (lambda p: st.just({}))
        n = st.integers(1, MAX_RANKS_DRAWN) if self.depends_on_n else st.just(1)
        return st.integers(1, MAX_PARAMS).flatmap(lambda p: st.tuples(st.just(p), n, opts(p)))


def fit(est: Estimator, options: Options | None = None) -> Fit:
    """The exact fit of ``est`` at P0 and 2 P0, N = 1 and 2 (see the module docstring)."""
    opts = est.fit_options if options is None else options
    p0 = FIT_PARAMS
    f1 = est.evaluate(p0, 1, opts)
    f2 = est.evaluate(p0, 2, opts) if est.depends_on_n else f1
    g1 = est.evaluate(2 * p0, 1, opts)
    constant = 2 * f1 - g1
    sharded = 2 * (f1 - f2) / p0
    replicated = (f1 - constant) / p0 - sharded
    return Fit(replicated, sharded, constant)


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


def _per_param(est: Estimator, options: Options) -> dict[str, Fraction] | None:
    if est.components is None:
        return None
    raw = est.components(FIT_PARAMS, 1, options)
    return {k: Fraction(v) / FIT_PARAMS for k, v in raw.items()}  # type: ignore[call-overload]


def _row(est_name: str, library: str, verdict: str, examples: int, detail: str, **extra) -> CheckResult:
    return CheckResult(check=f"libs.{est_name}", backend=library, verdict=verdict, world_size=1,
                       examples=examples, detail=detail, extra=dict(extra, contract="memory-estimator"))


def _fmt_opts(options: Options) -> str:
    return "".join(f", {k}={v}" for k, v in options.items())


def check_fit(est: Estimator) -> CheckResult:
    """The ``<name>.fit`` row: the fitted form and the convention it names (module docstring)."""
    f = fit(est)
    comps = _per_param(est, est.fit_options)
    convs = conventions_for(est.stage, f, comps)
    at = f" (at {_fmt_opts(est.fit_options)[2:]})" if est.fit_options else ""
    form = f"bytes per GPU = {f.describe()}{at}: {_num(f.replicated)} B/param replicated, {_num(f.sharded)} B/param " \
           f"sharded over N at ZeRO stage {est.stage}"
    rule_text = ""
    if comps:
        total = f.replicated + f.sharded
        listed = ", ".join(f"{k} {_num(v)}" for k, v in comps.items())
        rule = total_rule(total, comps)
        if rule == "max":
            resident = sum((comps[k] for k in ("weights", "grads", "optimizer") if k in comps), Fraction(0))
            rule_text = (f"; the total is the maximum of its components ({listed} B/param), not their sum "
                         f"({_num(sum(comps.values(), Fraction(0)))}); weights, gradients and optimizer state "
                         f"together are {_num(resident)} B/param")
        elif rule == "sum":
            rule_text = f"; the total is the sum of its components ({listed} B/param)"
        else:
            rule_text = f"; the total is neither the sum nor the maximum of its components ({listed} B/param)"
    if convs:  # with components, conventions_for matched them one by one
        names = "; ".join(c.describe() for c in convs)
        return _row(f"{est.name}.fit", est.library, PASS, 3, f"{form}; convention: {names}{rule_text}",
                    fit=[str(f.replicated), str(f.sharded), str(f.constant)], conventions=[c.short for c in convs])
    return _row(f"{est.name}.fit", est.library, FAIL, 3,
                f"{form}; no documented convention reproduces it{rule_text}",
                fit=[str(f.replicated), str(f.sharded), str(f.constant)], conventions=[])


def check_truncation(est: Estimator, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0) -> CheckResult:
    """The ``<name>.truncation`` row: ``|f - fit| < 1`` byte over drawn (P, N, options)."""
    base = fit(est)

    def one(ex):
        p, n, opts = ex
        f = fit(est, opts)
        if (f.replicated, f.sharded) != (base.replicated, base.sharded):
            return (f"P={p}, N={n}{_fmt_opts(opts)}: the fit changes with the options: {f.describe()} "
                    f"instead of {base.describe()}")
        got, want = est.evaluate(p, n, opts), f.predict(p, n)
        if abs(got - want) >= 1:
            return (f"P={p}, N={n}{_fmt_opts(opts)}: the estimator gives {_num(got)} bytes, {f.describe()} gives "
                    f"{_num(want)}: off by {float(got - want):+g} bytes (at least a byte per rank)")
        return None

    out = falsify(one, est.draws(), max_examples=max_examples, seed=seed)
    if out.failed:
        return _row(f"{est.name}.truncation", est.library, FAIL, out.examples, out.message or "")
    return _row(f"{est.name}.truncation", est.library, PASS, out.examples,
                f"every figure is {base.describe()} to within a byte (P <= {MAX_PARAMS:.0e}, N <= {MAX_RANKS_DRAWN})")


def check_monotone_n(est: Estimator, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0) -> CheckResult:
    """The ``<name>.monotone_n`` row: ``f(P, N) >= f(P, N')`` for N < N'."""
    draws = est.draws().flatmap(lambda t: st.tuples(st.just(t), st.integers(1, MAX_RANKS_DRAWN)))

    def one(ex):
        (p, n, opts), extra = ex
        n2 = n + extra
        a, b = est.evaluate(p, n, opts), est.evaluate(p, n2, opts)
        if b > a:
            return f"P={p}{_fmt_opts(opts)}: N={n} gives {_num(a)} bytes but N={n2} gives more, {_num(b)}"
        return None

    if not est.depends_on_n:
        return _row(f"{est.name}.monotone_n", est.library, PASS, 0, "the estimate does not depend on N")
    out = falsify(one, draws, max_examples=max_examples, seed=seed)
    verdict = FAIL if out.failed else PASS
    return _row(f"{est.name}.monotone_n", est.library, verdict, out.examples,
                out.message or "more data-parallel ranks never need more bytes per GPU")


_PRINTED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(bytes|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")
_DECIMAL = {"bytes": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
            "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_BINARY_READING = {"KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}


def read_printed(text: str) -> tuple[Fraction, Fraction, str]:
    """(figure, half of its last digit's step, unit) of a printed size like ``"18.63GB"``.
    Raises ConfigError for text that is not a number followed by a byte unit."""
    m = _PRINTED.match(text)
    if not m:
        raise ConfigError("printed", text, "must be a number followed by a byte unit, e.g. '18.63GB'")
    digits = m[1].split(".", 1)[1] if "." in m[1] else ""
    return Fraction(m[1]), Fraction(1, 2 * 10 ** len(digits)), m[2]


def check_printed_unit(est: Estimator, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0) -> CheckResult:
    """The ``<name>.printed_unit`` row: the printed figure is the bytes in the unit it names."""
    if est.printed is None:
        raise ConfigError("printed", None, f"{est.name} prints nothing to check")

    def one(ex):
        p, n, opts = ex
        text = est.printed(p, n, opts)  # type: ignore[misc]
        value = est.evaluate(p, n, opts)
        figure, half, unit = read_printed(text)
        # a printed figure rounded to the last digit (Python's format rounds the exact binary value)
        if abs(value / _DECIMAL[unit] - figure) <= half:
            return None
        binary = _BINARY_READING.get(unit)
        if binary is not None and abs(value / binary - figure) <= half:
            return (f"P={p}, N={n}{_fmt_opts(opts)}: {_num(value)} bytes printed as '{text.strip()}', which is "
                    f"bytes / 2**{binary.bit_length() - 1}: {_label(unit)} ({unit} = 1e{len(str(_DECIMAL[unit])) - 1} "
                    f"bytes gives {float(value / _DECIMAL[unit]):.2f} {unit})")
        return f"P={p}, N={n}{_fmt_opts(opts)}: {_num(value)} bytes printed as '{text.strip()}'"

    out = falsify(one, est.draws(), max_examples=max_examples, seed=seed)
    verdict = FAIL if out.failed else PASS
    return _row(f"{est.name}.printed_unit", est.library, verdict, out.examples,
                out.message or "every printed figure is the bytes in the unit it names")


def _label(unit: str) -> str:
    return {"KB": "KiB printed as KB", "MB": "MiB printed as MB", "GB": "GiB printed as GB",
            "TB": "TiB printed as TB"}[unit]


def check_estimator(est: Estimator, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0) -> list[CheckResult]:
    """Every single-estimator row: fit, truncation, monotone in N, and the printed unit when the
    target prints. An exception the target raises becomes a FAIL row naming it."""
    check_type("est", est, Estimator, "must be an Estimator")
    rows = []
    steps: list[tuple[str, Callable[[], CheckResult]]] = [
        ("fit", lambda: check_fit(est)),
        ("truncation", lambda: check_truncation(est, max_examples=max_examples, seed=seed)),
        ("monotone_n", lambda: check_monotone_n(est, max_examples=max_examples, seed=seed)),
    ]
    if est.printed is not None:
        steps.append(("printed_unit", lambda: check_printed_unit(est, max_examples=max_examples, seed=seed)))
    for what, step in steps:
        rows.append(_guard(f"{est.name}.{what}", est.library, step))
    return rows


def _guard(name: str, library: str, step: Callable[[], CheckResult]) -> CheckResult:
    try:
        return step()
    except Exception as exc:  # the target raised: that is a failure of the target, reported with its type
        first = (str(exc).splitlines() or [""])[0]
        return _row(name, library, FAIL, 0, f"raised {type(exc).__name__}: {first}")


def check_family(family: str, estimators: Sequence[Estimator], *, max_examples: int = DEFAULT_EXAMPLES,
                 seed: int = 0) -> list[CheckResult]:
    """Rows across the stages of one library: ``<family>.baseline_n1`` and ``<family>.stage_order``.

    The options are drawn from the highest stage's strategy and given to every estimator (the
    estimators of one family take the same options, or ignore them). ConfigError unless
    ``estimators`` are at least two Estimators of distinct stages.
    """
    ests = sorted(estimators, key=lambda e: e.stage)
    if len(ests) < 2 or len({e.stage for e in ests}) != len(ests):
        raise ConfigError("estimators", [e.name for e in ests], "must be two or more estimators of distinct stages")
    top = ests[-1]
    library = top.library
    names = ", ".join(f"{e.name} (stage {e.stage})" for e in ests)

    def baseline(ex):
        p, _, opts = ex
        values = [(e, e.evaluate(p, 1, opts)) for e in ests]
        if len({v for _, v in values}) > 1:
            fits = [fit(e, opts) for e in ests]
            shown = ", ".join(f"{e.name} {_num(v)} bytes (= {_num(f.replicated + f.sharded)}·P"
                              + (f" + {_num(f.constant)}" if f.constant else "") + ")"
                              for (e, v), f in zip(values, fits))
            return f"P={p}, N=1{_fmt_opts(opts)}: nothing is sharded, yet the stages differ: {shown}"
        return None

    def order(ex):
        p, n, opts = ex
        values = [(e, e.evaluate(p, n, opts)) for e in ests]
        for (lo, a), (hi, b) in zip(values, values[1:]):
            if b > a:
                return (f"P={p}, N={n}{_fmt_opts(opts)}: stage {hi.stage} ({hi.name}) needs {_num(b)} bytes, more "
                        f"than stage {lo.stage} ({lo.name}), {_num(a)}")
        return None

    rows = []
    for what, check, draws in (("baseline_n1", baseline, top.draws()), ("stage_order", order, top.draws())):
        def step(check=check, draws=draws, what=what):
            out = falsify(check, draws, max_examples=max_examples, seed=seed)
            ok = {"baseline_n1": f"at N = 1 every stage gives the same bytes ({names})",
                  "stage_order": f"a higher stage never needs more bytes ({names})"}[what]
            return _row(f"{family}.{what}", library, FAIL if out.failed else PASS, out.examples,
                        out.message if out.failed else ok)
        rows.append(_guard(f"{family}.{what}", library, step))
    return rows
