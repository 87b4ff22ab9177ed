"""persistshard.core.read: answering reads from one pinned state version.

- `plan`: which parts and chunks a read needs, how it splits into tasks, and how each task
  turns stored updates into an answer (Spark and the Python API share it).
- `filters`: exact row predicates and statistics-based chunk skipping.
- `scan`: lazy, streamed, projected and filtered reads for Python engines.
- `expression`: what a scan's pyarrow filter reads and the predicate it implies, read through
  its Substrait form.
- `instant`: the shard time of a wall-clock instant (SQL ``TIMESTAMP AS OF``), from the
  commit times the log records.
- `listen`: a subscription to a shard's changes, holding since while it runs.
- `race`: a read whose pinned version gc collected under it gets `VersionCollected` (read
  again); a part the newest version names that is missing stays `CorruptData`.

Invariant: a read sees exactly one state version, never a mix.
"""
