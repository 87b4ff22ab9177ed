"""Distributed compaction: merges planned on the driver, run in Spark tasks, committed on the
driver (`persistshard.compact(spark, location)`).

Each round plans merges that touch disjoint batches (`persistshard.core.maintenance.trace.
independent_plans`), ships each plan as JSON to one Spark task, which runs the streaming merge
(`persistshard.core.maintenance.compact.run_merge`) against the shard's blob storage and returns a
small JSON description of the parts it wrote. The driver commits the results oldest first, each as
an ordinary ``compact`` commit: a merge whose inputs changed meanwhile loses with
`StateConflict` and its parts are deleted. Rounds repeat until nothing is due (merges cascade
up the levels, so about log N rounds at most), or ``max_rounds``.

What holds: tasks only write new parts under fresh keys (never touch the state), so a failed
or retried task leaves at most unreferenced parts, which gc removes once they are older than
its retention floor; all state changes happen on the driver, one compare-and-set each. The
driver holds each merge's write lease (`persistshard.core.statemachine.leases`) from the plan to
its commit, so gc keeps a long merge's parts and the merge is not refused for its length. When a
task fails, the other merges of its round still commit, then the failure is raised on the
driver as its own class (`CorruptData` names the damaged file): a damaged shard never looks
compacted. A failure that is not a persistshard error is raised as `PersistShardError` with the
task's error text. Workers import persistshard from their installed package; nothing global is set.
Assumes the storage is reachable from every executor under the same location and options
(``memory://`` is per process and will not work).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from persistshard import errors
from persistshard.core.config import ShardConfig
from persistshard.core.maintenance import trace
from persistshard.core.maintenance.compact import CompactionReport, MergeResult, merge_report
from persistshard.core.shard import Shard, write_transaction
from persistshard.core.statemachine.state import schema_from_b64, schema_to_b64

log = logging.getLogger("persistshard.datasource.compact")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_merge_task(payload: str) -> str:
    """Run one merge on an executor: plan JSON in, result JSON (or an error) out."""
    from persistshard.core.maintenance.compact import run_merge
    from persistshard.core.storage.blob import open_blob

    d = json.loads(payload)
    try:
        blob = open_blob(d["location"], **d["storage_options"])
        plan = trace.MergePlan.from_json(d["plan"])
        config = ShardConfig.from_options(d["config"], env=False)
        schema = schema_from_b64(d["schema"])
        result = run_merge(blob, plan, schema, write_id=d["write_id"], config=config)
        return json.dumps({"result": result.to_json()})
    except Exception as e:  # raised again on the driver, after the round's other commits
        log.warning("merge task for %s failed: %s: %s", d.get("location"), type(e).__name__, e)
        detail = e.detail if isinstance(e, errors.PersistShardError) else f"{type(e).__name__}: {e}"
        return json.dumps({"error": {"class": type(e).__name__, "detail": detail}})


def task_error(error: dict[str, str], location: str) -> errors.PersistShardError:
    """The driver-side error for a merge task's failure: the task's persistshard error class
    with its message, or `PersistShardError` carrying any other exception's text."""
    cls = getattr(errors, error["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, errors.PersistShardError)):
        cls = errors.PersistShardError
        detail = f"a merge task failed: {error['detail']}"
    else:
        detail = error["detail"]
    err = cls.__new__(cls)
    errors.PersistShardError.__init__(err, detail, location=location)
    return err


def compact(
    spark: SparkSession,
    location: str,
    *,
    full: bool = True,
    max_rounds: int | None = None,
    **storage_options: Any,
) -> CompactionReport:
    """Compact the shard at ``location`` with merges spread over Spark tasks; returns what was
    done (the same report as `Shard.compact`). ``full`` as in `Shard.compact`."""
    shard = Shard(location, **storage_options)
    state = shard.inspect.state()
    if state.version == 0:  # a mistyped path must not look like a compacted empty table
        raise errors.NoShard(
            f"no shard at {shard.location}: no state was ever committed there (a mistyped "
            "location, or the wrong storage options?); compaction never creates a shard"
        )
    report = CompactionReport(levels_before=trace.levels(state), batches_before=len(state.trace))
    txn = write_transaction(shard)  # the protocol's commits and sweeps; each merge has its id
    rounds = 0
    while state.schema is not None and (max_rounds is None or rounds < max_rounds):
        plans = trace.independent_plans(state, full=full, wide_rows=shard.config.compact_wide_rows)
        if not plans:
            break
        rounds += 1
        write_ids = [txn.mint() for _ in plans]
        payloads = [
            json.dumps(
                {
                    "location": shard.location,
                    "storage_options": shard.address.storage_options,
                    "config": shard.config.options(),
                    "plan": plan.to_json(),
                    "schema": schema_to_b64(state.schema),
                    "write_id": write_id,
                }
            )
            for plan, write_id in zip(plans, write_ids, strict=True)
        ]
        sc = spark.sparkContext
        progress = False
        failures: list[errors.PersistShardError] = []
        # The driver holds every merge's lease while the round's tasks run and until its
        # commit: a merge longer than the lease is kept by gc and still commits. One lease per
        # merge, since each commit releases the lease of the write whose parts it adds.
        with txn.holding(write_ids):
            outcomes = sc.parallelize(payloads, len(payloads)).map(run_merge_task).collect()
            for plan, raw in zip(plans, outcomes, strict=True):  # oldest first
                outcome = json.loads(raw)
                if "error" in outcome:
                    failures.append(task_error(outcome["error"], shard.location))
                    continue
                result = MergeResult.from_json(outcome["result"])
                try:  # the task's parts came in its message: check them before naming them
                    txn.check_parts(
                        [
                            (result.parts, plan.lower, plan.upper),
                            *((b.parts, b.lower, b.upper) for b in result.unsealed_outputs),
                        ]
                    )
                except errors.PersistShardError as e:  # as a failed task: nothing committed
                    failures.append(e)
                    continue
                committed, output = txn.commit_merge(plan, result)
                report.merges.append(merge_report(plan, result, output, committed))
                report.stats.add(result.stats)
                if committed:
                    progress = True
                else:
                    log.info(
                        "%s: merge of %s lost a race; discarded", shard.location, plan.input_ids
                    )
                    report.conflicts += 1
        if failures:
            raise failures[0]
        state = shard.inspect.state()
        if not progress:
            break
    report.levels_after = trace.levels(state)
    report.batches_after = len(state.trace)
    return report
