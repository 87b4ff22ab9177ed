"""History retention: how far behind the upper a shard's since follows, as a pure rule.

A shard may carry a `Retention` in its state (commit ``set_retention``): a wall-clock window
(``ms``) and/or a number of *data versions* (``versions``: commits that moved the upper, i.e.
appends, overwrites, upserts and seals). Times are logical, so to know which upper was the
newest ``ms`` ago or ``N`` versions ago the state keeps *marks*: ``(commit time in ms, upper
after that commit)`` of recent upper-moving commits, oldest first.

The rule (`since_target`), applied by every upper-moving commit and by ``set_retention``
itself, all inside `persistshard.core.statemachine.commits.apply` (so replaying the log gives
the same since, and no extra commit or round trip is needed):

- versions ``N``: the N newest data versions stay readable, so since may reach
  ``u_N - 1`` where ``u_N`` is the upper of the N-th newest mark (N = 1: ``upper - 1``);
- window ``ms``: every snapshot a reader could have seen in the window stays readable, so
  since may reach ``u - 1`` where ``u`` is the upper of the newest mark committed at or
  before ``now - ms``;
- with both, history is kept while *either* rule still wants it (the smaller target); a rule
  that cannot answer yet (fewer than N marks, no mark old enough) keeps everything.
The state machine then moves since to ``max(since, min(target, every live hold))``: never
back, never past a live reader hold, never to or past the upper (a target is at most
``upper - 1``, so a snapshot at ``upper - 1`` stays readable).

What always holds for the marks (checked by `check_marks`): times and uppers are
non-decreasing, every upper is at most the shard's upper, and there are at most
`MAX_VERSIONS` + `MAX_WINDOW_MARKS` of them. Bounded by `prune`: marks older than the one
each rule needs are dropped, and when the marks only the window needs pass
`MAX_WINDOW_MARKS` the one whose neighbours are closest in time is dropped (the oldest is
kept), so the kept marks stay about ``ms / MAX_WINDOW_MARKS`` apart. Dropping a mark can only
pick an older mark later, so since may lag the window by the gap between kept marks; it
never moves further than the rule says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The largest ``versions`` a retention may keep (each is one mark in every state version).
MAX_VERSIONS = 1000
#: Marks kept for the window alone beyond the last ``versions`` (thinned when passed).
MAX_WINDOW_MARKS = 256

Mark = tuple[int, int]  # (commit time ms, upper after the commit)


@dataclass(frozen=True)
class Retention:
    """How much history a shard keeps readable: a window of ``ms`` milliseconds and/or the
    ``versions`` newest data versions; at least one is set (a cleared retention is None)."""

    ms: int | None = None
    versions: int | None = None

    def problem(self) -> str | None:
        """Why this retention is invalid, or None."""
        for name, value in (("ms", self.ms), ("versions", self.versions)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                return f"retention {name} {value!r} is not a positive integer"
        if self.ms is None and self.versions is None:
            return "a retention keeps a window or a number of versions"
        if self.versions is not None and self.versions > MAX_VERSIONS:
            return f"retention of {self.versions} versions is above the maximum {MAX_VERSIONS}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"ms": self.ms, "versions": self.versions}

    @staticmethod
    def from_json(d: dict[str, Any] | None) -> Retention | None:
        if d is None:
            return None
        return Retention(ms=d.get("ms"), versions=d.get("versions"))

    def describe(self) -> str:
        """``7d``, ``12h``, ``3600s``, ``100 versions`` or both joined by `` and ``."""
        parts = []
        if self.ms is not None:
            parts.append(format_window(self.ms))
        if self.versions is not None:
            parts.append(f"{self.versions} version{'' if self.versions == 1 else 's'}")
        return " and ".join(parts)


@dataclass(frozen=True)
class RetentionChange:
    """A write's request to set the shard's retention to ``to`` (None: clear it) in the same
    commit as its data (`persistshard.core.write.transaction.WriteTransaction.commit`, commit
    kind ``append_set_retention``); no change at all is None, not a `RetentionChange`."""

    to: Retention | None


def format_window(ms: int) -> str:
    """A window as the largest unit that divides it (``7d``, ``12h``, ``90m``, ``3600s``)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms / 1000:g}s"


def _window_index(marks: tuple[Mark, ...], cutoff: int) -> int | None:
    """Index of the newest mark committed at or before ``cutoff``, or None."""
    found = None
    for i, (t, _) in enumerate(marks):
        if t <= cutoff:
            found = i
        else:
            break
    return found


def _needed_from(retention: Retention, marks: tuple[Mark, ...], now_ms: int | None) -> int:
    """The index of the oldest mark some rule still needs (``len(marks)`` if none)."""
    needed = len(marks)
    if retention.versions is not None:
        needed = min(needed, max(0, len(marks) - retention.versions))
    if retention.ms is not None:
        i = _window_index(marks, now_ms - retention.ms) if now_ms is not None else None
        needed = min(needed, i if i is not None else 0)
    return needed


def since_target(retention: Retention, marks: tuple[Mark, ...], now_ms: int | None) -> int | None:
    """How far the retention lets since go (module docstring), or None when a rule cannot
    answer yet. Always below the newest mark's upper."""
    targets = []
    if retention.versions is not None:
        if len(marks) < retention.versions:
            return None
        targets.append(marks[-retention.versions][1] - 1)
    if retention.ms is not None:
        if now_ms is None:
            return None
        i = _window_index(marks, now_ms - retention.ms)
        if i is None:
            return None
        targets.append(marks[i][1] - 1)
    return max(0, min(targets)) if targets else None


def prune(retention: Retention, marks: tuple[Mark, ...], now_ms: int | None) -> tuple[Mark, ...]:
    """``marks`` without those no rule needs any more, thinned to the bound (docstring)."""
    marks = marks[_needed_from(retention, marks, now_ms) :]
    tail = retention.versions or 1
    while len(marks) > tail + MAX_WINDOW_MARKS:
        # Drop the window-only mark (never the oldest) whose neighbours are closest in time:
        # the kept marks stay spread evenly over the window, about ms / MAX_WINDOW_MARKS apart.
        last = len(marks) - tail  # marks[last:] are the versions' own
        drop = min(range(1, last), key=lambda i: (marks[i + 1][0] - marks[i - 1][0], i))
        marks = (*marks[:drop], *marks[drop + 1 :])
    return marks


def add_mark(
    retention: Retention, marks: tuple[Mark, ...], now_ms: int | None, upper: int
) -> tuple[Mark, ...]:
    """``marks`` after an upper-moving commit at ``now_ms`` made ``upper``, pruned. A commit
    without a time (logs from before commit times) adds none."""
    if now_ms is None:
        return marks
    if marks and (now_ms < marks[-1][0] or upper < marks[-1][1]):
        now_ms = max(now_ms, marks[-1][0])  # clocks may step back between writers
    return prune(retention, (*marks, (now_ms, upper)), now_ms)


def check_marks(retention: Retention | None, marks: tuple[Mark, ...], upper: int) -> str | None:
    """Why ``marks`` break the invariants of the module docstring, or None."""
    if retention is not None:
        problem = retention.problem()
        if problem is not None:
            return problem
    elif marks:
        return "retention marks without a retention"
    if len(marks) > MAX_VERSIONS + MAX_WINDOW_MARKS + 1:
        return f"{len(marks)} retention marks, above the bound"
    last = (0, 0)
    for m in marks:
        if (
            len(m) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in m)
            or m[0] < last[0]
            or m[1] < last[1]
            or m[1] > upper
        ):
            return f"retention mark {m!r} is out of order or past the upper {upper}"
        last = (m[0], m[1])
    return None
