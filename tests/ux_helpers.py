"""Test helpers for what a user sees: a really read-only shard directory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def _tree(root: str) -> list[str]:
    paths = [root]
    for parent, dirs, files in os.walk(root):
        paths += [os.path.join(parent, n) for n in dirs + files]
    return paths


@contextmanager
def read_only(root: str) -> Iterator[None]:
    """Make every directory and file under ``root`` unwritable for this process, then undo it.

    Not root: mode bits (``chmod a-w``). Root ignores mode bits, so as root every path is made
    immutable (``chattr +i``, needs CAP_LINUX_IMMUTABLE); either way a write, a create, a
    rename or a delete under ``root`` fails with ``PermissionError`` as on a read-only mount.
    """
    paths = _tree(root)
    if os.geteuid() != 0:
        modes = {p: os.stat(p).st_mode for p in paths}
        for p in paths:
            os.chmod(p, modes[p] & ~0o222)
        try:
            yield
        finally:
            for p in paths:
                os.chmod(p, modes[p])
        return
    subprocess.run(["chattr", "+i", *paths], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *paths], check=True, capture_output=True)


def probe_read_only(root: str) -> None:
    """Fail unless `read_only` really refuses a create under ``root`` (the test's premise)."""
    with read_only(root):
        try:
            with open(os.path.join(root, "probe"), "wb"):
                pass
        except PermissionError:
            return
    os.remove(os.path.join(root, "probe"))
    raise AssertionError(f"could not make {root} read-only")
