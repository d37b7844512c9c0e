"""Answer-key audits: recompute every figure of a key from the closed forms and judge it.

    from distcheck.audit import audit_file, audit_exit_code, render
    result = audit_file("golden/lesson.toml")
    print(render(result, "markdown"))
    sys.exit(audit_exit_code(result))

The key format, the verdicts and the conventions are documented in docs/AUDIT.md.
Modules: :mod:`~distcheck.audit.files` (regular files only, size limit),
:mod:`~distcheck.audit.keys` (parse and validate, tomllib only; with
:mod:`~distcheck.audit.key_lines`, the line of every field, and :mod:`~distcheck.audit.key_values`,
exact numbers and input domains),
:mod:`~distcheck.audit.numbers` (printed figures and their rounding step),
:mod:`~distcheck.audit.quantities` (the auditable catalogue; with
:mod:`~distcheck.audit.claim_units` (units and their families), :mod:`~distcheck.audit.presets`
(model presets) and :mod:`~distcheck.audit.worked_examples` (the lesson's tensor-parallel example,
run on the references in exact arithmetic)),
:mod:`~distcheck.audit.counts` (which units count whole things; uneven splits),
:mod:`~distcheck.audit.conventions` (alternative readings, as data),
:mod:`~distcheck.audit.constraints` (a quantity's own constraints, as data),
:mod:`~distcheck.audit.rounded_inputs` (the interval of values inputs printed with precision imply, and
the values of them a figure needs),
:mod:`~distcheck.audit.verdict` (one verdict per claim),
:mod:`~distcheck.audit.figures` (what a rounded figure stands for; tie rules),
:mod:`~distcheck.audit.consistency` (sum, product and equal checks),
:mod:`~distcheck.audit.report` (table, Markdown, JSON).
"""

from distcheck.audit.keys import CHECK_VERDICTS, UNDECIDED, VERDICTS, AnswerKey, Check, Claim, load_key, parse_key
from distcheck.audit.quantities import get_quantity, list_quantities
from distcheck.audit.report import render, render_quantity_list, render_table, to_json, to_markdown
from distcheck.audit.verdict import (
    AuditResult,
    CheckVerdict,
    ClaimVerdict,
    audit_exit_code,
    audit_file,
    audit_key,
)

__all__ = [
    "VERDICTS", "UNDECIDED", "CHECK_VERDICTS", "AnswerKey", "Claim", "Check", "load_key", "parse_key",
    "get_quantity", "list_quantities",
    "AuditResult", "ClaimVerdict", "CheckVerdict", "audit_key", "audit_file", "audit_exit_code",
    "render", "render_table", "to_markdown", "to_json", "render_quantity_list",
]
