"""``set_retention``: the history retention is set or cleared
(`persistshard.core.statemachine.retention`).

Precondition: a valid retention (a positive window, 1..1000 versions; else `InvalidOption`).
Effect (`retained`): sets the retention (None clears it and its marks); the current version
counts as committed now (its real commit time may be older; counting it later only keeps
history longer), and since follows the new retention at once. One of the two kinds that may
change the retention (``changes_retention``); the other, ``append_set_retention``, has this
same effect (`retained`) before its append.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.statemachine import retention as ret
from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState, follow_retention
from persistshard.errors import InvalidOption


def retained(
    state: ShardState,
    retention: ret.Retention | None,
    at_ms: int | None,
    kind: str,
    location: str | None,
) -> ShardState:
    """``state`` with its retention set to ``retention`` (None: cleared, with its marks) and
    since following it at ``at_ms`` (module docstring); `InvalidOption` naming the commit
    ``kind`` for an invalid retention. Pure: the effect of ``set_retention`` and the first
    half of ``append_set_retention``."""
    if retention is None:
        return replace(state, retention=None, retention_marks=())
    problem = retention.problem()
    if problem is not None:
        raise InvalidOption(f"{kind}: {problem}", location=location)
    marks = state.retention_marks
    if state.upper > 0 and not marks and at_ms is not None:
        marks = ((at_ms, state.upper),)
    marks = ret.prune(retention, marks, at_ms)
    return follow_retention(replace(state, retention=retention, retention_marks=marks), at_ms)


def retention_json(retention: ret.Retention | None) -> dict[str, Any] | None:
    """The stored form of a retention argument (null: cleared)."""
    return retention.to_json() if retention is not None else None


@dataclass(frozen=True)
class SetRetention(Commit):
    """Set ``retention`` (None: clear it)."""

    kind = "set_retention"
    changes_retention = True

    retention: ret.Retention | None

    def args_json(self) -> dict[str, Any]:
        return {"retention": retention_json(self.retention)}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        return {"retention": ret.Retention.from_json(args.get("retention"))}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        return retained(state, self.retention, self.at_ms, self.kind, location)

    def summary(self) -> str:
        kept = self.retention
        return f"retention {kept.describe()}" if kept is not None else "retention cleared"
