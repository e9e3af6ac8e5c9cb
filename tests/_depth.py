"""How far the suite's long-form tests go: a short form by default, the long one with
``IDEMKEY_DEEP=1`` (``nox -s deep`` sets it; CI's ``.ci/run`` too, for the tests that have a long
form, ``-m "hypothesis or long_form"``, when the run so far leaves it the minutes). A test that
reads ``DEEP`` and is not a hypothesis test carries the ``long_form`` marker
(tests/test_ci_steps.py checks it).

The long forms test nothing the short ones do not: the same requests, faults and checks, only
more of them. The soak races for 25 s instead of one round of keys, the fuzz tests draw four
times the examples, and every other hypothesis test draws 500 instead of 100 (the ``deep``
profile, which ``tests/conftest.py`` loads).
"""

from __future__ import annotations

import os

__all__ = ["DEEP", "DEEP_PROFILE", "examples"]

DEEP = os.environ.get("IDEMKEY_DEEP", "") == "1"
#: The hypothesis profile loaded when DEEP (``--hypothesis-profile`` still wins when given).
DEEP_PROFILE = "deep"


def examples(deep: int) -> int:
    """The examples a costly hypothesis test draws: ``deep`` in the long form, a quarter of it
    otherwise."""
    return deep if DEEP else max(deep // 4, 1)
