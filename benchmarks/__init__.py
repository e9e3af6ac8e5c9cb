"""idemkey's latency-budget suite: ``python -m benchmarks``, ``nox -s bench``, ``idemkey bench``.

``main(argv)`` runs it and returns the exit status; see :mod:`benchmarks.cli`.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
