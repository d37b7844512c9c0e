"""What ``distcheck audit --where NAME`` and ``distcheck audit --list-keys`` print: where a closed form is defined,
and the shipped answer keys (called by :mod:`distcheck.cli`)."""

from __future__ import annotations

__all__ = ["closed_form_where", "render_key_list"]


def closed_form_where(name: str) -> str:
    """``path:line`` of the closed form ``name`` (an old name, ``pipeline.*``, read as its new one); a name that
    is no closed form is bad input (ConfigError naming --where, the value and the rule, with close matches)."""
    from distcheck.audit.quantities import renamed
    from distcheck.closed_form import catalogue
    from distcheck.core.errors import ConfigError, UnknownQuantityError

    forms = catalogue()
    try:
        return forms[renamed(name) or name].where
    except KeyError:
        hint = str(UnknownQuantityError(name, list(forms))).partition("; ")[2]  # "did you mean ...?", if any
        raise ConfigError("--where", name, "must name a closed form (see `distcheck audit --list`)"
                          + (f"; {hint}" if hint else "")) from None


def render_key_list(fmt: str) -> str:
    """The shipped answer keys (name, claims, title; the folder they are read from) as text in ``fmt``."""
    import json

    from distcheck.audit import load_key
    from distcheck.golden import default_golden_dir, shipped_keys

    keys = {name: load_key(path) for name, path in shipped_keys().items()}
    if fmt == "json":
        return json.dumps([{"name": name, "path": k.path, "title": k.title, "source": k.source,
                            "claims": len(k.claims), "checks": len(k.checks)} for name, k in keys.items()], indent=2)
    if fmt == "markdown":
        rows = ["| name | claims | title |", "|---|---|---|"]
        rows += [f"| `{name}` | {len(k.claims)} | {k.title} |" for name, k in keys.items()]
        return "\n".join(rows) + "\n"
    width = max(map(len, keys))
    lines = [f"shipped answer keys ({default_golden_dir()}); audit one with `distcheck audit NAME`",
             f"{'name':<{width}}  claims  title"]
    lines += [f"{name:<{width}}  {len(k.claims):>6}  {k.title}" for name, k in keys.items()]
    return "\n".join(lines) + "\n"
