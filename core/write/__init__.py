"""persistshard.core.write: turning a writer's input into sorted, consolidated parts.

- `validate`: input checks and the normal form every write path stores.
- `correction`: the Correction buffer updates are consolidated in and read back by time
  (spilling).
- `external`: a write task's input past its budget sorted by (row, time) and consolidated:
  sorted runs spilled to local files, then merged.
- `diff`: desired minus current, as a bounded-memory merge of sorted runs (overwrite,
  complete-mode sinks).
- `transaction`: the write protocol every write path uses: the write's lease, its parts,
  one compare-and-append, the sweep of parts nothing will name.

Invariant: a write becomes visible only through the state machine, by the one commit of its
`transaction.WriteTransaction`; nothing else here commits.
"""
