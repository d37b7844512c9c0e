"""Deprecated (goes in the next release): the closed forms are reached by name, :func:`distcheck.closed_form.get`.

The forms live in their parallelism packages (internal modules ``distcheck/parallel/<name>/forms.py``),
each registering into the catalogue of :mod:`distcheck.closed_form`, which finds them by discovery.
The modules ``distcheck.forms.<strategy>`` kept their old names for one release: each name still
resolves, with a DeprecationWarning naming the catalogue lookup that replaces it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def _names(value: Any) -> list[str]:
    """The names of the closed forms ``value`` holds (a form, or a dict or tuple of them)."""
    from distcheck.core.closed_form import ClosedForm

    if isinstance(value, ClosedForm):
        return [value.name]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return [n for item in items for n in _names(item)]


def _form_path(internal: str, names: tuple[str, ...] | None = None) -> Callable[[str], tuple[str, Any] | None]:
    """The new home of a name of a deprecated ``distcheck.forms.<strategy>`` (served from ``internal``, only
    ``names`` of it when given): ``distcheck.closed_form.get('<name>')`` for a form; for a collection of forms,
    the lookup of its members (``'<prefix>.*'``)."""

    def where(name: str) -> tuple[str, Any] | None:
        module = importlib.import_module(internal)
        if name not in (names if names is not None else getattr(module, "__all__", ())):
            return None
        value = getattr(module, name)
        found = _names(value)
        if len(found) == 1:
            return f"distcheck.closed_form.get({found[0]!r})", value
        if found:
            parts = [n.split(".") for n in found]
            common = [p[0] for p in zip(*parts, strict=False) if len(set(p)) == 1]
            return f"distcheck.closed_form.get({'.'.join(common + ['<name>'])!r}) (distcheck audit --list)", value
        return f"{internal}.{name} (internal)", value

    return where
