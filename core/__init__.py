"""persistshard.core: shard semantics on plain storage. No pyspark here; usable without a JVM.

Where things live (imports point down this list, and into `persistshard.format`):

- `shard`: `Shard`, the user-facing facade (writes, reads, verify, describe) over the machine.
- `compact`, `trace`: physical compaction (streaming merges; the Spine-like level rules).
- `gc`: deleting what no live state version needs (dry run by default, retention floor).
- `machine`: `StateMachine`, the one owner of the state: refresh, the commit loop, rollups.
- `state`: `ShardState`, the commit kinds and their preconditions, as pure functions.
- `correction`: the Correction buffer that consolidates a write task's updates.
- `parts`: reading and writing part files (the only module that calls `persistshard.format`).
- `rows`: consolidation and the one row order; `validate`: input checks and schemas.
- `consensus`: the versioned log with compare-and-set; `blob`: get/put/delete/list storage.
- `layout`: the storage key layout, ids, the clock and shared defaults.
"""
