"""Record a history of concurrent processes on one shard under faults, for the
linearizability checker (`persistshard.conformance.linearizability`).

`record` starts ``workers`` processes on one shard (`Target`: a location, its storage options
and optionally a database consensus URL). Each does a seeded random sequence of operations:
reads (the upper and the rows at ``upper - 1``), compare-and-appends of one unique row with an
expected upper that is often stale, and plain appends. Every call and return is appended to a
per-process event file (one JSON line each, written with ``os.write``: a process killed with
SIGKILL loses no line it wrote) with a ``time.monotonic()`` stamp, which on Linux is one clock
for every process of the machine.

The faults (`FaultPlan`, built from a list of names by `fault_plan`, so callers choose them):
- ``kill``: the parent SIGKILLs a random worker at a random moment inside one of its writes
  (it waits up to a second for the worker's event file to end with a write's call, then
  signals within 20 ms: a kill between operations, during a read, which observes nothing
  once killed, or while a process still starts would open nothing) and starts a
  replacement; the killed write is open-ended ("unknown");
- ``pause``: the parent SIGSTOPs a worker for up to 0.4 s (a long GC pause, a stalled VM);
- ``gc``: a process runs gc at retention 0 in a loop beside the workers (it is killed and
  paused like them);
- ``skew``: every process's shard clock is off by up to `SKEW_SECONDS` either way and jumps
  now and then (`SkewedClock`);
- any other name is a mode of `persistshard.conformance.faults.FaultyBlob` around each
  worker's blob (``fail_before``, ``fail_after``: applied but reported failed, ``stall``: a
  pause inside a storage call, and whatever modes it gains), at a small probability; on a
  database consensus ``fail_before``/``fail_after`` also wrap the consensus (`FaultyConsensus`:
  a compare-and-set applied whose response is lost).

`Recording` holds the history as `Op` lists, what went wrong outside the model (errors of a
type the contract forbids, e.g. `CorruptData`), the final rows read without faults, and
`Recording.problems` / `Recording.assert_ok` check everything and say which seed and which
minimal excerpt of the history fail.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from persistshard.conformance.faults import FaultyBlob
from persistshard.conformance.linearizability import (
    CheckResult,
    Op,
    Outcome,
    acknowledged_exactly_once,
    check,
    report,
)
from persistshard.core.storage.blob import Blob, open_blob
from persistshard.core.storage.consensus import Consensus, VersionedData

log = logging.getLogger("persistshard.conformance.recorder")

#: Faults the parent process injects itself; every other name is a FaultyBlob mode.
PROCESS_FAULTS = frozenset({"kill", "pause", "gc", "skew"})
#: How far the ``skew`` fault sets a process's clock off: past the default write lease and
#: retention (an hour each), so a clock behind or ahead decides what gc may delete.
SKEW_SECONDS = 7200.0
#: Per storage call, how likely each FaultyBlob mode is.
BLOB_FAULT_PROBABILITY = {"fail_before": 0.02, "fail_after": 0.03, "stall": 0.03}
OTHER_BLOB_FAULT_PROBABILITY = 0.03
#: FaultyBlob modes a correct library survives that a run takes whenever FaultyBlob has them
#: (lost responses, requests delivered twice). A store that ignores the condition of a create
#: is not among them: it must be refused (`StorageUnsupported`), not survived.
LOST_RESPONSE_MODES = ("fail_after", "lose_response", "retry_after_lost", "duplicate")


def faulty_blob_modes() -> frozenset[str]:
    """The probability keywords `FaultyBlob` takes (its fault modes)."""
    params = inspect.signature(FaultyBlob.__init__).parameters
    skip = {"self", "inner", "seed", "operations", "on_stall"}
    return frozenset(n for n, p in params.items() if n not in skip and isinstance(p.default, float))


#: The faults a run has unless told otherwise: the process faults, failures before a storage
#: call, stalls, and every lost-response mode this FaultyBlob has.
DEFAULT_FAULTS: tuple[str, ...] = (
    "kill",
    "pause",
    "gc",
    "skew",
    "fail_before",
    "stall",
    *(m for m in LOST_RESPONSE_MODES if m in faulty_blob_modes()),
)


@dataclass(frozen=True)
class FaultPlan:
    """What to inject (module docstring). ``kills``/``pauses`` are rates per second of the
    parent's fault loop; ``blob`` the FaultyBlob keywords; ``consensus`` the `FaultyConsensus`
    keywords (used on a database consensus)."""

    kills: float = 0.0
    pauses: float = 0.0
    gc: bool = False
    #: Each process's clock is off by up to this many seconds, either way, and jumps.
    skew_seconds: float = 0.0
    blob: Mapping[str, float] = field(default_factory=dict)
    consensus: Mapping[str, float] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        process = (
            ("kill", self.kills),
            ("pause", self.pauses),
            ("gc", self.gc),
            ("skew", self.skew_seconds),
        )
        out = [n for n, on in process if on]
        return out + sorted(self.blob)


def fault_plan(
    names: Iterable[str] = DEFAULT_FAULTS,
    *,
    kills: float = 2.0,
    probability: float | None = None,
) -> FaultPlan:
    """The plan for fault ``names`` (see the module docstring); a name that is neither a
    process fault nor a `FaultyBlob` mode is a ValueError. ``probability``: of every storage
    fault per call (default: `BLOB_FAULT_PROBABILITY`, else `OTHER_BLOB_FAULT_PROBABILITY`)."""
    names = list(names)
    modes = faulty_blob_modes()
    unknown = [n for n in names if n not in PROCESS_FAULTS and n not in modes]
    if unknown:
        raise ValueError(f"unknown faults {unknown}: known {sorted(PROCESS_FAULTS | modes)}")
    blob = {
        n: probability
        if probability is not None
        else BLOB_FAULT_PROBABILITY.get(n, OTHER_BLOB_FAULT_PROBABILITY)
        for n in names
        if n not in PROCESS_FAULTS
    }
    consensus = {n: p for n, p in blob.items() if n in ("fail_before", "fail_after")}
    return FaultPlan(
        kills=kills if "kill" in names else 0.0,
        pauses=2.0 if "pause" in names else 0.0,
        gc="gc" in names,
        skew_seconds=SKEW_SECONDS if "skew" in names else 0.0,
        blob=blob,
        consensus=consensus,
    )


class FaultyConsensus(Consensus):
    """A consensus whose calls fail at random: before (nothing done) or, for a
    compare-and-set, after it was applied (the response lost: the caller gets
    ``TimeoutError``, an ``OSError``, and must resolve the outcome by reading back). Other
    attributes (``redacted``, ...) are the inner consensus's."""

    def __init__(
        self, inner: Consensus, *, fail_before: float = 0.0, fail_after: float = 0.0, seed: int = 0
    ) -> None:
        self.inner = inner
        self.wrapped = inner  # the log lives in the inner consensus (identity checks)
        self.fail_before = fail_before
        self.fail_after = fail_after
        self.injected = 0
        self._rng = random.Random(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _before(self, op: str) -> None:
        if self._rng.random() < self.fail_before:
            self.injected += 1
            raise TimeoutError(f"injected failure before consensus {op}")

    def entry_name(self, version: int) -> str:
        return self.inner.entry_name(version)

    @property
    def shared(self) -> bool:
        return self.inner.shared

    @property
    def cache_key(self) -> str | None:
        return self.inner.cache_key

    @property
    def certain_lost_races(self) -> bool:
        """The inner's: a lost response here raises (``TimeoutError``), it never turns an
        applied compare-and-set into a False."""
        return self.inner.certain_lost_races

    def head(self) -> VersionedData | None:
        self._before("head")
        return self.inner.head()

    def compare_and_set(self, expected: int | None, data: bytes) -> bool:
        self._before("compare_and_set")
        ok = self.inner.compare_and_set(expected, data)
        if self._rng.random() < self.fail_after:
            self.injected += 1
            raise TimeoutError("injected failure after consensus compare_and_set (applied)")
        return ok

    def scan(self, from_version: int, limit: int | None = None) -> list[VersionedData]:
        self._before("scan")
        return self.inner.scan(from_version, limit)

    def truncate(self, below: int) -> int:
        self._before("truncate")
        return self.inner.truncate(below)

    def oldest_stored(self) -> int | None:
        return self.inner.oldest_stored()


@dataclass(frozen=True)
class Target:
    """The shard under test: ``location`` with ``storage_options``; ``consensus`` a database
    URL, or None for the log next to the data. Picklable (workers build their own handles)."""

    location: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    consensus: str | None = None
    #: Wraps every blob the run opens (a store that misbehaves in a way no fault models);
    #: module-level, so that it pickles.
    wrap: Callable[[Blob], Blob] | None = None

    def blob(self) -> Blob:
        blob = open_blob(self.location, **dict(self.storage_options))
        return self.wrap(blob) if self.wrap is not None else blob

    def shard(self, plan: FaultPlan | None = None, seed: int = 0) -> Any:
        """A shard handle; with ``plan``, over a FaultyBlob (and a FaultyConsensus on a
        database consensus) seeded with ``seed``."""
        from persistshard.core.shard import Shard

        blob = self.blob()
        if plan is not None and plan.blob:
            rng = random.Random(seed ^ 0x5EED)
            modes: dict[str, Any] = dict(plan.blob)  # FaultyBlob's probability keywords
            blob = FaultyBlob(
                blob, seed=seed, on_stall=lambda: time.sleep(rng.uniform(0.02, 0.3)), **modes
            )
        shard = Shard(self.location, blob=blob, consensus=self.consensus)
        if plan is not None and plan.consensus and self.consensus:
            shard._machine.consensus = FaultyConsensus(
                shard._machine.consensus, seed=seed, **dict(plan.consensus)
            )
        return shard

    def __repr__(self) -> str:  # storage options may hold credentials: names only
        return f"Target({self.location!r}, options={sorted(self.storage_options)})"


@dataclass(frozen=True)
class WorkerSpec:
    target: Target
    plan: FaultPlan
    seed: int
    name: str
    events: str
    ops: int


class SkewedClock:
    """This process's shard clock (`persistshard.core.storage.layout.now_ms`, the one clock
    ids, commit times and leases read) set off by a random offset of up to ``seconds`` either
    way; `jump` draws a new offset (a clock stepped by NTP or an operator)."""

    def __init__(self, rng: random.Random, seconds: float) -> None:
        from persistshard.core.storage import layout

        self.rng = rng
        self.seconds = seconds
        self.offset_ms = 0
        real = layout.now_ms
        layout.now_ms = lambda: real() + self.offset_ms
        self.jump()

    def jump(self) -> None:
        self.offset_ms = int(self.rng.uniform(-self.seconds, self.seconds) * 1000)


def _signal(pid: int, signum: int) -> bool:
    """Send ``signum`` to worker ``pid``; False when it has already ended and been reaped
    (a worker can finish between the check that it is alive and the signal)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def _emit(fd: int, event: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


def _rows_of(table: Any) -> list[str]:
    rows: list[str] = []
    for r in table.to_pylist():
        if r["_diff"] < 0:
            raise AssertionError(f"row {r['id']!r} has a negative count {r['_diff']}")
        rows += [r["id"]] * r["_diff"]
    return rows


def read_rows(shard: Any) -> tuple[int, list[str]]:
    """The upper and the rows at ``upper - 1`` (times below an upper never change, so the
    rows read after the state are those of that state)."""
    upper = int(shard.inspect.state().upper)
    if upper == 0:
        return 0, []
    return upper, _rows_of(shard.snapshot(upper - 1))


def _classify(e: BaseException) -> tuple[str, str]:
    """(outcome, note) of an append that raised ``e``."""
    from persistshard import errors

    if isinstance(e, errors.UpperMismatch):
        return "refused", ""
    certain = (
        errors.LeaseExpired,
        errors.CommitDeadline,
        errors.StateConflict,
        errors.StorageError,
        errors.StorageUnsupported,
    )
    if isinstance(e, certain):  # before OSError: a StorageError is one, and certain
        return "failed", type(e).__name__
    if isinstance(e, errors.Indeterminate | OSError):
        return "unknown", type(e).__name__
    return "error", f"{type(e).__name__}: {e}"


def _worker(spec: WorkerSpec) -> None:
    """One worker process: ``spec.ops`` random operations, each logged (module docstring)."""
    import pyarrow as pa

    from persistshard import errors

    logging.getLogger("persistshard").setLevel(logging.CRITICAL)
    rng = random.Random(spec.seed)
    fd = os.open(spec.events, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    clock = SkewedClock(rng, spec.plan.skew_seconds) if spec.plan.skew_seconds else None
    shard = spec.target.shard(spec.plan, spec.seed)
    known = 0
    for n in range(spec.ops):
        if clock is not None and rng.random() < 0.1:
            clock.jump()
        roll = rng.random()
        if roll < 0.35:
            _emit(fd, {"op": n, "e": "call", "t": time.monotonic(), "kind": "read"})
            try:
                upper, rows = read_rows(shard)
                known = max(known, upper)
                ret: dict[str, Any] = {"outcome": "ok", "upper": upper, "rows": rows}
            except errors.CorruptData as e:  # never, even for a read that races gc
                ret = {"outcome": "error", "note": f"{type(e).__name__}: {e}"}
            except (OSError, errors.PersistShardError) as e:  # a typed, retryable failure
                ret = {"outcome": "failed", "note": type(e).__name__}
            except Exception as e:  # recorded: the test says what broke
                ret = {"outcome": "error", "note": f"{type(e).__name__}: {e}"}
            _emit(fd, {"op": n, "e": "ret", "t": time.monotonic(), **ret})
            continue
        row = f"{spec.name}-{n}"
        plain = roll > 0.85
        if not plain and rng.random() < 0.5:
            try:
                known = int(shard.upper)  # not part of the history: only picks `expected`
            except Exception:  # a failure here is seen by the operations, if it matters
                pass
        expected = known if rng.random() < 0.8 else max(0, known - rng.randint(1, 2))
        new_upper = expected + (2 if rng.random() < 0.2 else 1)
        call: dict[str, Any] = {"op": n, "e": "call", "t": 0.0, "rows": [row]}
        if plain:
            call |= {"kind": "append"}
            table = pa.table({"id": [row]})
        else:
            call |= {"kind": "cas", "expected": expected, "new_upper": new_upper}
            table = pa.table({"id": [row], "_time": [expected], "_diff": [1]})
        call["t"] = time.monotonic()
        _emit(fd, call)
        try:
            if plain:
                state = shard.append(table)
                known = max(known, int(state.upper))
            else:
                shard.compare_and_append(table, expected, new_upper)
                known = max(known, new_upper)
            ret = {"outcome": "ok"}
        except errors.UpperMismatch as e:
            known = max(known, int(e.actual))
            ret = {"outcome": "refused"}
        except Exception as e:  # classified, recorded
            outcome, note = _classify(e)
            ret = {"outcome": outcome, "note": note}
        _emit(fd, {"op": n, "e": "ret", "t": time.monotonic(), **ret})
    blob = shard._machine.blob
    inner = getattr(blob, "inner", None)
    injected = getattr(inner, "injected", 0) + getattr(shard._machine.consensus, "injected", 0)
    _emit(fd, {"e": "stats", "injected": injected, "stalls": getattr(inner, "stalls", 0)})
    os.close(fd)


def _gc_loop(target: Target, stop: str, events: str, skew_seconds: float, seed: int) -> None:
    """gc at retention 0 until ``stop`` exists; any error the contract forbids is logged to
    ``events`` (a read or commit that races a deletion must stay correct, so gc's own
    failures other than storage errors and lost races are errors too)."""
    from persistshard import errors

    logging.getLogger("persistshard").setLevel(logging.CRITICAL)
    fd = os.open(events, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    rng = random.Random(seed)
    clock = SkewedClock(rng, skew_seconds) if skew_seconds else None
    shard = target.shard()
    while not os.path.exists(stop):
        if clock is not None and rng.random() < 0.1:
            clock.jump()
        try:
            shard.maintenance.gc(dry_run=False, retention_seconds=0)
            # Counted as it happens: a killed incarnation's runs count too.
            _emit(fd, {"e": "stats", "gc_runs": 1})
        except errors.CorruptData as e:
            _emit(fd, {"e": "error", "t": time.monotonic(), "note": f"gc: {type(e).__name__}: {e}"})
        except (errors.PersistShardError, OSError):
            pass  # typed refusals (no shard yet, a lost race, storage faults): gc runs again
        except Exception as e:  # recorded
            _emit(fd, {"e": "error", "t": time.monotonic(), "note": f"gc: {type(e).__name__}: {e}"})
        time.sleep(0.02)
    os.close(fd)


#: Refusals a run must never see: no process pauses anywhere near the write lease, so a
#: write that lost races until its deadline, or a process whose writes are refused for their
#: leases twice in a row, means a clock or a fence blocked writes. One such refusal is not:
#: with clocks further apart than the lease, a write that races the fence of a gc whose
#: clock (and the newest commit time) runs far ahead is refused once (nothing applied), and
#: the process's next write starts its lease at that fence
#: (`persistshard.core.statemachine.machine.StateMachine.new_write_id`).
BLOCKED = frozenset({"LeaseExpired", "CommitDeadline"})
#: Storage errors no fault injects: escaping an append, they are the library's own (a
#: temporary file deleted under a put), which must be retried or said as `StorageError`.
UNTYPED = frozenset(
    {"FileNotFoundError", "FileExistsError", "PermissionError", "IsADirectoryError"}
)


@dataclass
class Recording:
    """A recorded run: the history, errors outside the model, the final rows (read without
    faults after every process stopped) and what the faults did."""

    seed: int
    target: Target
    plan: FaultPlan
    ops: list[Op]
    errors: list[str]
    final_rows: list[str]
    verified: bool
    kills: int = 0
    pauses: int = 0
    injected: int = 0
    gc_runs: int = 0
    seconds: float = 0.0
    _result: CheckResult | None = None

    @property
    def result(self) -> CheckResult:
        if self._result is None:
            self._result = check(self.ops)
        return self._result

    def count(self, kind: str | None = None, outcome: str | None = None) -> int:
        return sum(
            (kind is None or o.kind == kind) and (outcome is None or o.outcome == outcome)
            for o in self.ops
        )

    def summary(self) -> str:
        return (
            f"seed {self.seed} on {self.target!r}, faults {self.plan.names}: {len(self.ops)} ops "
            f"({self.count('read')} reads, {self.count(outcome='ok') - self.count('read')} "
            f"acknowledged, {self.count(outcome='refused')} refused, "
            f"{self.count(outcome='unknown')} unknown, {self.count(outcome='failed')} failed), "
            f"{self.kills} kills, {self.pauses} pauses, {self.injected} injected storage "
            f"faults, {self.gc_runs} gc runs, {self.seconds:.1f}s"
        )

    def problems(self) -> list[str]:
        """Everything wrong with the run (empty when it kept the contract)."""
        out = list(self.errors)
        if not any(o.process != "final" for o in self.ops):
            out.append("no operation was recorded: the workers did not run")
        refused_before: dict[str, bool] = {}  # the process's previous write: LeaseExpired?
        for op in sorted(self.ops, key=lambda o: o.call):
            expired = op.note == "LeaseExpired"
            if op.kind != "read":
                again, refused_before[op.process] = refused_before.get(op.process), expired
            if op.note in BLOCKED and (not expired or again):
                out.append(f"a write was refused with {op.note} (writes blocked): {op.describe()}")
            elif op.note in UNTYPED:
                out.append(f"a raw {op.note} escaped (not injected): {op.describe()}")
        if not self.verified and not out:
            out.append("the shard does not verify after the run")
        if not any(o.process == "final" for o in self.ops):
            return out  # the final read failed (said above): nothing to compare
        out += acknowledged_exactly_once(self.ops, self.final_rows)
        if not self.result.ok:
            out.append(report(self.ops, self.result))
        return out

    def assert_ok(self) -> None:
        problems = self.problems()
        if problems:
            raise AssertionError(
                f"{self.summary()}\nrerun with this seed; problems:\n" + "\n".join(problems)
            )


def load_history(directory: str) -> tuple[list[Op], list[str], dict[str, int]]:
    """The ops, the errors and the summed stats of every event file in ``directory``."""
    ops: list[Op] = []
    errors: list[str] = []
    stats: dict[str, int] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        process = name[: -len(".jsonl")]
        calls: dict[int, dict[str, Any]] = {}
        rets: dict[int, dict[str, Any]] = {}
        with open(os.path.join(directory, name)) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue  # torn by a kill in the middle of the write
                event = json.loads(line)
                if event["e"] == "call":
                    calls[event["op"]] = event
                elif event["e"] == "ret":
                    rets[event["op"]] = event
                elif event["e"] == "error":
                    errors.append(f"{process}: {event['note']}")
                elif event["e"] == "stats":
                    for k, v in event.items():
                        if k != "e":
                            stats[k] = stats.get(k, 0) + int(v)
        for n, c in calls.items():
            r = rets.get(n)
            raw: str = r["outcome"] if r else "unknown"
            note = r.get("note", "") if r else "never returned (killed)"
            if raw == "error":
                errors.append(f"{process} op {n} ({c['kind']}): {note}")
                raw = "unknown"  # it may or may not have landed: the checker decides
            outcome = cast(Outcome, raw)
            if c["kind"] == "read":
                if r is None or outcome != "ok":
                    continue  # observed nothing
                ops.append(
                    Op(process, "read", c["t"], r["t"], upper=r["upper"], rows=tuple(r["rows"]))
                )
                continue
            ops.append(
                Op(
                    process,
                    c["kind"],
                    c["t"],
                    None if outcome == "unknown" else r["t"] if r else None,
                    outcome,
                    expected=c.get("expected", 0),
                    new_upper=c.get("new_upper", 0),
                    rows=tuple(c["rows"]),
                    note=note,
                )
            )
    counted: dict[str, int] = {}
    for e in errors:  # a gc loop repeats its error each run: say each once, with a count
        counted[e] = counted.get(e, 0) + 1
    errors = [e if n == 1 else f"{e} ({n} times)" for e, n in counted.items()]
    return ops, errors, stats


def record(
    target: Target,
    plan: FaultPlan,
    *,
    seed: int,
    workers: int = 3,
    ops: int = 30,
    max_kills: int = 4,
    timeout: float = 60.0,
    events_dir: str | None = None,
) -> Recording:
    """Run ``workers`` processes of ``ops`` operations each on ``target`` under ``plan`` and
    return the recording (module docstring). At most ``max_kills`` kills; processes still
    running after ``timeout`` seconds are killed (their open operations are unknown)."""
    from persistshard.conformance.storage import process_context

    started = time.monotonic()
    rng = random.Random(seed)
    directory = events_dir or tempfile.mkdtemp(prefix="persistshard-history-")
    ctx = process_context()
    stop = os.path.join(directory, f"stop-{uuid.uuid4().hex}")
    procs: dict[str, Any] = {}
    everyone: list[tuple[str, Any]] = []  # every process started, by name
    killed: set[int] = set()  # ids of the processes this function killed
    problems: list[str] = []
    budget: dict[str, int] = {}
    incarnation: dict[str, int] = {}

    def start(slot: str, n_ops: int) -> None:
        inc = incarnation.get(slot, -1) + 1
        incarnation[slot] = inc
        name = f"{slot}.{inc}"
        events = os.path.join(directory, f"{name}.jsonl")
        if slot == "gc":
            args = (target, stop, events, plan.skew_seconds, seed * 7919 + inc)
            p = ctx.Process(target=_gc_loop, args=args, daemon=True)
        else:
            spec = WorkerSpec(
                target, plan, seed * 7919 + len(procs) * 31 + inc, name, events, n_ops
            )
            p = ctx.Process(target=_worker, args=(spec,), daemon=True)
        p.start()
        procs[slot] = (p, events)
        everyone.append((name, p))
        budget[slot] = n_ops

    def returned(events: str) -> int:
        try:
            with open(events) as f:
                return sum('"e": "ret"' in line for line in f)
        except FileNotFoundError:
            return 0

    def inside_a_write(events: str) -> bool:
        try:
            with open(events, "rb") as f:
                lines = f.read().splitlines()
            last = json.loads(lines[-1]) if lines else {}
        except (FileNotFoundError, ValueError):  # not started, or a line being written
            return False
        return bool(last.get("e") == "call" and last.get("kind") != "read")

    def wait_for_a_write(p: Any, events: str) -> bool:
        give_up = time.monotonic() + 1.0
        while p.is_alive() and time.monotonic() < give_up:
            if inside_a_write(events):
                time.sleep(rng.uniform(0.0, 0.02))
                return True
            time.sleep(0.005)
        return False

    if plan.gc:
        start("gc", 0)
    for i in range(workers):
        start(f"w{i}", ops)
    kills = pauses = 0
    rate = plan.kills + plan.pauses
    while any(procs[s][0].is_alive() for s in procs if s != "gc"):
        if time.monotonic() - started > timeout:
            log.warning("seed %d: workers still running after %.0fs: killed", seed, timeout)
            problems.append(f"workers still running after {timeout:.0f}s (a hang?): killed")
            for s, (p, _) in procs.items():
                if s != "gc" and p.is_alive():
                    killed.add(id(p))
                    p.kill()
            break
        if rate == 0:
            time.sleep(0.05)
            continue
        time.sleep(min(rng.expovariate(rate), 1.0))
        alive = [s for s, (p, _) in procs.items() if p.is_alive()]
        if not alive:
            break
        slot = rng.choice(sorted(alive))
        p, events = procs[slot]
        if rng.random() < plan.kills / rate:
            if kills >= max_kills or p.pid is None:
                continue
            if slot != "gc" and not wait_for_a_write(p, events):
                continue  # it ended, or wrote nothing for a second
            if not _signal(p.pid, signal.SIGKILL):
                continue  # it had ended (and was reaped) since it was seen alive
            killed.add(id(p))
            p.join()
            kills += 1
            left = budget[slot] - returned(events)
            if slot == "gc":
                start("gc", 0)
            elif left > 0:
                start(slot, left)
        else:
            if p.pid is None:
                continue
            if not _signal(p.pid, signal.SIGSTOP):
                continue
            time.sleep(rng.uniform(0.05, 0.4))
            _signal(p.pid, signal.SIGCONT)
            pauses += 1
    open(stop, "w").close()
    for slot, (p, _) in procs.items():
        p.join(timeout=30)
        if p.is_alive():
            problems.append(f"{slot} did not stop within 30 s: killed")
            killed.add(id(p))
            p.kill()
            p.join()
    for name, p in everyone:
        if id(p) not in killed and p.exitcode != 0:
            problems.append(f"process {name} exited with code {p.exitcode} (it crashed)")
    history, errors, stats = load_history(directory)
    errors = problems + errors
    if events_dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    # The final read: after every process stopped, without faults.
    rows: list[str] = []
    verified = False
    try:
        quiet = target.shard()
        t0 = time.monotonic()
        upper, rows = read_rows(quiet)
        history.append(Op("final", "read", t0, time.monotonic(), upper=upper, rows=tuple(rows)))
        verified = bool(quiet.inspect.verify().ok)
    except Exception as e:  # the shard is unreadable: that is the finding
        errors.append(f"the final read without faults failed: {type(e).__name__}: {e}")
    return Recording(
        seed=seed,
        target=target,
        plan=plan,
        ops=history,
        errors=errors,
        final_rows=rows,
        verified=verified,
        kills=kills,
        pauses=pauses,
        injected=stats.get("injected", 0),
        gc_runs=stats.get("gc_runs", 0),
        seconds=time.monotonic() - started,
    )
