"""Trace compaction planning: which consecutive batches merge, into what level, at what since.

A plan is a pure function of one state version; executing it
(`persistshard.core.maintenance.compact`) writes an output batch, and committing it is an ordinary
``compact`` commit that applies only if every input is still in the state. This module decides
*what* to merge; it reads no data.

The trace is a list of batches over consecutive time intervals, oldest first, each with a
compaction level. Three kinds of merge, in the order a full compaction tries them:

``unsealed``
    Unsealed batches that the upper has (partly) passed hand their updates below the upper to
    the trace batches that cover those times: one merge takes the covering trace batches and
    the unsealed batches, writes one trace batch over the same interval, and replaces each
    unsealed batch by its remainder at or after the upper (rewritten only if it straddles the
    upper; dropped if nothing remains). Unsealed batches whose covering trace ranges overlap
    are grouped into one merge; groups touch disjoint trace ranges. The output keeps the level
    of its oldest trace input.
``level``
    A tiered Spine rule: appended batches enter at level 0; consecutive batches at the same
    level L merge into one at L + 1 if the result holds more updates than each input, else at
    L. How many merge at once depends on their size: ``FAN_IN`` small ones, or
    ``WIDE_FAN_IN`` when each holds at least ``wide_rows`` updates (the knob
    ``compact_wide_rows``). The oldest such
    group goes first; a level with fewer batches waits. Every update is rewritten at most once
    per level, and a level only fills up by a factor of its fan-in, so with uniformly sized
    appends each update is rewritten O(log N) times over N appends, and the trace holds at
    most ``FAN_IN - 1`` batches per level of small batches and ``WIDE_FAN_IN - 1`` per level of
    wide ones. (With a fan-in of 2 this is the binary Spine.) The two fan-ins answer the two
    costs: a merge has a fixed cost (a part written and synced, a compare-and-set) that
    dominates when its inputs are small, so small batches merge eight at a time; a read pays
    per batch (a footer, a chunk decoded whole, too small to decode in parallel well), so
    batches big enough for the merge's work per row to dominate merge four at a time,
    leaving fewer of them per read for about one more rewrite of each update. When merges
    consolidate heavily (since close behind upper) a batch can stay at its level while
    absorbing small ones; that is the rule's known weakness, and it is bounded by the
    ``max_merges`` budget of writer-triggered compaction.
``full``
    What an idle Spine converges to: the whole trace merged into one sorted, consolidated run
    with every time below ``since`` forwarded, so a row updated many times before ``since``
    costs one update, storage is that of one compacted snapshot, and a read sorts one run.
    Costs the size of the shard, so only an explicit `Shard.compact` (``full=True``) does it,
    and only when it changes something: more than one batch, a batch of several runs, or
    times still to forward. Writers never trigger it.

Time forwarding: an output over ``[lower, upper)`` planned at since ``s`` has every time
``t < f`` replaced by ``f = min(s, upper - 1)`` (the output's ``since`` field records ``f``).
Every stored time stays inside the batch's interval, and a read at ``as_of >= s`` (the only
valid ones) sees the same sums: forwarded times are all ``<= s <= as_of``, and readers
forward the stored times to ``s`` themselves, so ``max(max(t, f), s) = max(t, s)``.

Invariants kept (relied on by `ShardState.check` and by `AssertLevelsOrdered`):
- Levels are non-increasing from oldest to newest. A ``level`` merge of the oldest group at L
  has only levels > L before it; its output is at most L + 1. An output is also clamped to
  its predecessor's level at commit time (`commit_level`), so independent merges committed
  oldest first (the distributed path) keep the order; a race that would still break it is
  refused by `AssertLevelsOrdered` and the merge is discarded.
- Plans returned together (`independent_plans`) touch disjoint batches, so they can run in
  parallel and each commits or conflicts on its own.
- A compaction output is one sorted run, even when cut into several parts (key ranges in
  order); its id ends with `RUN_SUFFIX` so that a later full compaction leaves it alone.
Assumes: a batch's parts are each sorted by (row, time) and consolidated (parts of one batch
may overlap each other, except in compaction outputs), unsealed batches' ``lower``/``upper``
bound their updates' times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from persistshard.core.config import DEFAULTS
from persistshard.core.statemachine.state import Batch, PartRef, ShardState

Reason = Literal["unsealed", "level", "full"]

#: How many consecutive batches of one level a ``level`` merge takes (see the module docstring).
#: Fixed, with ``WIDE_FAN_IN``: they are the shape of the levels (a counter in base 8, then 4)
#: that the amortized bound and README's numbers follow; what decides which applies is the
#: knob ``compact_wide_rows`` (`persistshard.core.config.ShardConfig`).
FAN_IN = 8
#: How many it takes when each holds at least ``compact_wide_rows`` updates (default 4,096: a
#: 4-way merge of them writes at least 16,384 updates, enough for its work per row to
#: outweigh its fixed cost).
WIDE_FAN_IN = 4

#: Ids of batches whose parts form one sorted run (compaction outputs) end with this.
RUN_SUFFIX = "-run"


def is_one_run(batch: Batch) -> bool:
    """Whether ``batch``'s parts form a single sorted run (trivially so with one part)."""
    return len(batch.parts) <= 1 or batch.id.endswith(RUN_SUFFIX)


@dataclass(frozen=True)
class MergePlan:
    """One merge: consecutive trace ``inputs`` (oldest first), optionally with ``unsealed``
    batches whose updates at times ``< upper_at_plan`` join the output."""

    reason: Reason
    inputs: tuple[Batch, ...]
    since: int
    upper_at_plan: int
    unsealed: tuple[Batch, ...] = ()

    @property
    def lower(self) -> int:
        return self.inputs[0].lower

    @property
    def upper(self) -> int:
        return self.inputs[-1].upper

    @property
    def floor(self) -> int:
        """The time every earlier time of the output is forwarded to."""
        return max(0, min(self.since, self.upper - 1))

    @property
    def input_ids(self) -> list[str]:
        return [b.id for b in self.inputs]

    @property
    def input_rows(self) -> int:
        return sum(b.num_rows for b in (*self.inputs, *self.unsealed))

    @property
    def input_bytes(self) -> int:
        return sum(b.size_bytes for b in (*self.inputs, *self.unsealed))

    def natural_level(self, rows_out: int) -> int:
        """The output's level by the rules of the module docstring (before clamping)."""
        base = self.inputs[0].level
        if self.reason == "unsealed":
            return base
        grew = all(rows_out > b.num_rows for b in self.inputs)
        return base + 1 if grew and len(self.inputs) > 1 else base

    def reusable_parts(self) -> tuple[PartRef, ...] | None:
        """The output's parts if no data needs rewriting (a free merge), else None.

        Free when there are no unsealed inputs and at most one input holds data, none of
        whose times needs forwarding (and, for a full merge, which is one run): the output is
        that input's parts under a wider interval.
        """
        if self.unsealed:
            return None
        with_data = [b for b in self.inputs if b.parts]
        if not with_data:
            return ()
        if len(with_data) != 1 or any(p.min_time < self.floor for p in with_data[0].parts):
            return None
        if self.reason == "full" and not is_one_run(with_data[0]):
            return None  # a full compaction must leave one run
        return with_data[0].parts

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "inputs": [b.to_json() for b in self.inputs],
            "since": self.since,
            "upper_at_plan": self.upper_at_plan,
            "unsealed": [b.to_json() for b in self.unsealed],
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> MergePlan:
        return MergePlan(
            reason=d["reason"],
            inputs=tuple(Batch.from_json(b) for b in d["inputs"]),
            since=d["since"],
            upper_at_plan=d["upper_at_plan"],
            unsealed=tuple(Batch.from_json(b) for b in d["unsealed"]),
        )


def levels(state: ShardState) -> list[int]:
    """The trace's levels, oldest first."""
    return [b.level for b in state.trace]


def _plan(
    state: ShardState, reason: Reason, batches: list[Batch], unsealed: list[Batch]
) -> MergePlan:
    return MergePlan(
        reason=reason,
        inputs=tuple(batches),
        since=state.since,
        upper_at_plan=state.upper,
        unsealed=tuple(unsealed),
    )


def unsealed_plans(state: ShardState) -> list[MergePlan]:
    """Merges moving unsealed updates the upper has passed into the trace (disjoint groups)."""
    visible = [u for u in state.unsealed if u.lower < state.upper]
    if not visible or not state.trace:
        return []
    ranges: list[tuple[int, int, list[Batch]]] = []
    for u in sorted(visible, key=lambda b: b.lower):
        hi_time = min(u.upper, state.upper)  # exclusive
        first = next(i for i, b in enumerate(state.trace) if b.upper > u.lower)
        last = max(i for i, b in enumerate(state.trace) if b.lower < hi_time)
        if ranges and first <= ranges[-1][1]:
            lo, hi, group = ranges[-1]
            ranges[-1] = (lo, max(hi, last), [*group, u])
        else:
            ranges.append((first, last, [u]))
    return [_plan(state, "unsealed", list(state.trace[lo : hi + 1]), g) for lo, hi, g in ranges]


def fan_in(batches: Sequence[Batch], start: int = 0, *, wide_rows: int | None = None) -> int:
    """How many consecutive same-level batches from ``batches[start]`` on merge at once:
    ``WIDE_FAN_IN`` when the first that many each hold at least ``wide_rows`` updates (None:
    the default of the knob ``compact_wide_rows``), else ``FAN_IN``."""
    floor = DEFAULTS.compact_wide_rows if wide_rows is None else wide_rows
    head = batches[start : start + WIDE_FAN_IN]
    wide = len(head) == WIDE_FAN_IN and all(b.num_rows >= floor for b in head)
    return WIDE_FAN_IN if wide else FAN_IN


def level_plans(state: ShardState, *, wide_rows: int | None = None) -> list[MergePlan]:
    """Groups of `fan_in` consecutive same-level batches, oldest first, disjoint."""
    out = []
    i = 0
    trace = state.trace
    while i < len(trace):
        f = fan_in(trace, i, wide_rows=wide_rows)
        group = trace[i : i + f]
        if len(group) == f and all(b.level == group[0].level for b in group):
            out.append(_plan(state, "level", list(group), []))
            i += len(group)
        else:
            i += 1
    return out


def full_plan(state: ShardState) -> MergePlan | None:
    """Merge the whole trace into one run, if that changes anything (see ``full`` above)."""
    if not state.trace:
        return None
    plan = _plan(state, "full", list(state.trace), [])
    if len(state.trace) > 1:
        return plan
    (only,) = state.trace
    if not is_one_run(only) or any(p.min_time < plan.floor for p in only.parts):
        return plan
    return None


def next_plan(
    state: ShardState, *, full: bool = True, wide_rows: int | None = None
) -> MergePlan | None:
    """The next merge a sequential compactor should run, or None when the trace is tidy.

    Order: unsealed absorption, then the oldest same-level group, then (``full`` only) the
    merge of the whole trace into one run.
    """
    for plans in (unsealed_plans(state), level_plans(state, wide_rows=wide_rows)):
        if plans:
            return plans[0]
    return full_plan(state) if full else None


def independent_plans(
    state: ShardState, *, full: bool = True, wide_rows: int | None = None
) -> list[MergePlan]:
    """Merges that touch disjoint batches and may run in parallel: all unsealed groups if there
    are any, else every disjoint same-level group, else (``full``) the whole-trace merge.
    ``wide_rows``: as in `fan_in`."""
    for plans in (unsealed_plans(state), level_plans(state, wide_rows=wide_rows)):
        if plans:
            return plans
    plan = full_plan(state) if full else None
    return [plan] if plan is not None else []


def commit_level(plan: MergePlan, rows_out: int, state: ShardState) -> int:
    """The output's level for a commit against ``state``: the natural level, lowered to the
    level of the batch now preceding the inputs (other merges may have committed meanwhile)."""
    level = plan.natural_level(rows_out)
    ids = [b.id for b in state.trace]
    first = plan.inputs[0].id
    if first in ids:
        pos = ids.index(first)
        if pos > 0:
            level = min(level, state.trace[pos - 1].level)
    return level
