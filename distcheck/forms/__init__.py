"""sympy closed forms, one module per strategy, each registering into
:mod:`distcheck.closed_form`'s catalogue. These modules never import the numpy
references: a closed form and a reference are two independent derivations of
the same quantity, and the properties check that they agree."""
