"""The contract protocol, and the registry that finds contracts by discovery.

A *contract* says what an implementation of one piece of distributed training
must do, in five parts (see docs/CERTIFY.md):

1. **cases** (:meth:`Contract.cases`): a Hypothesis strategy of examples sized
   to the live world (tp = world size, widths divisible by it where the layer
   needs that, magnitudes that keep sums exact in the dtype);
2. **the rank function** (:meth:`Contract.run_rank`): what every rank does with
   the user's object on one example; it returns plain Python/numpy results
   (outputs, gradients, the collectives it saw);
3. **the check** (:meth:`Contract.check`): the parent compares every rank's
   results with the reference and with each other, one :class:`Outcome` per
   property;
4. **the properties** (:attr:`Contract.properties`): each with its statement
   and exactness regime (``bitwise`` when the inputs make the result exact,
   else ``bounded`` by a derived bound);
5. **the protocol** (:meth:`Contract.resolve`): which objects the contract
   accepts (a module class, a torch parallel style, a factory ...) and how a
   rank builds one; a mismatch is a :class:`~distcheck.engine.contracts.errors.ProtocolError`.

Contracts are plain classes and live with the parallelism they certify: the
``contracts`` role module of a package (``distcheck/parallel/<name>/contracts.py``)
that defines a subclass with a ``name`` registers it, found by walking
:mod:`distcheck.parallel` (:mod:`distcheck.engine.discovery`; no list to edit).
:func:`register_contract` adds one defined elsewhere (a user's, a benchmark's, a test's).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hypothesis.strategies import SearchStrategy

from distcheck.core.errors import ConfigError, UnknownQuantityError
from distcheck.core.validate import check_int
from distcheck.engine.world import RankContext, World

__all__ = [
    "DTYPES",
    "EXACT",
    "ContractRun",
    "PropertySpec",
    "Option",
    "Outcome",
    "Contract",
    "contracts",
    "get_contract",
    "register_contract",
    "check_min_world",
    "parse_option_value",
    "check_dtypes",
]

#: floating-point formats a contract may be certified in (bfloat16 has no numpy dtype: named by string)
DTYPES = ("float64", "float32", "bfloat16")
#: the "dtype" of a contract with no floating point at all (integer and Fraction arithmetic: a memory
#: estimator's bytes, a layout's ranks): a contract declares it in its ``dtypes`` and runs in it alone
EXACT = "exact"


@dataclass(frozen=True)
class PropertySpec:
    """One property of a contract.

    Attributes:
        name: short name, unique within the contract (``"forward"``, ``"collectives.backward"``).
        statement: what must hold, one sentence.
        regime: ``"bitwise"`` (exact inputs make the result exact: equality bit for bit),
            ``"bounded"`` (a derived error bound, stated in the contract's docstring) or
            ``"exact"`` (integer counts, no floating point).
    """

    name: str
    statement: str
    regime: str


@dataclass(frozen=True)
class Option:
    """A contract option (``--option NAME=VALUE`` on the command line, ``options = {...}`` in TOML).

    Attributes: ``name``; ``default``; ``kind`` (``bool``, ``int``, ``str`` or ``dict``); ``doc``;
    ``choices`` (allowed values, or None for any value of the kind); for an ``int`` option its range,
    ``min_value`` .. ``max_value`` (both ends inclusive), which every ``int`` option declares (a value
    outside it is bad input: a ConfigError naming the option, before anything runs).
    """

    name: str
    default: Any
    kind: type
    doc: str
    choices: tuple | None = None
    min_value: int | None = None
    max_value: int | None = None


@dataclass(frozen=True)
class ContractRun:
    """One certification that ``distcheck check`` runs on each world of a world stage: a
    package's ``checks`` module lists them in ``CERTIFY``, with torch's own implementation (or
    distcheck's fix) as the target, and the stage runs them through the certify engine.

    Attributes:
        name: the prefix of its rows (``"ddp.unequal_shards.hook"``): one row per property,
            ``<name>.<property>``, and ``[<dtype>]`` appended when it runs in several dtypes.
        contract: the contract's name.
        target: ``module:object`` (imported in the parent, found again on every rank).
        options: the contract's options.
        dtypes: the formats (None: the contract's own).
        doc: one line on what the run shows, for the docs and the table's detail.
        max_examples: at most this many examples per property (None: the profile's count), for a run
            whose every example is a costly step (a whole training step of every rank, a distributed
            attention) that the profile's count would make dominate the stage.

    A world too small for the contract's claims to fail (:meth:`Contract.cannot_fail`) gives one
    ``skip`` row per property with the contract's reason, as under ``distcheck certify``.
    """

    name: str
    contract: str
    target: str
    options: dict = field(default_factory=dict)
    dtypes: tuple[str, ...] | None = None
    doc: str = ""
    max_examples: int | None = None


@dataclass
class Outcome:
    """The verdict of one property on one example.

    Attributes:
        ok: the property held on every rank.
        max_error: the largest error seen (None where not numeric).
        bound: the bound it was held to (0 for bitwise).
        message: on failure, the full reason: which ranks, expected, got, max error and bound.
        ranks: the ranks at fault (empty when it held).
        note: when it held, what the pass found that the statement does not say (the convention a
            memory estimator follows, for instance); the same on every example, kept in the verdict.
    """

    ok: bool
    max_error: float | None = None
    bound: float | None = None
    message: str = ""
    ranks: tuple[int, ...] = ()
    note: str = ""


class Contract:
    """Base class of every contract. Subclasses set the class attributes and override the methods.

    Class attributes:
        name: the contract's name on the command line (``"column-parallel-linear"``).
        parallelism: the parallelism it belongs to (``"tp"``): the package it lives in.
        summary: one line.
        properties: its :class:`PropertySpec` tuple, in the order they are checked.
        options: its :class:`Option` tuple.
        dtypes: the formats it is certified in by default.
        needs_world: False for a contract whose rank function needs no process group
            (a memory estimator, a rank-layout function): the engine then runs it in the
            calling process, once per example.
        min_world_size, min_world_reason: the smallest world on which its claims can fail, and
            why a smaller one cannot fail them (tp = 1 shards nothing: a missing all-reduce is
            the identity there). Every contract declares both (:func:`register_contract` refuses
            one that does not); below it, every property is recorded ``skip`` with the reason
            (:meth:`cannot_fail`), never run.
        max_world_sizes, max_world_reason: profile name -> the largest world whose examples that profile
            runs, for a contract whose every example is costly (a whole training step of every rank), and
            why; a larger world is recorded ``skip`` with the reason (:meth:`beyond_profile`). Default: no
            limit (a profile not named has none either).
        preload: modules the ranks of the companion worlds it opens import before forking
            (:meth:`companion_worlds`; a :class:`~distcheck.runners.pool.RankPool`'s ``preload``).

    A contract whose example runs on more than one world (a checkpoint saved on N ranks and loaded on
    M) names the other world sizes with :meth:`companion_worlds` and runs an example with
    :meth:`run_case`; the engine opens one pool per companion size beside the certified world.
    """

    name: ClassVar[str] = ""
    parallelism: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    properties: ClassVar[tuple[PropertySpec, ...]] = ()
    options: ClassVar[tuple[Option, ...]] = ()
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    needs_world: ClassVar[bool] = True
    min_world_size: ClassVar[int | None] = None
    min_world_reason: ClassVar[str] = ""
    max_world_sizes: ClassVar[dict[str, int]] = {}
    max_world_reason: ClassVar[str] = ""
    preload: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ parent side

    def companion_worlds(self, world_size: int, options: dict) -> tuple[int, ...]:
        """The world sizes, besides ``world_size``, that an example certified at ``world_size`` under ``options``
        may also run on (default none: every example runs on the certified world alone). The engine opens a
        pool of each (the certified world's backend and timeout), or takes one the caller gives, and runs such
        a contract's examples with :meth:`run_case`."""
        return ()

    def one_world_options(self, options: dict) -> dict | None:
        """``options`` changed so that no example needs :meth:`companion_worlds` (every one on the certified world
        alone), for a world that cannot open others beside it (one launched by torchrun); None when the contract
        has no such options (default)."""
        return None

    def run_case(self, world_of: Callable[[int], World], target: Any, case: Any, dtype: str, options: dict,
                 timeout_s: float | None = None) -> list:
        """Parent side of one example of a contract with :meth:`companion_worlds`: run its rank functions on
        the worlds it needs (``world_of(n)``: the world of ``n`` ranks, the certified one or a companion; each
        ``run`` under ``timeout_s``, None for the world's own) and return the results :meth:`check` reads.
        What a world's ``run`` raises (a :class:`~distcheck.core.errors.DistributedError`) propagates: the engine
        reports it as it reports a rank's failure. Default: :meth:`run_rank` on the certified world."""
        raise NotImplementedError

    def cannot_fail(self, world_size: int, options: dict) -> str | None:
        """Why no claim of this contract can fail on a world of ``world_size`` ranks under ``options``
        (a degenerate layout: the world below :attr:`min_world_size`, or an axis the options pin at 1),
        or None when they can. The engine records every property ``skip`` with this reason.
        A contract with more axes than the world's overrides it, adding its own rules."""
        if self.min_world_size is not None and world_size < self.min_world_size:
            return (f"world size {world_size} is below {self.min_world_size}, the smallest on which the claims of "
                    f"{self.name} can fail: {self.min_world_reason}")
        return None

    def beyond_profile(self, world_size: int, profile: str) -> str | None:
        """Why profile ``profile`` runs no example on a world of ``world_size`` ranks (above its entry of
        :attr:`max_world_sizes`), or None when it does. The engine records every property ``skip`` with it."""
        limit = self.max_world_sizes.get(profile)
        if limit is None or world_size <= limit:
            return None
        allowed = ", ".join(f"{n} under {p}" for p, n in sorted(self.max_world_sizes.items(), key=lambda x: x[1]))
        why = f": {self.max_world_reason}" if self.max_world_reason else ""
        return (f"world size {world_size} is above {limit}, the largest that profile {profile} runs for {self.name} "
                f"(at most {allowed}){why}")

    def resolve(self, obj: Any, ref: str | None, options: dict) -> Any:
        """Check ``obj`` against the protocol; return ``(target, options)``: what every rank needs to
        build it (picklable; usually a :class:`~distcheck.engine.contracts.targets.Target`, whose ``ref`` names it
        in reports) and the effective options (a torch parallel style, for instance, says itself whether
        it gathers its output). ``ref`` is ``module:object`` when known, else None.

        Raises :class:`~distcheck.engine.contracts.errors.ProtocolError` when ``obj`` does not fit.
        """
        raise NotImplementedError

    def cases(self, world_size: int, dtype: str, options: dict) -> SearchStrategy[Any] | None:
        """A Hypothesis strategy of examples for a world of ``world_size`` ranks in ``dtype``.

        Returns None when no example can be exact (or bounded) in ``dtype`` at this world
        size; the engine then records ``skip`` with :meth:`skip_reason`.
        """
        raise NotImplementedError

    def cases_for(self, target: Any, world_size: int, dtype: str, options: dict) -> SearchStrategy[Any] | None:
        """The case strategy for ``target`` (the resolved target): :meth:`cases` unless the cases depend on
        the target (a memory estimator draws its own options, such as its largest layer)."""
        return self.cases(world_size, dtype, options)

    def skip_reason(self, world_size: int, dtype: str, options: dict) -> str:
        """Why :meth:`cases` returned None."""
        return f"no example of {self.name} fits {dtype} at world size {world_size}"

    def check(self, case: Any, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        """Compare every rank's results with the reference: one :class:`Outcome` per property name."""
        raise NotImplementedError

    def statement(self, prop: str, dtype: str, options: dict) -> str:
        """The property's statement for ``dtype`` (may name the bound's derivation)."""
        return self.spec(prop).statement

    def composition(self, case: Any) -> dict[str, str] | None:
        """The composition ``case`` belongs to, as named columns (``{"layout": "dp_shard=2, tp=2",
        "clip": "binds"}``), for the "Compositions drawn" table of the certificate and the report
        (:mod:`distcheck.certify.compositions`: each property's verdict per composition). Default None:
        the contract's examples have no compositions to list."""
        return None

    def skipped(self, target: Any, options: dict) -> dict[str, str]:
        """Properties that do not apply to ``target`` (the resolved target), each with the reason: they
        are recorded ``skip`` and never run (an estimator that prints no figure has no printed unit to
        check). Default: none."""
        return {}

    def explains(self) -> bool:
        """Whether the contract explains a failure (it overrides :meth:`explain_rank`): the engine then replays
        each failing property's final (shrunk) case once more through :meth:`explain_rank` and
        :meth:`explain`. A case that passes is never replayed."""
        return type(self).explain_rank is not Contract.explain_rank

    def explain(self, case: Any, results: list, world_size: int, dtype: str, options: dict) -> str | None:
        """The explanation of a failure from every rank's :meth:`explain_rank` results on its final case (the
        training step's first diverging tensor), joined to the failure's detail and the certificate; None for
        none. Default: None."""
        return None

    # ------------------------------------------------------------------ rank side

    def run_rank(self, ctx: RankContext, target: Any, case: Any, dtype: str, options: dict) -> Any:
        """Run the target on this rank for one example; return picklable results."""
        raise NotImplementedError

    def explain_rank(self, ctx: RankContext, target: Any, case: Any, dtype: str, options: dict) -> Any:
        """Run the target on this rank for the replay of a failure's final case, recording what :meth:`explain`
        needs; return picklable results. Optional: a contract that does not override it is not replayed."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers

    def spec(self, prop: str) -> PropertySpec:
        for p in self.properties:
            if p.name == prop:
                return p
        raise UnknownQuantityError(prop, [p.name for p in self.properties], kind=f"property of {self.name}")

    def property_names(self) -> list[str]:
        return [p.name for p in self.properties]

    def parse_options(self, given: dict | None) -> dict:
        """``given`` completed with the defaults; values converted to each option's kind.

        Raises UnknownQuantityError for an unknown name (with close matches and every option of the
        contract) and ConfigError naming the option for a bad value.
        """
        known = {o.name: o for o in self.options}
        out = {o.name: o.default for o in self.options}
        for key, value in (given or {}).items():
            if key not in known:
                raise UnknownQuantityError(key, sorted(known), kind=f"option of contract {self.name}", list_known=True)
            out[key] = parse_option_value(known[key], value)
        return out

    def __repr__(self) -> str:
        return f"<contract {self.name}>"

    # contracts are stateless: a rank rebuilds one from its class
    def __reduce__(self) -> tuple[Callable[[str, str], Contract], tuple[str, str]]:
        return (_contract_by_class, (type(self).__module__, type(self).__qualname__))


def _contract_by_class(module: str, qualname: str) -> Contract:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj()


def parse_option_value(option: Option, value: Any) -> Any:
    """Convert ``value`` (from TOML, or a string from ``--option NAME=VALUE``) to ``option.kind``.

    Strings become bools (``true``/``false``/``1``/``0``), ints, or JSON objects for dict options.
    Raises ConfigError naming the option.
    """
    field_name = f"option {option.name}"
    if isinstance(value, str) and option.kind is not str:
        text = value.strip()
        if option.kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ConfigError(field_name, value, "must be true or false")
            value = lowered in ("true", "1", "yes")
        elif option.kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(field_name, value, "must be an integer") from None
        elif option.kind is dict:
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(field_name, value, f"must be a JSON object ({exc.msg})") from None
    if option.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(field_name, value, "must be an integer")
    if option.kind is int:
        check_int(field_name, value, min_value=option.min_value, max_value=option.max_value)
    if option.kind is not int and not isinstance(value, option.kind):
        raise ConfigError(field_name, value, f"must be a {option.kind.__name__}")
    if option.choices is not None and value not in option.choices:
        raise ConfigError(field_name, value, f"must be one of {', '.join(map(repr, option.choices))}")
    return value


# ---------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Contract] = {}
_DISCOVERED = {"done": False}


def register_contract(contract: Contract) -> Contract:
    """Register a contract instance by its name (idempotent for the same class).

    Raises ConfigError when the name is empty or another class already took it.
    """
    if not isinstance(contract, Contract) or not contract.name:
        raise ConfigError("contract", contract, "must be a Contract instance with a name")
    check_min_world(contract)
    have = _REGISTRY.get(contract.name)
    if have is not None and type(have) is not type(contract):
        raise ConfigError("contract", contract.name, f"is already registered by {type(have).__qualname__}")
    _REGISTRY[contract.name] = contract
    return contract


def check_min_world(contract: Contract) -> Contract:
    """``contract`` when it declares the smallest world on which its claims can fail
    (:attr:`Contract.min_world_size`, an int >= 1, and :attr:`Contract.min_world_reason`, why a
    smaller one cannot); else ConfigError naming the field."""
    size = contract.min_world_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"{type(contract).__qualname__}.min_world_size", size,
                          "must be declared: the smallest world size (an int >= 1) on which the contract's "
                          "claims can fail")
    reason = contract.min_world_reason
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError(f"{type(contract).__qualname__}.min_world_reason", reason,
                          "must say why a smaller world cannot fail the contract's claims (or, at 1, why "
                          "every world can)")
    return contract


def _contract_modules() -> list:
    """Every module that may define contracts: the parallelism packages' ``contracts`` role modules and their
    ``<topic>_contracts`` companions, and their sub-modules when a role module is a package."""
    from distcheck.engine.discovery import role_modules

    found: list = []
    for root in role_modules("contracts"):
        found.append(root)
        if hasattr(root, "__path__"):
            found += [importlib.import_module(info.name)
                      for info in pkgutil.walk_packages(root.__path__, prefix=root.__name__ + ".")]
    return found


def _discover() -> None:
    """Register the Contract subclasses (with a name) that the modules of :func:`_contract_modules` define."""
    if _DISCOVERED["done"]:
        return
    for module in _contract_modules():
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, Contract) and value.__module__ == module.__name__
                    and value.name):
                register_contract(value())
    _DISCOVERED["done"] = True


def contracts() -> list[Contract]:
    """Every known contract, sorted by name (discovered on first call)."""
    _discover()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def get_contract(name: str | Contract) -> Contract:
    """The contract called ``name`` (or ``name`` itself when it is a Contract).

    Raises UnknownQuantityError (a KeyError) naming close matches.
    """
    if isinstance(name, Contract):
        return check_min_world(name)
    _discover()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownQuantityError(str(name), sorted(_REGISTRY), kind="contract") from None


def check_dtypes(dtypes: Sequence[str] | None, contract: Contract) -> tuple[str, ...]:
    """``dtypes`` validated (each one of :data:`DTYPES` or of the contract's own, such as :data:`EXACT`;
    no repeats); the contract's own when None."""
    if dtypes is None:
        return tuple(contract.dtypes)
    if isinstance(dtypes, str):
        items = [d.strip() for d in dtypes.split(",")]
        if dtypes.strip() and not all(items):
            raise ConfigError("dtypes", dtypes, "must not have an empty item (two commas, or a comma at an end)")
        dtypes = [d for d in items if d]
    out = tuple(dtypes)
    if not out:
        raise ConfigError("dtypes", list(dtypes), "must name at least one dtype")
    known = DTYPES + tuple(d for d in contract.dtypes if d not in DTYPES)
    for d in out:
        if d not in known:
            raise ConfigError("dtypes", d, f"must be one of {', '.join(known)}")
    if len(set(out)) != len(out):
        raise ConfigError("dtypes", list(out), "must not repeat a dtype")
    return out
