"""The closed-form catalogue: every ``forms`` module of the parallelism packages, imported
once, and lookups by name (public path: :mod:`distcheck.closed_form`).

The forms themselves (:class:`~distcheck.core.closed_form.ClosedForm`) and their registry
are in :mod:`distcheck.core.closed_form`; this module only makes sure every package has
registered its forms before a lookup.
"""

from __future__ import annotations

from fractions import Fraction

from distcheck.core.closed_form import ClosedForm, registered
from distcheck.core.errors import UnknownQuantityError
from distcheck.core.validate import check_type
from distcheck.engine.discovery import role_modules

__all__ = ["catalogue", "get", "form_value"]

_loaded = False


def catalogue() -> dict[str, ClosedForm]:
    """All closed forms by name, sorted (imports every package's ``forms`` module once)."""
    global _loaded
    if not _loaded:
        role_modules("forms")
        _loaded = True
    return registered()


def get(name: str) -> ClosedForm:
    """The closed form called ``name``.

    Raises ConfigError when ``name`` is not a str, UnknownQuantityError (a KeyError,
    with close matches) when no closed form has that name."""
    check_type("name", name, str, "must be a str naming a closed form, e.g. 'pp.bubble_fraction.gpipe'")
    forms = catalogue()
    try:
        return forms[name]
    except KeyError:
        raise UnknownQuantityError(name, list(forms)) from None


def form_value(name: str, **values: object) -> int | Fraction:
    """The catalogue form ``name`` evaluated exactly (int or Fraction) on the inputs it takes;
    values for inputs the form does not have are ignored (so one dict of case values can feed
    every form). Raises UnknownQuantityError for an unknown name, ConfigError for bad inputs."""
    form = get(name)
    known = {i.name for i in form.inputs}
    return form.evaluate(**{k: v for k, v in values.items() if k in known})
