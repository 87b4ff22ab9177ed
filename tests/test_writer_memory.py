"""A Spark write task's memory stays near its budget whatever the size of its partition."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys, tempfile
import numpy as np, pyarrow as pa
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType
from persistshard.datasource.sinks import PersistShardWriter

budget = int(sys.argv[1])
rows, batch = int(sys.argv[2]), 10_000
shuffled = sys.argv[3] == "shuffled"
schema = StructType([StructField("id", LongType()), StructField("name", StringType()),
                     StructField("value", DoubleType())])
loc = tempfile.mkdtemp() + "/s"
w = PersistShardWriter({"path": loc, "memory_budget": str(budget)}, schema, False)
rng = np.random.default_rng(0)

def batches():
    for start in range(0, rows, batch):
        if shuffled:  # ids from the whole range: sorted runs overlap and are merged
            ids = rng.integers(0, rows, batch)
        else:  # ascending blocks: sorted runs follow each other and are concatenated
            ids = rng.permutation(np.arange(start, start + batch))
        yield pa.record_batch({"id": pa.array(ids, pa.int64()),
                               "name": pa.array([f"name-{i:012d}" for i in ids]),
                               "value": pa.array(rng.random(batch))})

pool = pa.default_memory_pool()
before = pool.max_memory()
message = w.write(batches())
peak = pool.max_memory() - before
w.commit([message])
import persistshard as ps
snap = ps.open_shard(loc).snapshot()
print(json.dumps({"peak": peak, "rows": snap.num_rows,
                  "parts": len(message.sealed)}))
"""


def test_write_task_memory_stays_near_budget():
    """300k and 1.2M rows (about 13 and 53 MB in Arrow) through a task with a 12 MiB budget:
    sorted runs spill, parts are cut small, every row arrives, and Arrow's peak allocation
    stays within 1.5x the budget for both sizes: it follows the budget, not the input. The
    1.2M rows once more with ids drawn from the whole range (repeated rows included), so the
    runs overlap and the streaming merge runs (ExternalSort)."""
    budget = 12 << 20
    for rows, order in ((300_000, "blocks"), (1_200_000, "blocks"), (1_200_000, "shuffled")):
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(budget), str(rows), order],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["rows"] == rows
        assert result["parts"] > 1
        assert result["peak"] < 1.5 * budget, result
