"""Deprecated (goes in the next release): a closed form is reached by its name, ``distcheck.closed_form.get(NAME)``.

Every name this module served still resolves, with a DeprecationWarning naming its lookup.
"""

from distcheck.core.face import moved
from distcheck.forms import _form_path

__getattr__ = moved(__name__, _form_path("distcheck.parallel.tp.forms", ("HEADS_PER_RANK", "KV_HEADS_PER_RANK")),
                    "distcheck.closed_form.get(NAME)")
