"""Discovery: the parallelism packages and their role modules, found by walking
:mod:`distcheck.parallel` (``pkgutil.iter_modules``), never from a list of names.

A parallelism package is a sub-package ``distcheck/parallel/<name>/``. It holds what there is
to know about one strategy, in modules named by their role (:data:`ROLES`):

- ``reference``: numpy references (pure, no torch);
- ``forms``: sympy closed forms, each registered with its source;
- ``strategies``: Hypothesis strategies (public, re-exported by :mod:`distcheck.strategies`);
- ``properties``: registered :class:`~distcheck.engine.registry.Property` objects;
- ``mutants``: registered known-wrong implementations;
- ``proofs``: registered sympy proofs;
- ``contracts``: contracts a user's implementation is certified against (registered by
  :mod:`distcheck.engine.contracts`, run by ``distcheck certify`` and ``distcheck check``);
- ``checks``, ``findings``: real-backend checks and recorded upstream discrepancies;
- ``quantities``: audit quantities beyond the closed forms.

A role module may be a sub-package, or import sibling modules of its own (``reference``
importing ``attention``): discovery imports the role module, and the role module imports
the rest. A role may also be spread over *companion* modules named ``<topic>_<role>``
(``tp/vocab_contracts.py``, ``tp/vocab_forms.py``), imported after the role module. Every
registry of the engine (closed forms, properties, mutants, proofs, contracts) fills itself by
importing one role of every package, so adding a package adds its forms, properties, mutants,
proofs and contracts without editing any other file.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType

from distcheck.core.validate import check_choice

__all__ = ["PARALLEL", "ROLES", "packages", "role_module", "companion_modules", "role_modules", "import_package"]

#: the package whose sub-packages are the parallelism packages
PARALLEL = "distcheck.parallel"
#: the role modules a parallelism package may hold (each optional)
ROLES = ("reference", "forms", "strategies", "properties", "mutants", "proofs", "contracts", "checks", "findings",
         "quantities")



def packages() -> tuple[str, ...]:
    """The names of the parallelism packages (``"dp"``, ``"tp"``, ...), sorted."""
    spec = importlib.util.find_spec(PARALLEL)
    if spec is None or spec.submodule_search_locations is None:  # pragma: no cover - a broken install
        return ()
    return tuple(sorted(info.name for info in pkgutil.iter_modules(spec.submodule_search_locations) if info.ispkg))


def role_module(package: str, role: str) -> ModuleType | None:
    """``distcheck.parallel.<package>.<role>``, imported; None when the package has no such module.

    Raises ConfigError for a role not in :data:`ROLES` or a package not in :func:`packages`."""
    check_choice("role", role, ROLES)
    check_choice("package", package, packages())
    name = f"{PARALLEL}.{package}.{role}"
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


def companion_modules(package: str, role: str) -> tuple[str, ...]:
    """Names of the modules ``<topic>_<role>`` of ``package`` (``vocab_contracts``, ``vocab_forms``),
    sorted: a role spread over topic modules next to the role module, so a topic can be added in a
    file of its own. Raises ConfigError as :func:`role_module`."""
    check_choice("role", role, ROLES)
    check_choice("package", package, packages())
    spec = importlib.util.find_spec(f"{PARALLEL}.{package}")
    if spec is None or spec.submodule_search_locations is None:  # pragma: no cover - a broken install
        return ()
    suffix = f"_{role}"
    return tuple(sorted(f"{PARALLEL}.{package}.{info.name}" for info in pkgutil.iter_modules(
        spec.submodule_search_locations) if info.name.endswith(suffix) and len(info.name) > len(suffix)))


def role_modules(role: str) -> list[ModuleType]:
    """The ``role`` module of every package that has one, then its companion modules
    ``<topic>_<role>`` (:func:`companion_modules`), imported, in package order.

    Raises ConfigError for a role not in :data:`ROLES`."""
    check_choice("role", role, ROLES)
    out: list[ModuleType] = []
    for p in packages():
        module = role_module(p, role)
        out += [module] if module is not None else []
        out += [importlib.import_module(name) for name in companion_modules(p, role)]
    return out


def import_package() -> None:
    """Import every module of the layers properties draw on: ``distcheck.core``,
    ``distcheck.engine`` and ``distcheck.parallel`` (none imports torch at module level).

    Hypothesis mixes into its draws the literal constants of the "local" (non-installed,
    non-test) modules loaded at the time, and picks up newly loaded ones as it goes. A
    reference or mutant imported lazily in the middle of a run would change the draws
    of every later property, so the same seed could give different rows. Loading these
    layers first makes distcheck's part of that pool the same in every run. The layers
    above (the CLI, the pytest plugin, figures, the third-party targets) are left alone:
    they may need optional dependencies (pytest, matplotlib, DeepSpeed ...) that an
    installed wheel does not have, and no property loads them.
    """
    for layer in ("distcheck.core", "distcheck.engine", PARALLEL):
        root = importlib.import_module(layer)
        for info in pkgutil.walk_packages(root.__path__, layer + "."):
            importlib.import_module(info.name)
