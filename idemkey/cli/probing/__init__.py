"""The machinery of ``idemkey probe``: sans-IO verdicts (:mod:`.verdicts`) on the answers and
their evidence (:mod:`.answers`), the sequence as a state machine (:mod:`.session`), and the
HTTP driver (:mod:`.transport`, standard library only).
The command itself, its arguments and its output, is :mod:`idemkey.cli.probe`."""
