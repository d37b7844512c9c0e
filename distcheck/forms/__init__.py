"""Public paths of the closed forms, one module per strategy (``distcheck.forms.tp`` ...).

The forms live in their parallelism packages (``distcheck/parallel/<name>/forms.py``), each
registering into the catalogue of :mod:`distcheck.closed_form`, which finds them by
discovery. These modules re-export them under the names they have always had. A form module
never imports the numpy references: a closed form and a reference are two independent
derivations of the same quantity, and the properties check that they agree.
"""
