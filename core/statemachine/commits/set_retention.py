"""``set_retention``: the history retention is set or cleared
(`persistshard.core.statemachine.retention`).

Precondition: a valid retention (a positive window, 1..1000 versions; else `InvalidOption`).
Effect: sets the retention (None clears it and its marks); the current version counts as
committed now (its real commit time may be older; counting it later only keeps history
longer), and since follows the new retention at once. The one kind that may change the
retention (``changes_retention``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from persistshard.core.statemachine import retention as ret
from persistshard.core.statemachine.commits.base import Commit
from persistshard.core.statemachine.state import ShardState, follow_retention
from persistshard.errors import InvalidOption


@dataclass(frozen=True)
class SetRetention(Commit):
    """Set ``retention`` (None: clear it)."""

    kind = "set_retention"
    changes_retention = True

    retention: ret.Retention | None

    def args_json(self) -> dict[str, Any]:
        retention = self.retention
        return {"retention": retention.to_json() if retention is not None else None}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        return {"retention": ret.Retention.from_json(args.get("retention"))}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        retention = self.retention
        if retention is None:
            return replace(state, retention=None, retention_marks=())
        problem = retention.problem()
        if problem is not None:
            raise InvalidOption(f"set_retention: {problem}", location=location)
        marks = state.retention_marks
        if state.upper > 0 and not marks and self.at_ms is not None:
            marks = ((self.at_ms, state.upper),)
        marks = ret.prune(retention, marks, self.at_ms)
        return follow_retention(
            replace(state, retention=retention, retention_marks=marks), self.at_ms
        )

    def summary(self) -> str:
        kept = self.retention
        return f"retention {kept.describe()}" if kept is not None else "retention cleared"
