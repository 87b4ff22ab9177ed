"""``append_set_retention``: an append (`commits.append.Append`: an append, an overwrite, an
upsert, a micro-batch) that also sets or clears the history retention, atomically: a Spark
write with option ``retention`` whose retention differs from the shard's.

Precondition: the append's, and a valid retention (else `InvalidOption`, as
``set_retention``). Effect: first ``set_retention``'s (`commits.set_retention.retained`:
the retention set, or cleared with its marks; since follows it), then the append's on that
state (its upper mark, since following the new retention). One commit, so a write that fails
leaves the retention as it was, and a write that lands sets it with its data. One of the two
kinds that may change the retention (``changes_retention``).

Stored as its own kind, not as an argument of ``append``: a reader that predates it ignores
arguments of a known kind it does not know, and would replay the append without the
retention (a state that differs silently), whereas an unknown kind is refused as
`CorruptData` naming the entry. Its arguments are the append's plus ``retention``
(``set_retention``'s form: the retention, or null to clear it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from persistshard.core.statemachine import retention as ret
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.set_retention import retained, retention_json
from persistshard.core.statemachine.state import ShardState


@dataclass(frozen=True, kw_only=True)
class AppendSetRetention(Append):
    """An append that sets the shard's ``retention`` first (None: clears it); module
    docstring. `Shard.history` names it as the append it is (``overwrite``, ``upsert``,
    ``stream append``, ...) and its summary adds the retention it set."""

    kind = "append_set_retention"
    changes_retention = True

    retention: ret.Retention | None

    @classmethod
    def of(cls, append: Append, retention: ret.Retention | None) -> AppendSetRetention:
        """``append`` (a plain `Append`: same id, parts, upper, writer, label) setting
        ``retention`` too."""
        if type(append) is not Append:
            raise TypeError(f"{append.kind} commit {append.id} cannot also set the retention")
        own = {f.name: getattr(append, f.name) for f in fields(append) if f.init}
        return cls(**own, retention=retention)

    def args_json(self) -> dict[str, Any]:
        return {**super().args_json(), "retention": retention_json(self.retention)}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        rest = dict(args)
        retention = rest.pop("retention")  # required: a KeyError is CorruptData
        if retention is not None and not isinstance(retention, dict):
            raise TypeError(f"append_set_retention retention {retention!r} is not an object")
        return {**super().fields_from_args(rest), "retention": ret.Retention.from_json(retention)}

    def apply(self, state: ShardState, location: str | None) -> ShardState:
        return super().apply(
            retained(state, self.retention, self.at_ms, self.kind, location), location
        )

    def summary(self) -> str:
        kept = self.retention
        also = (
            f"set the retention to {kept.describe()}"
            if kept is not None
            else "cleared the retention"
        )
        return f"{super().summary()}; also {also}"
