"""The commit envelope: what every commit kind is, how the kinds are registered, and `apply`.

A commit is one state transition, stored in the consensus log. Each kind is a frozen
dataclass subclassing `Commit` in a module of its own in this package, with typed fields,
its stored arguments (`Commit.args_json` / `Commit.fields_from_args`), its transition
(`Commit.apply`) and its line in `Shard.history` (`Commit.summary`). Declaring the subclass
(with its ``kind``) registers it (`KINDS`), so decoding a stored commit finds it by name:
adding a kind touches its own module (and its tests), nothing else.

What always holds:
- The stored form is ``{"kind", "id", "args"[, "at_ms"]}`` with the kind's arguments in
  ``args`` (and the commit's ``metrics`` under ``args["metrics"]``): `Commit.to_json` of a
  decoded commit gives back the same JSON, so typed commits store exactly the bytes the
  dictionaries did (``tests/golden/entries-v1.json``).
- `apply` is pure: the state after a commit is a function of the state before and the commit
  (with its time ``at_ms``), so replaying the log gives the same states. A failed
  precondition raises (``Assert...`` classes, `persistshard.core.statemachine.state`) and
  changes nothing.
- Kind names are unique: a second class claiming a registered name is a `TypeError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from persistshard.core.statemachine.state import (
    PartRef,
    ShardState,
    part_write_id,
    prune_due,
    prune_writers,
)
from persistshard.errors import CorruptData, NoShard

#: Every commit kind, by its stored name (filled as the kinds' classes are declared).
KINDS: dict[str, type[Commit]] = {}


@dataclass(frozen=True, kw_only=True)
class Commit(ABC):
    """One state transition, as stored in the consensus log (a kind: a subclass).

    ``id`` is unique per attempt group: retries of the same logical commit reuse it, so a
    retry after an `Indeterminate` error can find out whether the first attempt landed.
    ``at_ms`` is the committing clock, stamped on each attempt by the state machine; leases
    are judged by it, so replaying the log gives the same states. ``metrics`` is what the
    operation did (`persistshard.core.storage.metrics.commit_metrics`), stamped with it.
    """

    #: The stored name of the kind (``append``, ``compact``, ...).
    kind: ClassVar[str]
    #: Whether this kind may change the retention (`check_transition`).
    changes_retention: ClassVar[bool] = False
    #: Whether this kind applies to a dropped shard (``release_fork``, ``drop``); every
    #: other kind is refused there (`apply`: `NoShard`).
    on_dropped: ClassVar[bool] = False

    id: str
    at_ms: int | None = None
    metrics: dict[str, Any] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"commit kind {cls.__name__} declares no kind name")
        known = KINDS.get(kind)
        if known is not None and (known.__module__, known.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise TypeError(f"commit kind {kind!r} is declared twice ({known.__name__})")
        KINDS[kind] = cls

    # --- what each kind defines --------------------------------------------------------

    def args_json(self) -> dict[str, Any]:
        """The stored arguments (``args``, without ``metrics``). By default each field of
        the kind under its name; a kind with fields other than `int` and `str` says how."""
        return {name: getattr(self, name) for name, _ in self._arg_fields()}

    @classmethod
    def fields_from_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        """The fields of this kind from its stored ``args``; raises `KeyError`, `TypeError`
        or `ValueError` for arguments that are not this kind's. By default the inverse of
        the default `args_json`, checking each value's type."""
        return {name: _read(kind, cls.kind, name, args[name]) for name, kind in cls._arg_fields()}

    @classmethod
    def _arg_fields(cls) -> list[tuple[str, str]]:
        """The kind's own fields (name, annotation), in declaration order."""
        own = [(f.name, str(f.type)) for f in fields(cls) if f.name not in _ENVELOPE]
        simple = [name for name, kind in own if kind not in _SIMPLE]
        if simple:
            raise TypeError(f"commit kind {cls.kind!r} must store its fields {simple} itself")
        return own

    @abstractmethod
    def apply(self, state: ShardState, location: str | None) -> ShardState:
        """This kind's transition of ``state`` (the version and the effects every commit has
        are `apply`'s, below); raises if a precondition fails."""

    @abstractmethod
    def summary(self) -> str:
        """One line for `Shard.history` saying what the commit did."""

    def history_kind(self) -> str:
        """What `Shard.history` calls the commit (``HISTORY_KINDS``): its kind by default."""
        return self.kind

    def added_parts(self) -> tuple[PartRef, ...]:
        """The parts the commit adds to the state (appends and compactions)."""
        return ()

    def leased_writes(self) -> set[str]:
        """The writes whose lease must be live when the commit lands
        (`persistshard.core.statemachine.leases.check_commit`): those of the parts it adds
        (a part another shard owns, `PartRef.source`, is no write of this shard's)."""
        own = (p for p in self.added_parts() if p.source is None)
        return {w for w in (part_write_id(p.key) for p in own) if w is not None}

    def check_step(self, old: ShardState, new: ShardState) -> str | None:
        """What is wrong with the step ``old -> new`` for this kind beyond the checks of
        every commit (`check_transition`), or None."""
        return None

    # --- shared ------------------------------------------------------------------------

    def now(self) -> int:
        """The commit's time; `CorruptData` for a kind that needs one and has none."""
        if self.at_ms is None:
            raise CorruptData(f"commit {self.id} ({self.kind}) has no commit time")
        return self.at_ms

    def to_json(self) -> dict[str, Any]:
        args = self.args_json()
        if self.metrics is not None:
            args["metrics"] = self.metrics
        out: dict[str, Any] = {"kind": self.kind, "id": self.id, "args": args}
        if self.at_ms is not None:
            out["at_ms"] = self.at_ms
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> Commit:
        """The commit stored as ``d``; `ValueError`, `KeyError` or `TypeError` if it is not
        one (an unknown kind, arguments that are not the kind's)."""
        cls = KINDS.get(d["kind"])
        if cls is None:
            raise ValueError(f"unknown commit kind {d['kind']!r}")
        args = d["args"]
        if not isinstance(args, dict):
            raise ValueError(f"commit arguments {args!r} are not an object")
        args = dict(args)
        metrics = args.pop("metrics", None)
        return cls(id=d["id"], at_ms=d.get("at_ms"), metrics=metrics, **cls.fields_from_args(args))


#: The envelope's fields, stored outside a kind's arguments.
_ENVELOPE = frozenset({"id", "at_ms", "metrics"})
#: The field types the default (de)serialisation handles.
_SIMPLE = {"int": int, "str": str}


def _read(kind: str, commit_kind: str, name: str, value: object) -> object:
    """``value`` as a stored argument ``name`` of type ``kind`` (`_SIMPLE`), or `TypeError`."""
    if isinstance(value, _SIMPLE[kind]) and not isinstance(value, bool):
        return value
    raise TypeError(f"{commit_kind} argument {name} is {value!r}, not {kind}")


def apply(state: ShardState, commit: Commit, location: str | None = None) -> ShardState:
    """The state after ``commit``: a pure function; raises if a precondition fails.

    The kind's transition (`Commit.apply`), then what every commit does: with a time, drop
    the holds and explicit write leases that had run out by then and prune writer records
    when due; the result has ``version = state.version + 1`` and ``last_commit = commit.id``.
    A dropped shard (``state.dropped``) takes only the kinds that say so
    (`Commit.on_dropped`); any other is `NoShard`, nothing applied.
    """
    if state.dropped and not commit.on_dropped:
        raise NoShard(
            f"commit {commit.id} ({commit.kind}) refused: the shard was dropped "
            "(persistshard drop); nothing was applied",
            location=location,
        )
    new = commit.apply(state, location)
    if commit.at_ms is not None:
        now = commit.at_ms
        if any(not h.live_at(now) for h in new.holds.values()):
            new = replace(new, holds=new.live_holds(now))
        if any(e <= now for e in new.leases.values()):
            new = replace(new, leases={w: e for w, e in new.leases.items() if e > now})
        if prune_due(new):
            new = prune_writers(new, now)
    return replace(new, version=state.version + 1, last_commit=commit.id)
