"""A keyed request's fingerprint: what an honest retry must send again (no I/O).

Its method, path, query, content type and encoding, and its body compared as
``Policy.fingerprint`` says: as bytes (the default), in a canonical form (``_canonical``: a
multipart body's parts, ``"json"``'s key order), or as the policy's own callable returns it.
:meth:`Exchange.received <idemkey.http.Exchange.received>` takes it once the body is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._core import fingerprint
from ..errors import ConfigurationError
from ._canonical import canonical_json, multipart_form

if TYPE_CHECKING:
    from ..policy import Policy
    from ._messages import Request

__all__ = ["request_fingerprint"]

# A content type starting otherwise is not multipart: one cheap test on the default path.
_MULTIPART_INITIALS: Final = frozenset("mM")
# The content type compared for a multipart body reduced to its parts: no header can carry it
# (a line break), so it never equals a body compared as bytes.
_MULTIPART_PARTS: Final = "multipart/form-data\nparts"


def _custom_form(value: object) -> bytes:
    """What a ``Policy(fingerprint=callable)`` returned, as bytes."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    raise ConfigurationError(
        f"Policy.fingerprint must return bytes or str, got {type(value).__name__}"
    )


def request_fingerprint(policy: Policy, request: Request, body: bytes) -> bytes:
    """The request's fingerprint, its body compared as ``Policy.fingerprint`` says."""
    lookup = request.headers.get_all  # hot path: what .get would call, one call less
    types, encodings = lookup("content-type"), lookup("content-encoding")
    content_type = types[0] if types else ""
    encoding = encodings[0] if encodings else ""
    how = policy.fingerprint
    if how == "bytes" and content_type[:1] not in _MULTIPART_INITIALS:
        pass  # the default, and the fast path: the bytes as sent
    elif callable(how):
        body = _custom_form(how(request, body))
    elif not encoding:  # a canonical form reads the body, so only an unencoded one
        if content_type[:19].lower() == "multipart/form-data":
            parts = multipart_form(content_type, body)
            if parts is not None:
                content_type, body = _MULTIPART_PARTS, parts
        elif how == "json":
            body = canonical_json(body) or body
    return fingerprint(request.method, request.path, request.query, content_type, body, encoding)
