"""An HTTP/1.1-aware loopback proxy that records every request and injects one fault per request.

``tests/faults/_proxy.py`` cuts and delays raw byte chunks, which suits Redis; a client retry
test needs to act on whole HTTP messages ("the server answered, then the answer was lost"), so
this proxy reads each request and each response by their framing::

    with HttpFaultProxy("127.0.0.1", server_port) as proxy:
        proxy.arm("drop")          # the next request reaches the server; its answer is lost
        proxy.arm("hold", 1.0)     # ... its answer arrives 1 s late, after the client gave up
        proxy.arm("reset")         # the next request is answered with a TCP RST, unforwarded
        proxy.arm("shed")          # ... with a 503, unforwarded (a load balancer shedding load)
        proxy.arm("gateway")       # ... reaches the server; a 504 comes back in its answer's place
        proxy.seen                 # every request: method, target, headers, body, time, fault

Each request goes upstream on a fresh connection (so a fault never leaks into the next
request). Blocking sockets with a short timeout and a stop flag: nothing outlives ``close()``.

:class:`ConnectProxy` is a forward proxy for ``https://`` URLs (httpx's ``proxy=``), which
tunnels each ``CONNECT`` to ``upstream`` or refuses it, one armed fault per ``CONNECT``::

    with TlsScriptedServer(respond) as origin, ConnectProxy(origin.port) as proxy:
        proxy.arm("refuse")        # the next CONNECT is answered 502: nothing reaches the origin
        proxy.connects             # every CONNECT's target
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._loopback import LoopbackServer
from ._scripted_server import ScriptedServer
from ._scripted_server import Seen as ScriptedSeen

__all__ = ["ConnectProxy", "HttpFaultProxy", "Seen", "TlsScriptedServer", "self_signed"]

Fault = Literal["pass", "drop", "hold", "reset", "shed", "gateway"]

#: What a gateway answers in the server's place: "shed" before forwarding, "gateway" after.
_SHED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"
_GATEWAY_TIMEOUT = b"HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 7\r\n\r\ntimeout"

_TICK = 0.05
_JOIN = 2.0
_UPSTREAM_TIMEOUT = 30.0  # how long a response may take (a slow handler)


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as it crossed the proxy, byte for byte."""

    method: str
    target: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    at: float  # time.monotonic() when the whole request had arrived
    fault: Fault


class _Closed(Exception):
    """The peer closed, or the proxy is stopping."""


class _Reader:
    def __init__(self, sock: socket.socket, stop: threading.Event, timeout: float) -> None:
        self.sock, self.stop, self.timeout = sock, stop, timeout
        self.buffer = b""

    def _fill(self, deadline: float) -> None:
        while not self.stop.is_set():
            if time.monotonic() > deadline:
                raise _Closed("timed out")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                raise _Closed(str(exc)) from exc
            if not data:
                raise _Closed("eof")
            self.buffer += data
            return
        raise _Closed("stopping")

    def until(self, marker: bytes) -> bytes:
        deadline = time.monotonic() + self.timeout
        while marker not in self.buffer:
            self._fill(deadline)
        head, self.buffer = self.buffer.split(marker, 1)
        return head + marker

    def exactly(self, size: int) -> bytes:
        deadline = time.monotonic() + self.timeout
        while len(self.buffer) < size:
            self._fill(deadline)
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def to_eof(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        with contextlib.suppress(_Closed):
            while True:
                self._fill(deadline)
        data, self.buffer = self.buffer, b""
        return data

    def message(self, *, response: bool) -> tuple[bytes, dict[str, str], bytes]:
        """One HTTP/1.1 message: (head, headers, body), the body framed as its headers say."""
        head = self.until(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        if response and (lines[0].split(" ")[1].startswith("1") or " 204 " in lines[0]):
            return head, headers, b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size_line = self.until(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                chunk = self.exactly(size + 2)
                body += size_line + chunk
                if size == 0:
                    return head, headers, body
        if "content-length" in headers:
            return head, headers, self.exactly(int(headers["content-length"]))
        return head, headers, self.to_eof() if response else b""


class HttpFaultProxy(LoopbackServer):
    """Forward 127.0.0.1:``port`` to ``upstream``, one HTTP request at a time per connection."""

    def __init__(
        self, upstream_host: str, upstream_port: int, listener: socket.socket | None = None
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._faults: list[tuple[Fault, float]] = []
        #: Every request that fully arrived, in order.
        self.seen: list[Seen] = []
        super().__init__("http-fault-proxy", listener)
        self.host, self.port = "127.0.0.1", self._listener.getsockname()[1]

    def arm(self, fault: Fault, seconds: float = 0.0) -> None:
        """Apply ``fault`` to the next request that arrives (faults queue up, one per request)."""
        with self._lock:
            self._faults.append((fault, seconds))

    def requests_for(self, needle: str) -> list[Seen]:
        """The requests whose target contains ``needle`` (a per-test call id in the query)."""
        with self._lock:
            return [seen for seen in self.seen if needle in seen.target]

    # ---- plumbing ---------------------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        reader = _Reader(client, self._stop, timeout=3600.0)  # an idle keep-alive connection
        try:
            while not self._stop.is_set():
                try:
                    head, headers, body = reader.message(response=False)
                except _Closed:
                    return
                request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
                with self._lock:
                    fault, seconds = self._faults.pop(0) if self._faults else ("pass", 0.0)
                    self.seen.append(
                        Seen(
                            request_line[0], request_line[1], headers, body, time.monotonic(), fault
                        )
                    )
                if fault == "reset":
                    # SO_LINGER 0: close() sends RST, not FIN; nothing was forwarded.
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if fault == "shed":
                    answer: tuple[bytes, dict[str, str]] | None = (_SHED, {})
                else:
                    answer = self._forward(head + body)
                if answer is None or fault == "drop":
                    return  # the server answered (or died); the client never hears it
                if fault == "gateway":
                    answer = (_GATEWAY_TIMEOUT, {})
                if fault == "hold" and self._stop.wait(seconds):
                    return
                try:
                    client.sendall(answer[0])
                except OSError:
                    return
                if answer[1].get("connection", "").lower() == "close":
                    return
        finally:
            with self._lock:
                self._sockets.discard(client)
            with contextlib.suppress(OSError):
                client.close()

    def _forward(self, request: bytes) -> tuple[bytes, dict[str, str]] | None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=2.0)
        except OSError:
            return None
        upstream.settimeout(_TICK)
        with self._lock:
            self._sockets.add(upstream)
        try:
            upstream.sendall(request)
            head, headers, body = _Reader(upstream, self._stop, _UPSTREAM_TIMEOUT).message(
                response=True
            )
            return head + body, headers
        except (OSError, _Closed):
            return None
        finally:
            with self._lock:
                self._sockets.discard(upstream)
            with contextlib.suppress(OSError):
                upstream.close()


# ---- a forward proxy for https:// (CONNECT) --------------------------------------------------

TunnelFault = Literal["tunnel", "refuse"]
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, its own CA, and its key: ``cert.pem``, ``key.pem``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idemkey test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TlsScriptedServer(ScriptedServer):
    """A :class:`ScriptedServer` over TLS, with the certificate of :func:`self_signed`. A
    ``respond`` that raises ``OSError`` closes the connection unanswered (an answer lost)."""

    def __init__(self, respond: Callable[[ScriptedSeen], bytes], cert: Path, key: Path) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(cert, key)
        super().__init__(respond)
        self.port = self._listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)  # the handshake, then the short timeout of every read
        try:
            secure = self._context.wrap_socket(conn, server_side=True)
        except OSError:
            conn.close()
            return
        secure.settimeout(_TICK)
        with self._lock:
            self._sockets.add(secure)
        super()._serve(secure)


class ConnectProxy(LoopbackServer):
    """A forward proxy on 127.0.0.1:``port`` whose every ``CONNECT`` goes to ``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._faults: list[TunnelFault] = []
        #: Every CONNECT's target, in order.
        self.connects: list[str] = []
        super().__init__("connect-proxy")  # self.url: http://127.0.0.1:<port>, for proxy=

    def arm(self, fault: TunnelFault) -> None:
        """Apply ``fault`` to the next CONNECT (faults queue up; then every one is tunnelled)."""
        with self._lock:
            self._faults.append(fault)

    def _serve(self, client: socket.socket) -> None:
        reader = _Reader(client, self._stop, timeout=10.0)
        try:
            head = reader.until(b"\r\n\r\n")
        except _Closed:
            client.close()
            return
        with self._lock:
            fault = self._faults.pop(0) if self._faults else "tunnel"
            self.connects.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
        if fault == "refuse":
            with contextlib.suppress(OSError):
                client.sendall(_BAD_GATEWAY)
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2.0)
        except OSError:
            client.close()
            return
        upstream.settimeout(_TICK)
        with self._lock:
            self._sockets.add(upstream)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        back = threading.Thread(target=self._pipe, args=(upstream, client), daemon=True)
        back.start()
        self._pipe(client, upstream)
        back.join(_JOIN)
        for sock in (client, upstream):
            with self._lock:
                self._sockets.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
            except TimeoutError:
                continue
            except OSError:
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
