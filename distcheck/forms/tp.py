"""Deprecated (goes in the next release): a closed form is reached by its name, ``distcheck.closed_form.get(NAME)``.

Every name this module served still resolves, with a DeprecationWarning naming its lookup.
"""

from distcheck.core.face import moved
from distcheck.forms import _form_path

_SERVED = ("OUTPUT_COLS_PER_SHARD", "INPUT_ROWS_PER_SHARD", "ROW_ALLREDUCE_COUNT", "MLP_ALLREDUCE_PER_FORWARD",
           "ATTENTION_ALLREDUCE_PER_FORWARD", "COMM_ELEMENTS_PER_LAYER", "COMM_BYTES_PER_LAYER")
__getattr__ = moved(__name__, _form_path("distcheck.parallel.tp.forms", _SERVED), "distcheck.closed_form.get(NAME)")
