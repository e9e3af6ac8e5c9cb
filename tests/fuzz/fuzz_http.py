"""atheris fuzz target for the sans-IO HTTP code (``idemkey.http`` and ``idemkey._core``).

    python tests/fuzz/fuzz_http.py                    # 200 000 runs (bounded), then a summary
    python tests/fuzz/fuzz_http.py -runs=2000000      # any libFuzzer flag works
    python tests/fuzz/fuzz_http.py -max_total_time=600 corpus_dir/

Each input is cut into an exchange (method, header lines, body, the store's answer, the app's
answer, a policy variant) by :class:`atheris.FuzzedDataProvider` and walked by
``tests/fuzz/_harness.run_exchange``, which checks every property. An exception of any kind is
a crash: libFuzzer stops and writes the input to ``crash-<sha1>``.

Without ``-runs`` or ``-max_total_time`` the run is bounded to 200 000 inputs so that nobody's
machine spins forever by accident. libFuzzer prints the count at the end: ``Done N runs``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402 - after the path set-up, so the harness imports from this checkout

with atheris.instrument_imports():
    import idemkey._codec
    import idemkey._core
    import idemkey.http  # noqa: F401 - instrumented for coverage feedback

from tests.fuzz._harness import Input, run_exchange  # noqa: E402

DEFAULT_RUNS = 200_000
KEY_NAMES = [b"Idempotency-Key", b"idempotency-key", b"Content-Type", b"Content-Length"]


def _bytes(fdp: atheris.FuzzedDataProvider, limit: int) -> bytes:
    return bytes(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, limit)))


def _token(fdp: atheris.FuzzedDataProvider) -> bytes:
    raw = _bytes(fdp, 16)
    return bytes(b for b in raw if 0x21 <= b <= 0x7E and b != 0x3A) or b"x"


def _printable(fdp: atheris.FuzzedDataProvider) -> bytes:
    return bytes(b for b in _bytes(fdp, 30) if b >= 0x20 and b != 0x7F)


def input_from(data: bytes) -> Input:
    fdp = atheris.FuzzedDataProvider(data)
    method = fdp.PickValueInList([b"POST", b"PATCH", b"GET", b"PUT", b"post", None])
    if method is None:
        method = _bytes(fdp, 8)
    headers: list[tuple[bytes, bytes]] = []
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        name = fdp.PickValueInList([*KEY_NAMES, None])
        headers.append((name if name is not None else _bytes(fdp, 16), _bytes(fdp, 300)))
    response_headers = [(_token(fdp), _printable(fdp)) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return Input(
        method=method,
        path=_bytes(fdp, 20) if fdp.ConsumeBool() else b"/charges",
        query=_bytes(fdp, 20),
        headers=headers,
        body=_bytes(fdp, 3000),
        decision=fdp.ConsumeIntInRange(0, 4),
        stored=_bytes(fdp, 100),
        retry_after=fdp.ConsumeRegularFloat(),
        status=fdp.ConsumeIntInRange(100, 599),
        response_headers=response_headers,
        response_body=None if fdp.ConsumeBool() else _bytes(fdp, 100),
        variant=fdp.ConsumeIntInRange(0, 7),
    )


def test_one_input(data: bytes) -> None:
    run_exchange(input_from(data))


def main() -> None:
    # Rejected and unreadable records are logged as warnings; millions of them are just noise.
    logging.getLogger("idemkey").setLevel(logging.CRITICAL)
    args = list(sys.argv)
    if not any(arg.startswith(("-runs=", "-max_total_time=")) for arg in args[1:]):
        args.append(f"-runs={DEFAULT_RUNS}")
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
