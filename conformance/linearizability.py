"""A linearizability checker for histories of one shard (Wing & Gong's search, with Lowe's
and Porcupine's memoisation), and the sequential model it checks against.

A history is a list of `Op`: each was invoked by one process at a monotonic time ``call`` and
returned at ``ret`` (times from one clock, e.g. ``time.monotonic()`` on one machine). Kinds:

- ``read``: observed the shard's ``upper`` and its contents at ``upper - 1``, as the multiset
  of rows (``rows``, any order) or as `rows_digest` of them (``digest``);
- ``cas``: a compare-and-append of ``rows`` expecting the upper ``expected`` and moving it to
  ``new_upper``;
- ``append``: a plain append of ``rows`` at whatever the upper is (it moves the upper by 1).

Outcomes of ``cas``/``append``: ``ok`` (acknowledged), ``refused`` (``UpperMismatch``: the
upper was not ``expected`` when it took effect, and nothing changed), ``unknown`` (it may have
taken effect at any time after ``call``, or never: an `Indeterminate`, a lost response, a
process killed in the middle; ``ret`` is ignored), ``failed`` (certainly not applied: its rows
must never be seen; it is left out of the search). A read that failed, or whose process died,
observed nothing and should be left out by the recorder.

The sequential model (`ShardModel`) is the shard reduced to what these operations see: the
upper and the multiset of rows. A history is linearizable iff there is a total order of the
operations that took effect, each placed between its call and its return (open-ended for
``unknown``), in which every ``ok``/``refused``/``read`` result is what the model answers.

The search (`check`) walks the history's call/return events as a doubly linked list, tries to
linearize a pending call next, backtracks at a return whose call was not linearized yet, and
memoises (set of linearized ops as a bitset, model state): a configuration already explored is
never explored again (Lowe 2017; Porcupine). An ``unknown`` op has no return event: it is
linearized only where it applies (expected upper met); never linearizing it is its "did not
take effect". Cost: exponential only in the number of operations open at once; histories of a
few hundred operations from a handful of processes take milliseconds to a second.

`minimal_excerpt` shrinks a failing history for the report: it drops reads and refused
appends one at a time while the rest stays non-linearizable (removing an observation cannot
make a legal history illegal, so what is left is still a proof), then `format_ops` prints it.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["read", "cas", "append"]
Outcome = Literal["ok", "refused", "unknown", "failed"]
Row = Hashable

#: Model state: (upper, rows as a tuple sorted by `_row_key`).
State = tuple[int, tuple[Row, ...]]


def _row_key(row: Row) -> str:
    return repr(row)


def rows_digest(rows: Iterable[Row]) -> str:
    """The digest a read may record instead of its rows: order-independent, multiset-exact."""
    h = hashlib.sha256()
    for key in sorted(_row_key(r) for r in rows):
        h.update(key.encode())
        h.update(b"\n")
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Op:
    """One operation of a history (see the module docstring). ``ret`` is None for an op that
    never returned (its process died); such an op must be ``unknown`` (or a read, left out)."""

    process: str
    kind: Kind
    call: float
    ret: float | None
    outcome: Outcome = "ok"
    expected: int = 0
    new_upper: int = 0
    rows: tuple[Row, ...] = ()
    upper: int = 0
    digest: str | None = None
    note: str = ""

    def describe(self) -> str:
        ret = "never" if self.ret is None else f"{self.ret:.6f}"
        span = f"[{self.call:.6f} .. {ret}]"
        if self.kind == "read":
            seen = self.digest if self.digest is not None else _show_rows(self.rows)
            what = f"read -> upper {self.upper}, rows {seen}"
        elif self.kind == "cas":
            what = (
                f"cas {self.expected}->{self.new_upper} rows {_show_rows(self.rows)}: "
                f"{self.outcome}"
            )
        else:
            what = f"append rows {_show_rows(self.rows)}: {self.outcome}"
        note = f" ({self.note})" if self.note else ""
        return f"{span} {self.process}: {what}{note}"


def _show_rows(rows: Sequence[Row], limit: int = 12) -> str:
    shown = sorted(rows, key=_row_key)
    text = ", ".join(repr(r) for r in shown[:limit])
    more = f", ... {len(shown) - limit} more" if len(shown) > limit else ""
    return "{" + text + more + "}"


class ShardModel:
    """The sequential shard: ``step`` gives the state after an op, or None if the op's
    recorded result is impossible in that state. Deterministic: one successor at most."""

    initial: State = (0, ())

    @staticmethod
    def _add(rows: tuple[Row, ...], new: tuple[Row, ...]) -> tuple[Row, ...]:
        return tuple(sorted(rows + new, key=_row_key)) if new else rows

    def step(self, state: State, op: Op) -> State | None:
        upper, rows = state
        if op.kind == "read":
            if op.upper != upper:
                return None
            if op.digest is not None:
                return state if rows_digest(rows) == op.digest else None
            return state if tuple(sorted(op.rows, key=_row_key)) == rows else None
        if op.kind == "append":  # lands at whatever the upper is
            return (upper + 1, self._add(rows, op.rows))
        fits = upper == op.expected
        if op.outcome == "refused":
            return None if fits else state
        # ok, or unknown linearized where it takes effect
        return (op.new_upper, self._add(rows, op.rows)) if fits else None


@dataclass
class CheckResult:
    """``ok``: a linearization exists (``order``: the ops in that order, as indexes into the
    history given). Otherwise ``stuck``: the index of the op that could not be linearized at
    the deepest point the search reached, ``prefix`` the ops linearized there (in order) and
    ``state`` the model state after them."""

    ok: bool
    order: list[int] = field(default_factory=list)
    stuck: int | None = None
    prefix: list[int] = field(default_factory=list)
    state: State | None = None
    explored: int = 0
    seconds: float = 0.0

    def explain(self, ops: Sequence[Op]) -> str:
        if self.ok:
            return f"linearizable ({len(self.order)} ops took effect)"
        lines = ["not linearizable"]
        if self.state is not None:
            upper, rows = self.state
            lines.append(
                f"after {len(self.prefix)} ops the model is at upper {upper} with rows "
                f"{_show_rows(rows)}; no pending op can go next"
            )
        if self.stuck is not None:
            lines.append(f"cannot be linearized: {ops[self.stuck].describe()}")
        if self.prefix:
            lines.append("last linearized ops:")
            lines += ["  " + ops[i].describe() for i in self.prefix[-5:]]
        return "\n".join(lines)


class _Events:
    """The doubly linked list of call/return events (index 0 is the head sentinel)."""

    def __init__(self, ops: Sequence[Op], included: list[int]) -> None:
        raw: list[tuple[float, int, int]] = []  # (time, 0 call / 1 return, op)
        for i in included:
            op = ops[i]
            raw.append((op.call, 0, i))
            if op.outcome != "unknown" and op.ret is not None:
                raw.append((op.ret, 1, i))
        # At equal times calls come first: ops that touch at an instant are concurrent.
        raw.sort()
        n = len(raw) + 1
        self.is_call = [False] + [kind == 0 for _, kind, _ in raw]
        self.op = [-1] + [i for _, _, i in raw]
        self.next = [*range(1, n), -1]
        self.prev = [-1, *range(n - 1)]
        self.ret_of: dict[int, int] = {}
        for e in range(1, n):
            if not self.is_call[e]:
                self.ret_of[self.op[e]] = e
        self.returns_left = len(self.ret_of)

    def _unlink(self, e: int) -> None:
        p, q = self.prev[e], self.next[e]
        self.next[p] = q
        if q != -1:
            self.prev[q] = p

    def _relink(self, e: int) -> None:
        p, q = self.prev[e], self.next[e]
        self.next[p] = e
        if q != -1:
            self.prev[q] = e

    def lift(self, call: int) -> None:
        self._unlink(call)
        r = self.ret_of.get(self.op[call])
        if r is not None:
            self._unlink(r)
            self.returns_left -= 1

    def unlift(self, call: int) -> None:
        r = self.ret_of.get(self.op[call])
        if r is not None:
            self._relink(r)
            self.returns_left += 1
        self._relink(call)


def _validate(ops: Sequence[Op]) -> None:
    for op in ops:
        if op.kind not in ("read", "cas", "append"):
            raise ValueError(f"unknown op kind {op.kind!r}")
        if op.outcome not in ("ok", "refused", "unknown", "failed"):
            raise ValueError(f"unknown outcome {op.outcome!r}")
        if op.kind == "read" and op.outcome != "ok":
            raise ValueError(f"a read with outcome {op.outcome!r}: leave failed reads out")
        if op.kind == "append" and op.outcome == "refused":
            raise ValueError("a plain append cannot be refused")
        if op.ret is None and op.outcome != "unknown":
            raise ValueError(f"an op that never returned must be unknown: {op.describe()}")
        if op.ret is not None and op.ret < op.call:
            raise ValueError(f"an op returned before it was called: {op.describe()}")


def check(
    ops: Sequence[Op], model: ShardModel | None = None, *, max_seconds: float = 60.0
) -> CheckResult:
    """Is ``ops`` linearizable against ``model`` (default `ShardModel`)? See the module
    docstring. Raises TimeoutError past ``max_seconds`` (a search that large is a history
    too large for the test, not an answer)."""
    _validate(ops)
    model = model or ShardModel()
    started = time.monotonic()
    included = [i for i, op in enumerate(ops) if op.outcome != "failed"]
    events = _Events(ops, included)
    state: State = model.initial
    linearized = 0
    seen: set[tuple[int, State]] = set()
    stack: list[tuple[int, State]] = []
    best = CheckResult(ok=False, state=state)
    entry = events.next[0]
    explored = 0
    while events.returns_left > 0:
        explored += 1
        if explored & 0xFFF == 0 and time.monotonic() - started > max_seconds:
            raise TimeoutError(f"linearizability search over {len(ops)} ops passed {max_seconds}s")
        if events.is_call[entry]:
            i = events.op[entry]
            new = model.step(state, ops[i])
            if new is not None:
                key = (linearized | (1 << i), new)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry, state))
                    state = new
                    linearized |= 1 << i
                    events.lift(entry)
                    entry = events.next[0]
                    continue
            entry = events.next[entry]
            continue
        # A return whose op is not linearized: backtrack.
        if best.stuck is None or len(stack) > len(best.prefix):
            best = CheckResult(
                ok=False,
                stuck=events.op[entry],
                prefix=[events.op[e] for e, _ in stack],
                state=state,
            )
        if not stack:
            best.explored = explored
            best.seconds = time.monotonic() - started
            return best
        top, state = stack.pop()
        linearized &= ~(1 << events.op[top])
        events.unlift(top)
        entry = events.next[top]
    return CheckResult(
        ok=True,
        order=[events.op[e] for e, _ in stack],
        explored=explored,
        seconds=time.monotonic() - started,
    )


def minimal_excerpt(ops: Sequence[Op], *, budget_seconds: float = 10.0) -> list[Op]:
    """A smaller non-linearizable history inside ``ops`` (which must not be linearizable):
    reads and refused appends are dropped one at a time while the rest stays illegal (an
    observation fewer cannot turn a legal history illegal, so the excerpt is still a proof);
    ops are returned in call order. Stops shrinking after ``budget_seconds``."""
    current = sorted(ops, key=lambda o: o.call)
    if check(current).ok:
        raise ValueError("the history is linearizable: nothing to excerpt")
    deadline = time.monotonic() + budget_seconds
    i = len(current) - 1
    while i >= 0 and time.monotonic() < deadline:
        op = current[i]
        if op.kind == "read" or op.outcome in ("refused", "failed"):
            trial = current[:i] + current[i + 1 :]
            if not check(trial).ok:
                current = trial
        i -= 1
    return current


def format_ops(ops: Sequence[Op], limit: int = 40) -> str:
    """One line per op in call order (at most ``limit``, around the middle elided)."""
    ordered = sorted(ops, key=lambda o: o.call)
    lines = [op.describe() for op in ordered]
    if len(lines) > limit:
        half = limit // 2
        lines = [*lines[:half], f"... {len(lines) - limit} ops elided ...", *lines[-half:]]
    return "\n".join(lines)


def report(ops: Sequence[Op], result: CheckResult | None = None) -> str:
    """What a failing check prints: the explanation and the minimal excerpt."""
    result = result or check(ops)
    if result.ok:
        return result.explain(ops)
    excerpt = minimal_excerpt(ops)
    shrunk = check(excerpt)
    return (
        f"{result.explain(ops)}\n"
        f"minimal excerpt ({len(excerpt)} of {len(ops)} ops, still not linearizable):\n"
        f"{format_ops(excerpt)}\n{shrunk.explain(excerpt)}"
    )


def acknowledged_exactly_once(ops: Sequence[Op], final_rows: Iterable[Row]) -> list[str]:
    """Problems with a final read's rows: an acknowledged append's row missing or doubled, an
    unknown one's row more than once, a failed or refused one's row present, or a row nobody
    appended. Empty when the final rows are right."""
    seen = Counter(final_rows)
    problems: list[str] = []
    origin: dict[Row, Op] = {}
    for op in ops:
        if op.kind == "read":
            continue
        for row in op.rows:
            origin[row] = op
            n = seen.get(row, 0)
            if op.outcome == "ok" and n != 1:
                problems.append(f"acknowledged row {row!r} is there {n} times: {op.describe()}")
            elif op.outcome == "unknown" and n > 1:
                problems.append(f"row {row!r} of an unknown op is there {n} times")
            elif op.outcome in ("refused", "failed") and n:
                problems.append(f"row {row!r} of a {op.outcome} op is there: {op.describe()}")
    for row in seen:
        if row not in origin:
            problems.append(f"row {row!r} was never appended")
    return problems
