"""persistshard.core: shard semantics on plain storage. No pyspark here; usable without a JVM.

Where things live (imports point down this list, and into `persistshard.format`):

- `shard`: `Shard`, the user-facing facade (writes, reads, verify, describe) over the rest;
  `upsert` and `remap` (reclocking bindings) are built on it.
- `maintenance`: compaction plans and merges, gc, repair.
- `read`: read planning, filters, scans for Python engines, listen.
- `write`: input checks, the Correction buffer, the self-correcting diff.
- `statemachine`: `ShardState` and its commits (pure), the commit loop, holds and leases.
- `storage`: blob stores, the consensus log (blob or database), part files, key layout,
  and the metrics every store request is counted into.
- `rows`: the one row order and consolidation, shared by all of the above.

Every module logs through ``logging.getLogger("persistshard.<its import path>")``.
"""
