"""Process-wide thread pools that survive ``fork``.

Spark's Python workers are forked from a daemon that may already have imported (and used)
this package, and a forked child inherits a pool object whose threads do not exist in it.
A `SharedPool` therefore makes its executor lazily, once per process, and makes a new one
when it finds itself in a different process than the one that made it.

Invariant: work submitted to one `SharedPool` must never wait on work submitted to the same
pool (with every worker waiting, nothing would run the awaited work). Each pool in this
package documents who submits to it and what that work may wait on.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class SharedPool:
    """A lazily made `ThreadPoolExecutor` of ``workers`` threads named ``name``-N, one per
    process (remade in a forked child)."""

    def __init__(self, name: str, workers: int) -> None:
        self.name = name
        self.workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        """This process's executor (made on first use)."""
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._executor = ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix=self.name
                )
                self._pid = os.getpid()
            return self._executor


#: Threads of a pool sized to the machine: at least 2 (decoding overlaps fetching even on one
#: core), at most 8.
WORKERS = max(2, min(8, os.cpu_count() or 2))
