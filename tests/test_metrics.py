"""Observability: module loggers, per-commit operation metrics, the per-process snapshot and
its Prometheus exposition (core/metrics.py). No Spark here (tests/test_metrics_spark.py)."""

from __future__ import annotations

import ast
import json
import logging
import os
import threading
from dataclasses import replace

import pyarrow as pa
from prometheus_client import CollectorRegistry, generate_latest

import persistshard as ps
from persistshard.cli import main as cli
from persistshard.core.statemachine.encoding import Entry
from persistshard.core.storage import metrics
from persistshard.core.storage.blob import BlobWrapper, open_blob
from persistshard.core.storage.consensus import Consensus, MemoryConsensus

#: Modules that need no logger, and why: they neither do I/O nor decide anything a log reader
#: would look for (their callers log the outcome), or they only parse.
PURE = {
    "persistshard.core.rows": "row order and consolidation of in-memory tables",
    "persistshard.core.read.filters": "predicates evaluated on in-memory tables and statistics",
    "persistshard.core.maintenance.trace": "merge planning, a pure function of a state; "
    "compaction logs the plans it runs",
    "persistshard.core.statemachine.state": "the pure shard model and its checks; the state "
    "machine logs commits landed and refused",
    "persistshard.core.statemachine.encoding": "pure encoding and decoding of entries and "
    "rollups, and the fold; the state machine logs what it reads",
    "persistshard.core.storage.layout": "key names, ids and the clock",
    "persistshard.core.config": "the configuration and its parser, which raises InvalidOption",
    "persistshard.core.storage.recent": "an in-memory store of decoded parts; compaction logs "
    "the merges that take inputs from it",
    "persistshard.core.statemachine.retention": "the pure since-from-retention rule; the "
    "commits that apply it are logged by the state machine",
    "persistshard.core.write.validate": "input checks that raise; the caller reports them",
    "persistshard.datasource.types": "Spark <-> Arrow type mapping",
    "persistshard.datasource.options": "option parsing that raises InvalidOption",
    "persistshard.datasource.ddl": "a parser of column DDL",
    "persistshard.datasource.replay": "the digest of a micro-batch's rows; the sinks log "
    "what they decide from it",
    "persistshard.conformance.model": "the in-memory reference model",
    "persistshard.conformance.run_suite": "pytest test classes: pytest reports their outcome",
    "persistshard.conformance.target": "the run's target, a pytest plugin object (a fixture)",
    "persistshard.conformance.linearizability": "the checker, a pure search over a recorded "
    "history; the recorder and the tests report its verdict",
}

#: Packages whose every module is pure, and why.
PURE_PACKAGES = {
    "persistshard.core.statemachine.commits": "commit kinds: pure state transitions; the state "
    "machine logs commits landed and refused",
}

LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _modules(root: str) -> dict[str, str]:
    out = {}
    for layer in ("core", "datasource", "conformance"):
        for folder, _, files in os.walk(os.path.join(root, layer)):
            for name in files:
                if name.endswith(".py") and name != "__init__.py":
                    rel = os.path.relpath(os.path.join(folder, name), root)[:-3]
                    out["persistshard." + rel.replace(os.sep, ".")] = os.path.join(folder, name)
    out["persistshard.cli"] = os.path.join(root, "cli.py")
    return out


def test_every_module_logs_under_its_own_name_or_is_pure(repo_root):
    """Each module that does I/O or decides something defines ``log =
    logging.getLogger("<its import name>")`` at module level (a child of "persistshard") and
    logs through it; the others are on `PURE`, with the reason. No library module prints."""
    missing, unused, printing = [], [], []
    modules = _modules(repo_root)
    assert set(PURE) <= set(modules), set(PURE) - set(modules)
    for dotted, path in sorted(modules.items()):
        tree = ast.parse(open(path).read())
        named = [
            node.value.args[0].value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["log"]
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "attr", None) == "getLogger"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ]
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "log"
            and node.func.attr in LEVELS
        ]
        prints = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
        ]
        if prints and dotted != "persistshard.cli":
            printing.append(dotted)
        if dotted in PURE or dotted.rpartition(".")[0] in PURE_PACKAGES:
            continue
        if named != [dotted]:
            missing.append((dotted, named))
        elif not calls:
            unused.append(dotted)
    assert not missing, f"modules without a logger named after them: {missing}"
    assert not unused, f"modules that define a logger and never log: {unused}"
    assert not printing, f"library modules that print: {printing}"


def _rows(ids: list[int], time: int = 0) -> pa.Table:
    n = len(ids)
    return pa.table({"id": ids, "_time": [time] * n, "_diff": [1] * n})


def test_append_commit_and_gc_summary_are_logged(tmp_path, caplog):
    shard = ps.open_shard(str(tmp_path / "s"))
    with caplog.at_level(logging.DEBUG, logger="persistshard"):
        shard.append(_rows([1, 2]))
        shard.gc(dry_run=False, retention_seconds=0)
    landed = [
        r
        for r in caplog.records
        if r.name == "persistshard.core.statemachine.machine" and "landed as version 1" in r.message
    ]
    assert landed and landed[0].levelno == logging.DEBUG
    summary = [r for r in caplog.records if r.name == "persistshard.core.maintenance.gc"]
    assert summary and summary[-1].levelno == logging.INFO
    assert "gc deleted" in summary[-1].message and shard.location in summary[-1].message


class CountedBlob(BlobWrapper):
    """The test's own count of the blob requests a shard makes."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls = 0

    def _count(self):
        self.calls += 1

    def get(self, key):
        self._count()
        return super().get(key)

    def get_range(self, key, offset, length):
        self._count()
        return super().get_range(key, offset, length)

    def size(self, key):
        self._count()
        return super().size(key)

    def put(self, key, data):
        self._count()
        super().put(key, data)

    def put_if_absent(self, key, data):
        self._count()
        return super().put_if_absent(key, data)

    def delete(self, key):
        self._count()
        super().delete(key)

    def list(self, prefix=""):
        self._count()
        return super().list(prefix)

    def list_temporary(self):
        self._count()
        return super().list_temporary()


class CountedConsensus(MemoryConsensus):
    """A database-like consensus (every call one round trip) that counts its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def head(self):
        self.calls += 1
        return super().head()

    def compare_and_set(self, expected, data):
        self.calls += 1
        return super().compare_and_set(expected, data)

    def scan(self, from_version, limit=None):
        self.calls += 1
        return super().scan(from_version, limit)

    def truncate(self, below):
        self.calls += 1
        return super().truncate(below)


def test_history_records_what_each_commit_did(tmp_path):
    """An append's entry holds its rows, bytes and parts, and exactly the store requests it
    made (counted independently here); a compaction's holds what it added and removed."""
    blob = CountedBlob(open_blob(str(tmp_path / "s")))
    consensus = CountedConsensus()
    shard = ps.Shard(str(tmp_path / "s"), blob=blob, consensus=consensus)
    for t in range(3):
        before = blob.calls + consensus.calls
        shard.append(_rows([10 * t, 10 * t + 1, 10 * t + 2], t), new_upper=t + 1)
        made = blob.calls + consensus.calls - before
        m = shard.history()[-1]["metrics"]
        part = shard.inspect.state().trace[-1].parts[0]
        assert (m["rows_added"], m["rows_removed"]) == (3, 0)
        assert (m["parts_added"], m["parts_removed"]) == (1, 0)
        assert (m["bytes_added"], m["bytes_removed"]) == (part.size, 0)
        assert m["store_requests"] == made, (m, made)
        assert m["retries"] == 0 and m["duration_ms"] >= 0 and m["operation"] == "append"
    inputs = shard.inspect.state().trace
    shard.compact()
    m = shard.history()[-1]["metrics"]
    assert shard.history()[-1]["kind"] == "compact"
    assert m["parts_removed"] == sum(len(b.parts) for b in inputs) == 3
    assert m["rows_removed"] == 9 and m["rows_added"] == 9
    assert m["bytes_removed"] == sum(b.size_bytes for b in inputs)
    assert m["bytes_added"] == shard.inspect.state().trace[0].size_bytes
    assert m["store_requests"] > 0


class RacingConsensus(Consensus):
    """Forwards to ``inner``; runs ``before_first_cas`` once, just before the first
    compare-and-set (another writer commits there, so this one loses the race)."""

    def __init__(self, inner, before_first_cas):
        self.inner, self.hook = inner, before_first_cas

    def head(self):
        return self.inner.head()

    def compare_and_set(self, expected, data):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self.inner.compare_and_set(expected, data)

    def scan(self, from_version, limit=None):
        return self.inner.scan(from_version, limit)

    def truncate(self, below):
        return self.inner.truncate(below)


def test_a_lost_race_is_a_retry_in_the_entry(tmp_path):
    """Writer a commits while writer b is about to: b's plain append loses the race, is
    rebased and lands on the next attempt, and its entry says it retried once."""
    location = str(tmp_path / "s")
    log_ = MemoryConsensus()
    a = ps.Shard(location, consensus=log_)
    b = ps.Shard(location, consensus=RacingConsensus(log_, lambda: a.append(pa.table({"id": [1]}))))
    b.append(pa.table({"id": [2]}))  # plain rows: written at the upper found at commit
    history = a.history()
    assert [h["metrics"]["retries"] for h in history] == [0, 1]
    assert history[1]["metrics"]["rows_added"] == 1
    assert ps.metrics()["counters"]["commit_retries"] >= 1


def _strip_metrics(shard: ps.Shard) -> ps.Shard:
    """The same shard with every log entry rewritten as before metrics existed."""
    old = MemoryConsensus()
    for logged in shard._consensus.scan(1):
        entry = Entry.decode(logged.data)
        commit = replace(entry.commit, metrics=None)
        again = Entry(commit, entry.rollup_version, entry.rollup_key, entry.at_ms)
        assert old.compare_and_set(logged.version - 1 or None, again.encode())
    return ps.Shard(shard.location, blob=shard._blob, consensus=old)


def test_entries_without_metrics_still_read(tmp_path, capsys):
    shard = ps.open_shard(str(tmp_path / "s"))
    shard.append(_rows([1, 2]))
    old = _strip_metrics(shard)
    assert old.history()[0]["metrics"] is None
    assert old.snapshot().num_rows == 2
    old.append(_rows([3], 1))  # a new commit on an old log has metrics again
    assert old.history()[-1]["metrics"]["rows_added"] == 1


def test_cli_history_shows_metric_columns_and_json(tmp_path, capsys):
    location = str(tmp_path / "s")
    shard = ps.open_shard(location)
    shard.append(_rows([1, 2, 3]))
    shard.append(_rows([4], 1))
    assert cli(["history", location]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["VERSION", "COMMITTED", "(UTC)", "KIND"]
    assert "ROWS +/-" in out[0] and "REQS" in out[0]
    first = shard.history()[0]["metrics"]
    assert "+3/-0" in out[1] and f" {first['store_requests']} " in out[1]
    assert "+1/-0" in out[2]
    assert cli(["history", location, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [h["metrics"]["rows_added"] for h in doc] == [3, 1]


def test_cli_verbose_shows_the_library_log(tmp_path, capsys, monkeypatch):
    location = str(tmp_path / "s")
    ps.open_shard(location).append(_rows([1]))
    assert cli(["compact", location]) == 0
    assert capsys.readouterr().err == ""  # quiet by default
    assert cli(["compact", location, "-v"]) == 0
    err = capsys.readouterr().err
    assert "INFO persistshard.core.maintenance.compact:" in err and location in err
    assert "DEBUG" not in err
    monkeypatch.setenv("PERSISTSHARD_LOG", "debug")
    assert cli(["gc", location, "--apply"]) == 0
    err = capsys.readouterr().err
    assert (
        "DEBUG persistshard.core.storage" in err and "INFO persistshard.core.maintenance.gc" in err
    )
    assert logging.getLogger("persistshard").handlers == []  # nothing left behind


def test_process_snapshot_counts_store_requests_commits_and_gc(tmp_path):
    before = ps.metrics()
    shard = ps.open_shard(str(tmp_path / "s"), inline_bytes=0)  # part files for gc to delete
    for t in range(4):
        shard.append(_rows([t], t), new_upper=t + 1)
    shard.compact()
    report = shard.gc(dry_run=False, retention_seconds=0)
    after = ps.metrics()
    c0, c1 = before["counters"], after["counters"]
    assert c1["commits"] - c0["commits"] >= 5
    assert c1["compactions"] - c0["compactions"] >= 1
    assert c1["gc_runs"] - c0["gc_runs"] == 1
    assert c1["gc_deleted_parts"] - c0["gc_deleted_parts"] == len(report.parts) == 4
    for op in ("blob.put", "blob.get", "blob.list", "consensus.head", "consensus.compare_and_set"):
        h = after["latency"][op]
        assert h["count"] > before["latency"].get(op, {"count": 0})["count"], op
        counts = [n for _, n in h["buckets"]]
        assert counts == sorted(counts) and counts[-1] == h["count"]
        assert h["buckets"][-1][0] == float("inf") and h["sum_seconds"] > 0


def test_registry_is_consistent_under_threads():
    """Concurrent updates are all counted and a snapshot taken meanwhile is consistent."""
    reg = metrics.Registry()
    seen: list[dict] = []

    def work() -> None:
        for i in range(2000):
            reg.inc("commits")
            reg.observe("blob.get", 0.0001 * (i % 50))
            if i % 500 == 0:
                seen.append(reg.snapshot())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = reg.snapshot()
    assert snap["counters"]["commits"] == 8000
    assert snap["latency"]["blob.get"]["count"] == 8000
    for s in seen:
        h = s["latency"].get("blob.get")
        if h is not None:
            assert h["buckets"][-1][1] == h["count"]


def test_prometheus_exposition(tmp_path):
    registry = CollectorRegistry()
    registry.register(ps.metrics_collector())
    ps.open_shard(str(tmp_path / "s")).append(_rows([1]))
    text = generate_latest(registry).decode()
    commits = ps.metrics()["counters"]["commits"]
    assert f"persistshard_commits_total {float(commits)}" in text
    assert 'persistshard_store_request_seconds_bucket{le="+Inf",operation="blob.put"}' in text
    assert 'persistshard_store_request_seconds_count{operation="consensus.compare_and_set"}' in text


def test_nested_operations_record_each_commit_once(tmp_path):
    """An operation that commits twice (an append, then a compaction inside the same scope)
    records each commit's own requests: the second entry does not repeat the first's."""
    shard = ps.open_shard(str(tmp_path / "s"))
    for t in range(3):
        shard.append(_rows([t], t), new_upper=t + 1)
    with metrics.operation("test"):
        shard.append(_rows([9], 3), new_upper=4)
        shard.compact()
    appended, compacted = shard.history()[-2]["metrics"], shard.history()[-1]["metrics"]
    assert appended["operation"] == compacted["operation"] == "test"
    assert appended["rows_added"] == 1 and compacted["parts_removed"] == 4
    fresh = ps.open_shard(str(tmp_path / "t"))
    for t in range(4):
        fresh.append(_rows([t], t), new_upper=t + 1)
    fresh.compact()
    alone = fresh.history()[-1]["metrics"]["store_requests"]
    assert compacted["store_requests"] <= alone + 2, (compacted, alone)
