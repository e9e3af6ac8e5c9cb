"""``idemkey probe URL``: does an endpoint, on any server, behave when a request is retried?"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
from pathlib import Path
from typing import IO, Final

from .._options import TOKEN
from ..store._url import redacted
from ._base import CliError, print_json
from .probing.session import Plan, ProbeSession, derive_edit
from .probing.transport import Target, Unreachable, parse_target, send_batch
from .probing.verdicts import Result, worst
from .readable import shown

HELP: Final = "check an endpoint's retry behaviour over HTTP (any server)"
MAX_CONCURRENCY: Final = 20
DEFAULT_CONCURRENCY: Final = 5
WARNING: Final = (
    "warning: this creates real records on the target (each success runs the endpoint); use staging"
)
_example = Plan("POST", (), b"", b"x", other_tenant=("A", "b"), concurrency=DEFAULT_CONCURRENCY)
_bound = _example.max_requests - DEFAULT_CONCURRENCY
DESCRIPTION: Final = f"""\
Send a fixed sequence of requests with fresh random keys and print one line per check:

  1  first request     the request with a key must succeed (reference for the rest)
  2  same key again    must answer the same status and byte-equal body (a different
                       body means it ran twice); the replay header is reported. Equal
                       bytes without a replay header are INCONCLUSIVE (never PASS)
                       unless checks 4-5 show the body differs per execution
  3  edited retry      the same key with an edited body must be refused: 422 (IETF
                       draft) or 400 (Stripe); 409 passes with a warning; 2xx fails
  4  no key            reports whether a key is required (400) or the endpoint runs
                       unprotected (a warning)
  5  concurrent        N identical first requests at once with one new key: at most
                       one execution (identical answers, or 409 with Retry-After)
  6  other tenant      with --other-tenant-header: the same key from another tenant
                       must not get the first tenant's response

Bounded: it never sends more than {_bound} + N requests ({_example.max_requests} with the \
default N={DEFAULT_CONCURRENCY}):
one each for checks 1, 3, 4 and 6, N for check 5, and up to {1 + _example.replay_retries} for \
check 2, which
resends on 409 after the Retry-After it is given (at most {_example.max_wait:g} s).

Where the server says more than the draft (a problem's retry and retention members, a
header naming the retention, Idempotent-Replayed: false on a first answer), the check lines
show it.

Warning: it creates real records on the target; every successful request runs the
endpoint (a charge, an order). Use staging, not production.
"""
EPILOG: Final = (
    "exit status: 0 every check holds (warnings allowed), 1 a check failed, 2 bad arguments, "
    "3 the endpoint cannot be reached, 4 inconclusive: no check failed, but one could not tell "
    "a replay from a second execution (no replay header, the same body every time)"
)
#: The probe's verdict -> its exit status.
EXIT_CODES: Final = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}
FORMATTER: Final = argparse.RawDescriptionHelpFormatter

KEY_HEADER: Final = "Idempotency-Key"
#: Headers the probe writes itself: the key, and the body's framing.
_OWN_HEADERS: Final = frozenset({KEY_HEADER.lower(), "content-length", "transfer-encoding"})


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        metavar="URL",
        help="the endpoint, http:// or https:// (credentials go in -H, not in the URL)",
    )
    parser.add_argument("--method", "-X", default="POST", help="HTTP method (default: POST)")
    body = parser.add_mutually_exclusive_group()
    body.add_argument("--data", "-d", metavar="BODY", help="the request body")
    body.add_argument("--data-file", metavar="FILE", help="read the request body from FILE")
    parser.add_argument(
        "--edit",
        metavar="BODY",
        help="the edited body for check 3, a request the endpoint would accept on its own (a "
        "validation 400 would pass for a refusal); default: the JSON body with its first "
        "number + 1, else its first string + '-edited'",
    )
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header for every request (repeatable), e.g. credentials",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds each request may take, from sending it to its answer's last byte (10)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"requests sent at once in check 5 (2 to {MAX_CONCURRENCY}; default "
        f"{DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--replay-header",
        default="Idempotent-Replayed",
        metavar="NAME",
        help="the header that marks a replay (default: Idempotent-Replayed)",
    )
    parser.add_argument(
        "--other-tenant-header",
        metavar="'NAME: VALUE'",
        help="another tenant's credentials, for check 6 (replaces the -H of that name)",
    )


def _header(text: str, option: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not TOKEN.fullmatch(name):
        raise _malformed(text, option, colon)
    if any(c in value for c in "\r\n\0"):
        raise CliError(f"{option} {name}: the value holds a line break", 2)
    try:
        value.encode("latin-1")  # what HTTP/1.1 can carry in a header
    except UnicodeEncodeError:
        raise CliError(f"{option} {name}: the value is not ISO-8859-1 text", 2) from None
    if name.lower() in _OWN_HEADERS:
        raise CliError(f"{option}: the probe sets {name} itself", 2)
    return name, value


#: The header name a malformed -H starts with: a name and a space (``Authorization Bearer``).
_LEADING_NAME: Final = re.compile(rf"\s*({TOKEN.pattern})\s")


def _malformed(text: str, option: str, colon: str) -> CliError:
    """``option``'s argument is not ``'Name: value'``: said without printing it, as it is
    often a credential (``-H 'Authorization Bearer xyz'``, the colon left out). Only the
    header name it starts with is named, when a space follows one (a value alone, a token or
    base64, has none)."""
    leading = _LEADING_NAME.match(text)
    which = f"the one starting with {leading[1]!r}" if leading else "one"
    head = text.partition(":")[0]
    if not colon:
        problem = f"{which} has no ':'"
    elif not head.strip():
        problem = f"{which} has no header name before its ':'"
    elif any(c.isspace() for c in head.strip()):
        problem = f"{which} has a space before its first ':', which a header name cannot hold"
    else:
        problem = f"{which} has a character before its first ':' that a header name cannot hold"
    return CliError(
        f"{option} must look like 'Name: value', and {problem} (the rest is not shown: it may "
        "be a credential)",
        2,
    )


def _body(args: argparse.Namespace) -> bytes:
    if args.data_file is not None:
        try:
            return Path(args.data_file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read --data-file {args.data_file}: {exc.strerror}", 2) from None
    return _argument_bytes(args.data or "", "--data")


def _argument_bytes(text: str, option: str) -> bytes:
    """A body given on the command line as the bytes the shell passed, as ``curl -d`` sends
    them: Python decodes argv with ``surrogateescape``, so a byte that is not UTF-8 (latin-1
    form data, say) arrives as a lone surrogate, and ``os.fsencode`` gives the byte back
    (``sys.argv``'s documented inverse); ``str.encode`` refused it with a traceback."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError as exc:  # from Python: a str no command line gives ("\ud800")
        bad = exc.object[exc.start : exc.end]
        raise CliError(f"{option} holds {bad!r}, which the locale cannot encode", 2) from None


def plan_from(args: argparse.Namespace) -> tuple[Target, Plan, str]:
    """The target and the plan the arguments describe, and how the edited body was made."""
    method = args.method.upper()
    if not TOKEN.fullmatch(method):
        raise CliError(f"--method must be an HTTP method, got {args.method!r}", 2)
    try:
        target = parse_target(method, args.url)
    except ValueError as exc:
        raise CliError(f"bad URL: {exc}", 2) from None
    if not 0 < args.timeout <= 600:
        raise CliError("--timeout must be between 0 and 600 seconds", 2)
    if not 2 <= args.concurrency <= MAX_CONCURRENCY:
        raise CliError(f"--concurrency must be between 2 and {MAX_CONCURRENCY}", 2)
    if not TOKEN.fullmatch(args.replay_header):
        raise CliError(f"--replay-header must be a header name, got {args.replay_header!r}", 2)
    headers = tuple(_header(h, "-H") for h in args.header)
    tenant = None
    if args.other_tenant_header is not None:
        tenant = _header(args.other_tenant_header, "--other-tenant-header")
    body = _body(args)
    if args.edit is not None:
        edited, how = _argument_bytes(args.edit, "--edit"), "given with --edit"
        if edited == body:
            raise CliError("--edit must differ from the request body", 2)
    else:
        derived = derive_edit(body)
        if derived is None and not body:
            raise CliError(
                "no request body was given: give -d BODY (or --data-file), the JSON a client "
                "sends, and the probe derives the changed request for check 3 from it (or give "
                "--edit BODY)",
                2,
            )
        if derived is None:
            raise CliError(
                "give --edit BODY (a changed request for check 3): none can be derived from "
                "this body (only from a JSON object with a number or string field)",
                2,
            )
        edited, how = derived
    if body and not any(n.lower() == "content-type" for n, _ in headers):
        try:
            json.loads(body)
            headers += (("Content-Type", "application/json"),)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
            headers += (("Content-Type", "application/octet-stream"),)
    plan = Plan(
        method,
        headers,
        body,
        edited,
        concurrency=args.concurrency,
        replay_header=args.replay_header,
        other_tenant=tenant,
        key_header=KEY_HEADER,
    )
    return target, plan, how


def _line(result: Result) -> str:
    # The checks escape what the server said; this pass keeps a terminal from obeying any
    # server text a future check line forgets to.
    lines = [f"{result.verdict:<4}  {result.number}  {result.name:<21} {shown(result.summary)}"]
    lines.extend(f"{'':<30}{shown(detail)}" for detail in result.details)
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, out: IO[str]) -> int:
    target, plan, how = plan_from(args)
    session = ProbeSession(plan, f"probe-{secrets.token_hex(8)}", f"probe-{secrets.token_hex(8)}")
    url = redacted(args.url)  # a query's password=, as a Redis URL's (user information is refused)
    if not args.json:
        out.write(
            f"idemkey probe: {plan.method} {url}, at most {plan.max_requests} requests\n"
            f"{WARNING}\n"
            f"keys {session.first_key} (checks 1-3, 6), {session.concurrent_key} (check 5); "
            f"edited body: {how}\n"
        )
        out.flush()
    try:
        while (batch := session.next_batch()) is not None:
            settled = session.receive(send_batch(target, batch, args.timeout))
            if not args.json:
                out.write("".join(_line(r) for r in settled))
                out.flush()
    except Unreachable as exc:
        raise CliError(f"{url}: {exc}", 3) from None
    verdicts = {r.verdict for r in session.results}
    verdict = next((v for v in ("FAIL", "INCONCLUSIVE") if v in verdicts), "PASS")
    code = EXIT_CODES[verdict]
    if args.json:
        print_json(
            {
                "url": url,
                "method": plan.method,
                "verdict": verdict,
                "worst": worst(session.results),
                "exit_code": code,
                "requests_sent": session.sent,
                "max_requests": plan.max_requests,
                "keys": [session.first_key, session.concurrent_key],
                "edited_body": how,
                "warning": WARNING.removeprefix("warning: "),
                "checks": [
                    {
                        "check": r.number,
                        "name": r.name,
                        "verdict": r.verdict,
                        "summary": r.summary,
                        "details": list(r.details),
                    }
                    for r in session.results
                ],
            },
            out,
        )
    else:
        failed = [r.number for r in session.results if r.verdict == "FAIL"]
        warned = [r.number for r in session.results if r.verdict == "WARN"]
        unsure = [r.number for r in session.results if r.verdict == "INCONCLUSIVE"]
        if failed:
            tail = f"checks {failed} FAILED"
        elif unsure:
            tail = f"checks {unsure} could not tell a replay from a second execution"
        else:
            tail = "every check holds"
        if failed and unsure:
            tail += f" (inconclusive: {unsure})"
        if warned:
            tail += f" (warnings: {warned})"
        out.write(f"verdict: {verdict}: {tail}; {session.sent} requests sent\n")
    return code
