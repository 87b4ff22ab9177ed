"""Configuration: every tunable of a shard handle, in one frozen object with its default and doc.

A `ShardConfig` travels with a `persistshard.core.shard.Shard` (``shard.config``) and its
`persistshard.core.statemachine.machine.StateMachine` (``machine.config``); the code of a shard
reads its sizes, leases, timeouts and budgets from there, never from module constants, and its
time from ``config.clock``. Every knob is declared once, below, with its name, default and one
line of doc (`KNOBS`, the README's options table lists the same).

One parser, `ShardConfig.from_options`, builds a configuration from every route a user has:
Python keyword arguments (``open_shard(path, inline_bytes=0)``), Spark options and SQL
``OPTIONS`` (case-insensitive names, string values) and the CLI's ``--set name=value`` flags.
A knob left out keeps its default; a value that is not a number of the knob's kind, or is
below its minimum, is `InvalidOption` naming the knob.

Invariants:
- A configuration is immutable: `replace` makes a changed copy; a shard's configuration never
  changes while it is open.
- What is not here stays a module constant on purpose: format magic numbers and key prefixes
  (the bytes on storage), limits every writer must agree on because they shape the stored state
  (e.g. `persistshard.core.statemachine.state.MAX_WRITER_RECORDS`), and per-process resources
  (thread pools, the caches shared by every shard of a process).
- The one environment variable honoured, ``PERSISTSHARD_INLINE_BYTES`` (the default of
  ``inline_bytes`` for a process and the Spark workers it starts), is read by
  `ShardConfig.from_options` when a configuration is built, never at import; a `ShardConfig`
  built by hand takes the defaults written below.
- ``clock`` is a callable returning milliseconds since the epoch; every id, commit time, lease
  and hold of the shard reads it. Tests pass a settable one; by default it is the process's
  wall clock (`persistshard.core.storage.layout.now_ms`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from persistshard.core.storage import layout
from persistshard.errors import InvalidOption
from persistshard.format.pool import WORKERS

__all__ = [
    "DEFAULTS",
    "INLINE_BYTES_ENV",
    "KNOBS",
    "MEMORY_BUDGET",
    "Clock",
    "ShardConfig",
    "system_clock",
]

#: A clock: milliseconds since the epoch.
Clock = Callable[[], int]

#: The environment variable `ShardConfig.from_options` reads for ``inline_bytes`` when no
#: route gives it: a process's default, which the Spark workers it starts inherit.
INLINE_BYTES_ENV = "PERSISTSHARD_INLINE_BYTES"


def system_clock() -> int:
    """The process's wall clock in ms (`persistshard.core.storage.layout.now_ms`, looked up at
    each call: a process whose whole clock is skewed, as the conformance recorder's ``skew``
    fault makes one, skews its shards too)."""
    return layout.now_ms()


def _knob(default: float, doc: str, *, minimum: float = 0) -> Any:
    """A tunable: its default, its one line of doc, and the smallest value it accepts."""
    return field(default=default, metadata={"doc": doc, "minimum": minimum})


@dataclass(frozen=True)
class ShardConfig:
    """Every tunable of one shard handle (module docstring). Sizes are bytes, durations
    seconds; ``clock`` is milliseconds."""

    # --- writes -------------------------------------------------------------------------
    inline_bytes: int = _knob(
        4 << 10,
        "an append whose encoded part is at most this many bytes is committed inline in the "
        "state (0: every part is a file; at most 64 KiB)",
    )
    inline_cap: int = _knob(
        64 << 10, "a commit never takes the state's inline bytes past this (0: none inline)"
    )
    part_bytes: int = _knob(
        256 << 20, "a part is cut into several once its uncompressed size passes this", minimum=1
    )
    chunk_bytes: int = _knob(
        8 << 20, "uncompressed bytes per chunk inside a part (the unit of a ranged read)", minimum=1
    )
    slice_rows: int = _knob(
        65536,
        "rows an overwrite's difference (and a complete-mode view's) merges per slice of each run",
        minimum=1,
    )
    # --- compaction ---------------------------------------------------------------------
    compact_wide_rows: int = _knob(
        4_096,
        "batches of at least this many updates merge four at a time, smaller ones eight (a "
        "merge's work per row against its fixed cost)",
        minimum=1,
    )
    # --- commits ------------------------------------------------------------------------
    commit_deadline_seconds: float = _knob(
        120.0, "a commit that has not landed after this long is refused (CommitDeadline)"
    )
    commit_backoff_seconds: float = _knob(
        0.01, "the first wait after a failed storage request of a commit (doubles, capped)"
    )
    # --- reads --------------------------------------------------------------------------
    scan_task_bytes: int = _knob(
        4 << 20, "a scan plans its read in tasks of about this many stored bytes", minimum=1
    )
    scan_release_bytes: int = _knob(
        32 << 20,
        "a scan hands the memory of mapped parts back to the OS after reading this many bytes",
        minimum=1,
    )
    scan_merge_budget: int = _knob(
        64 << 20,
        "bytes a scan of unconsolidated updates merges in memory before spilling sorted runs",
        minimum=1,
    )
    scan_ahead: int = _knob(
        2 * WORKERS, "pieces a scan reads ahead of the one it returns", minimum=1
    )
    min_task_bytes: int = _knob(
        1 << 20,
        "a read spread over the cores (min_partitions) splits off tasks of at least this many "
        "stored bytes",
        minimum=1,
    )
    map_min_bytes: int = _knob(
        64 << 10, "a local part at least this large is read through a memory mapping"
    )
    #: The shard's clock (module docstring); not an option of Spark, SQL or the CLI.
    clock: Clock = field(default=system_clock, compare=False)

    def replace(self, **changes: Any) -> ShardConfig:
        """A copy with ``changes`` (knob names, or ``clock``), checked like `from_options`."""
        return ShardConfig.from_options(changes, base=self, env=False)

    def options(self) -> dict[str, Any]:
        """The knobs that differ from their defaults, by name (what reopens a shard with this
        configuration elsewhere, e.g. in a Spark task; the clock is not among them)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name in KNOBS and getattr(self, f.name) != f.default
        }

    @classmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        base: ShardConfig | None = None,
        env: bool = True,
        location: str | None = None,
        prefix: str = "",
    ) -> ShardConfig:
        """The configuration ``base`` (default: the defaults) with the knobs named in
        ``options`` (names case-insensitive; values numbers or strings, as Spark, SQL and the
        CLI give them; ``clock`` a callable); keys that name no knob are ignored (the caller
        refuses them: they may be storage options). With ``env`` and no ``inline_bytes``
        given, ``PERSISTSHARD_INLINE_BYTES`` is the default of ``inline_bytes``.
        `InvalidOption` names a knob whose value is not a number of its kind or is below its
        minimum; ``prefix`` starts the knob's name there (``"option "`` for Spark and SQL
        options, ``"--set "`` for the CLI)."""
        base = base if base is not None else cls()
        values: dict[str, Any] = {}
        for key, value in options.items():
            name = key.lower()
            if name == "clock":
                if not callable(value):
                    raise InvalidOption(
                        f"clock {value!r} is not callable; give a function returning "
                        "milliseconds since the epoch",
                        location=location,
                    )
                values["clock"] = value
            elif name in KNOBS and value is not None:
                values[name] = _parse(name, value, location, prefix)
        if env and "inline_bytes" not in values:
            raw = os.environ.get(INLINE_BYTES_ENV)
            if raw is not None and raw.strip():
                values["inline_bytes"] = _parse(
                    "inline_bytes", raw, location, f"environment variable {INLINE_BYTES_ENV}: "
                )
        return dataclasses.replace(base, **values) if values else base


#: The memory budget of one write when it names none (``memory_budget``: an argument of each
#: write, e.g. the Spark write option and `Shard.self_correct`'s, not a knob of the shard).
MEMORY_BUDGET = 256 << 20

#: The defaults (what a parameter that defaults to a knob's default names).
DEFAULTS = ShardConfig()

#: Every knob's name, default and doc (the clock is not a knob: no string sets it).
KNOBS: dict[str, tuple[Any, str]] = {
    f.name: (f.default, f.metadata["doc"])
    for f in dataclasses.fields(ShardConfig)
    if "doc" in f.metadata
}

_TYPES: dict[str, type] = {
    f.name: (float if f.type in ("float", float) else int) for f in dataclasses.fields(ShardConfig)
}
_MINIMUMS: dict[str, float] = {
    f.name: f.metadata["minimum"] for f in dataclasses.fields(ShardConfig) if "doc" in f.metadata
}


_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")
#: The largest integer a knob takes (a signed 64-bit integer, as Spark and Arrow hold them).
MAX_INT64 = (1 << 63) - 1


def _parse(name: str, value: Any, location: str | None, prefix: str) -> Any:
    """``value`` as knob ``name``'s kind (an integer, or a finite number of seconds) of at
    least its minimum; a string must spell the number plainly (no ``1e3``, ``10_000``,
    ``2k``): `InvalidOption` otherwise, never the default in its place."""
    kind = _TYPES[name]
    what = f"{prefix}{name}"
    number: float | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int) or (isinstance(value, float) and kind is float):
        number = value
    elif isinstance(value, float):
        number = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        text = value.strip()
        if text == "":
            raise InvalidOption(
                f"{what} is empty ({value!r}); give it a value, or leave it out for its "
                f"default ({KNOBS[name][0]})",
                location=location,
            )
        pattern = _INTEGER if kind is int else _NUMBER
        number = (int(text) if kind is int else float(text)) if pattern.fullmatch(text) else None
    given = repr(value) if isinstance(value, str) else str(value)
    if number is None or not math.isfinite(number):
        raise InvalidOption(
            f"{what} {given} is not {'an integer' if kind is int else 'a number of seconds'} "
            f"({name}: {KNOBS[name][1]})",
            location=location,
        )
    minimum = _MINIMUMS[name]
    if number < minimum:
        bound = "must not be negative" if minimum == 0 else f"must be at least {minimum:g}"
        raise InvalidOption(f"{what} {given} {bound}", location=location)
    if number > MAX_INT64:
        raise InvalidOption(
            f"{what} {given} must be at most {MAX_INT64} (64-bit)", location=location
        )
    return kind(number)
