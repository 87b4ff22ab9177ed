"""persistshard.core.maintenance: the work that keeps a shard small and readable.

- `trace`: which consecutive batches merge, into what level, at what since (pure plans).
- `compact`: executing a plan as a streaming k-way merge and committing its output.
- `auto`: the bounded compaction and gc a writer runs after its own commit.
- `gc`: deleting parts, rollups and log entries no live version, hold or lease needs.
- `repair`: restoring a shard whose newest log entries are unreadable.

Invariant: maintenance never changes what any read at or after since returns.
"""
