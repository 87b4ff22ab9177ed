"""A fault-injecting HTTP proxy in front of an S3 endpoint (the local moto server, or any).

The faults a real network produces between a client and object storage, injected where they
happen, so the client library (s3fs over botocore, its own retries left ON) reacts to them as
it would in production: a PUT applied by the server whose response is lost is retried by the
library itself, and the retry of a conditional create answers 412 ("exists").

`FaultProxy` listens on 127.0.0.1 and a free port (stdlib only: ``http.server`` with a thread
per connection, ``http.client`` upstream) and forwards every request to ``upstream``. Each
request is matched against the proxy's current `Rule` list (replaceable at run time,
`FaultProxy.set_rules`); the first rule that matches and whose seeded draw fires decides:

- ``drop``: forward, let the server apply it, then close the connection without answering
  (a lost response: the client sees the connection closed and retries).
- ``delay``: wait ``delay_seconds`` before forwarding (a slow network; a paused client).
- ``reset``: forward, send the status line, the headers and half of the body, then reset the
  connection (cut mid-body).
- ``error500``: forward (applied), then answer 500 InternalError instead of the real answer.
- ``twice``: deliver the request to the server twice and answer the first response (a
  duplicated request).
- ``strip_if_none_match``: forward without the ``If-None-Match`` header, so the server
  overwrites: an endpoint that ignores the condition (a lying store).

Every rule is bounded (``times``: how many requests it may hit; None for no bound) and the
proxy stops by itself after ``lifetime_seconds`` (it is a test tool: nothing keeps it alive).
``hits`` counts what was injected per action; ``requests`` every request seen.

`s3_options_via` turns s3fs storage options that point at the server into options that point
at the proxy (retries stay as s3fs sets them).
"""

from __future__ import annotations

import http.client
import logging
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("persistshard.conformance.proxy")

#: What a rule can do to a request (see the module docstring).
ACTIONS = frozenset({"drop", "delay", "reset", "error500", "twice", "strip_if_none_match"})
#: Headers that describe one hop's connection, not the request: never forwarded.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding"})
_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>injected by persistshard's fault proxy</Message></Error>"
)


@dataclass
class Rule:
    """One fault: ``action`` applied, with probability ``probability`` (a seeded draw), to the
    requests that match ``method`` (None: any), whose path contains ``path_contains`` (None:
    any) and that carry the header ``header`` (None: any; e.g. ``"If-None-Match"`` selects
    conditional creates). At most ``times`` hits (None: no bound)."""

    action: str
    method: str | None = None
    path_contains: str | None = None
    header: str | None = None
    probability: float = 1.0
    times: int | None = None
    delay_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown proxy action {self.action!r} (one of {sorted(ACTIONS)})")

    def matches(self, method: str, path: str, headers: dict[str, str]) -> bool:
        """Whether the request is one this rule is about (before the draw and the bound)."""
        if self.times is not None and self.times <= 0:
            return False
        if self.method is not None and method.upper() != self.method.upper():
            return False
        if self.path_contains is not None and self.path_contains not in path:
            return False
        return self.header is None or self.header.lower() in headers


class FaultProxy:
    """The proxy (see the module docstring). Start it with `start` (or use `fault_proxy`);
    `endpoint` is its URL. Thread-safe; rules may change while requests are in flight."""

    def __init__(self, upstream: str, *, seed: int = 0, lifetime_seconds: float = 600.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(
                f"the fault proxy forwards to a plain http:// endpoint, not {upstream!r}"
            )
        self.upstream = (parts.hostname, parts.port or 80)
        self.lifetime_seconds = lifetime_seconds
        self.hits: Counter[str] = Counter()
        self.requests = 0
        self._rules: list[Rule] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    @property
    def endpoint(self) -> str:
        """The URL clients use instead of the upstream's."""
        if self._server is None:
            raise RuntimeError("the fault proxy is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def set_rules(self, *rules: Rule) -> None:
        """Replace the rules (none: forward everything unchanged)."""
        with self._lock:
            self._rules = list(rules)

    def _decide(self, method: str, path: str, headers: dict[str, str]) -> Rule | None:
        with self._lock:
            self.requests += 1
            for rule in self._rules:
                if not rule.matches(method, path, headers):
                    continue
                if self._rng.random() >= rule.probability:
                    continue
                if rule.times is not None:
                    rule.times -= 1
                self.hits[rule.action] += 1
                return rule
        return None

    def start(self) -> FaultProxy:
        """Listen on 127.0.0.1 and a free port, in a daemon thread; stop after the lifetime."""
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime_seconds, self.stop)
        self._timer.daemon = True
        self._timer.start()
        log.info("fault proxy at %s in front of %s:%d", self.endpoint, *self.upstream)
        return self

    def stop(self) -> None:
        """Stop listening (idempotent); connections in flight end with their requests."""
        server, self._server = self._server, None
        if self._timer is not None:
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send one request upstream; its (status, reason, headers, body)."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            if body:
                conn.send(body)
            response = conn.getresponse()
            data = response.read()
            out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
            return response.status, response.reason, out, data
        finally:
            conn.close()


class _Handler(BaseHTTPRequestHandler):
    """One client connection (keep-alive: several requests in turn)."""

    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fault proxy: " + format, *args)

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers: dropped (the body went upstream with a length)
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        method, path = self.command, self.path
        body = self._body()
        headers = [
            (k, v)
            for k, v in self.headers.items()
            if k.lower() not in _HOP and k.lower() != "content-length"
        ]
        present = {k.lower(): v for k, v in headers}
        rule = self.owner._decide(method, path, present)
        action = rule.action if rule is not None else None
        if action is not None:
            log.info("fault proxy: %s %s -> %s", method, path, action)
        if rule is not None and action == "delay":
            time.sleep(rule.delay_seconds)
        if action == "strip_if_none_match":
            headers = [(k, v) for k, v in headers if k.lower() != "if-none-match"]
        try:
            status, reason, out, data = self.owner.forward(method, path, headers, body)
            if action == "twice":
                self.owner.forward(method, path, headers, body)
        except OSError as e:
            log.info("fault proxy: upstream failed (%s)", e)
            self._abort()
            return
        if action == "drop":
            self._abort()
            return
        if action == "error500":
            status, reason, data = 500, "Internal Server Error", _ERROR_BODY
            out = [("Content-Type", "application/xml")]
        self.send_response(status, reason)
        length = str(len(data))
        for name, value in out:
            if name.lower() != "content-length":
                self.send_header(name, value)
            elif method == "HEAD" and action != "error500":
                length = value  # a HEAD's length is the object's size, its body is empty
        self.send_header("Content-Length", length)
        self.end_headers()
        if method == "HEAD":
            return
        if action == "reset":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self._abort(reset=True)
            return
        self.wfile.write(data)

    def _abort(self, *, reset: bool = False) -> None:
        """Close the client connection without (the rest of) an answer; ``reset``: with a
        TCP reset rather than an orderly close."""
        self.close_connection = True
        try:
            if reset:
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


@contextmanager
def fault_proxy(
    upstream: str, *, seed: int = 0, lifetime_seconds: float = 600.0
) -> Iterator[FaultProxy]:
    """A started `FaultProxy` in front of ``upstream``, stopped when the block ends."""
    proxy = FaultProxy(upstream, seed=seed, lifetime_seconds=lifetime_seconds).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def s3_options_via(options: dict[str, Any], proxy: FaultProxy) -> dict[str, Any]:
    """s3fs storage options like ``options`` with the endpoint replaced by the proxy's. s3fs's
    own retries stay on (its default), so a lost response is retried as in production;
    the connection pool is not shared with handles that bypass the proxy."""
    client_kwargs = {**options.get("client_kwargs", {}), "endpoint_url": proxy.endpoint}
    return {**options, "client_kwargs": client_kwargs, "skip_instance_cache": True}
