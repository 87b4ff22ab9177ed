"""``ps.write_together``: several DataFrames written to several registered shards as one
transaction of their txns shard (`persistshard.core.txns`).

The protocol is the batch write's (`persistshard.datasource.writer`) with the transaction's
commit in place of the append:
1. *Mint* (driver): the transaction begins at ``t`` (the txns shard's upper); for each
   DataFrame, its data shard's write (`Txn.writer`: a write id whose lease the driver keeps)
   and its description (`describe_write`: columns matched to the shard's, all at ``t``).
2. *Write* (tasks): each DataFrame's tasks write its rows at ``t`` as parts of its shard
   under that write id (`write_task`), and send back the parts' metadata.
3. *Commit* (driver): the parts are checked and added to the transaction
   (`Txn.add_parts`), then its one commit on the txns shard (pins, compare-and-append,
   apply). On any failure before the commit nothing is visible and the parts are deleted;
   parts of failed task attempts are swept either way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from persistshard.core.statemachine.state import PartRef
from persistshard.core.txns import open_txns
from persistshard.datasource.options import WriteOptions
from persistshard.datasource.writer import describe_write, write_task
from persistshard.errors import InvalidOption, InvalidUpdates

log = logging.getLogger("persistshard.datasource.together")


def write_together(
    spark: Any,
    frames: Mapping[str, Any],
    *,
    txns: str,
    consensus: str | None = None,
    **storage_options: Any,
) -> int:
    """Write each DataFrame of ``frames`` (location -> DataFrame, rows with an optional
    ``_diff`` column) to its shard, all registered with the txns shard at ``txns``, as one
    transaction; returns the time they landed at. ``consensus``: the database URL of the logs
    (default: next to the data); ``storage_options``: the store's. `UpperMismatch` when
    another transaction committed first (nothing applied); `InvalidOption` for a shard that
    is not registered."""
    del spark  # the DataFrames carry their session
    if not frames:
        raise InvalidOption("write_together needs at least one DataFrame", location=txns)
    x = open_txns(txns, consensus=consensus, storage_options=dict(storage_options))
    tx = x.begin()
    written: dict[str, list[str]] = {}
    try:
        for url, df in frames.items():
            writing = tx.writer(url)
            shard = writing.shard
            options = {"path": shard.location}
            if consensus is not None:
                options["consensus"] = consensus
            options.update({f"storage.{k}": str(v) for k, v in storage_options.items()})
            opts = WriteOptions.parse(options, df.schema)
            d = describe_write(opts, df.schema, False, shard)
            if d.time_column is not None:
                raise InvalidUpdates(
                    f"a transaction writes at its own time; the DataFrame has a time column "
                    f"{d.time_column!r}",
                    location=shard.location,
                )
            d = replace(d, lower=tx.at, upper=tx.at + 1, write_id=writing.txn.write_id)
            at = tx.at

            def task(batches: Any, d: Any = d, at: int = at) -> Any:
                out = write_task(d, batches, at)
                refs = [p.to_json() for p in (*out.sealed, *out.unsealed)]
                yield pa.record_batch({"message": pa.array([json.dumps(refs)], pa.string())})

            rows = df.mapInArrow(task, "message string").collect()
            parts = [PartRef.from_json(p) for r in rows for p in json.loads(r["message"])]
            written[shard.location] = [p.key for p in parts]
            schema = d.target if d.target is not None else (d.shard_schema or d.incoming)
            tx.add_parts(url, parts, schema)
        t = tx.commit()
    except BaseException:
        if not tx.done:  # failed before its commit: nothing visible, the parts go
            tx.abort()
        raise
    finally:
        for location, keys in written.items():
            swept = tx.writer_of(location)
            if swept is not None:  # the parts of failed task attempts (the others: above)
                swept.txn.sweep_write(swept.txn.write_id, set(keys))
    log.info("%s: wrote %d DataFrames together at %d", x.location, len(frames), t)
    return t
