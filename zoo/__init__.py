"""The zoo of real silent bugs of distributed training (``distcheck zoo``; see docs/ZOO.md).

One module per public report, each defining ``ENTRY = distcheck.zoo.Entry(...)``: the bug reproduced as a
target of an existing contract, its fixed twin, and the public reference. Modules whose name starts with ``_``
are shared helpers, not entries. This folder ships in the sdist, not in the wheel.
"""
