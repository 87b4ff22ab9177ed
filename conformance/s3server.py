"""A local S3-compatible server for conformance runs, tests and benchmarks: moto's standalone
server on 127.0.0.1 and a free port, with one bucket, stopped on exit.

Needs ``moto[server]`` and ``boto3`` (both in the ``test`` extra). Nothing leaves this machine:
the server listens on loopback only.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("persistshard.conformance.s3server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server(bucket: str, key: str, secret: str, *, start_seconds: float = 60) -> Iterator[str]:
    """Start the server, create ``bucket`` with the credentials ``key``/``secret`` and yield
    its endpoint URL; the server is terminated when the block ends (killed after 15 s)."""
    import boto3

    port = _free_port()
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    command = [server] if os.path.exists(server) else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*command, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.2)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        ).create_bucket(Bucket=bucket)
        log.info("moto S3 server at %s (pid %d)", endpoint, proc.pid)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
