"""Where `persistshard conformance` works, and how it leaves the place as it found it.

A run has an id (`new_run`); every sub-location it writes is named
``conformance-<run id>-<uuid>`` (`scratch_name`) directly under the location the user gave,
and `remove_run` deletes all of them (recursively, whatever the tests left) when the run ends,
passed or failed. Sub-locations of other runs, and everything else, are never touched.

`refuse_inside_shard` stops a run before it writes anything when the location, or one of its
parents, is a shard (it holds a blob consensus log, ``consensus/``): the suite's
sub-locations would otherwise sit among the shard's own objects.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from typing import Any

import fsspec

from persistshard.core.storage.layout import CONSENSUS_PREFIX, new_id

log = logging.getLogger("persistshard.conformance.cleanup")

#: Every sub-location the suite writes starts with this.
SCRATCH_PREFIX = "conformance-"


def new_run() -> str:
    """A fresh run id (hex, starts with the time: runs sort by start)."""
    return new_id()[:20]


def scratch_name(run: str) -> str:
    """The name of a fresh sub-location of run ``run``."""
    return (
        f"{SCRATCH_PREFIX}{run}-{uuid.uuid4().hex}"
        if run
        else f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"
    )


def remove_run(location: str, run: str, storage_options: dict[str, Any]) -> int:
    """Delete every sub-location of run ``run`` under ``location``; how many there were."""
    fs, root = fsspec.core.url_to_fs(location, **storage_options)
    prefix = f"{SCRATCH_PREFIX}{run}-"
    try:
        entries = fs.ls(root, detail=False, refresh=True)
    except FileNotFoundError:
        return 0
    doomed = [e for e in entries if posixpath.basename(str(e).rstrip("/")).startswith(prefix)]
    for path in doomed:
        fs.rm(str(path), recursive=True)
    log.info("removed %d scratch locations of run %s", len(doomed), run)
    return len(doomed)


def shard_at(location: str, storage_options: dict[str, Any]) -> str | None:
    """``location`` or the nearest parent of it that holds a shard's consensus log, else None."""
    fs, root = fsspec.core.url_to_fs(location, **storage_options)
    path = root.rstrip("/")
    while True:
        log_dir = posixpath.join(path, CONSENSUS_PREFIX.rstrip("/")) if path else "consensus"
        try:
            if fs.isdir(log_dir) and fs.ls(log_dir, detail=False):
                return path or "/"
        except (FileNotFoundError, PermissionError):
            pass
        parent = posixpath.dirname(path)
        if not path or parent == path:
            return None
        path = parent


def refuse_inside_shard(location: str, storage_options: dict[str, Any]) -> str | None:
    """A message saying why the suite must not run at ``location`` (a shard is there), else
    None."""
    found = shard_at(location, storage_options)
    if found is None:
        return None
    return (
        f"refusing to run the conformance suite at {location}: {found} is a shard (it holds "
        f"a consensus log), and the suite would write among its objects; point it at an "
        "empty place outside any shard"
    )
