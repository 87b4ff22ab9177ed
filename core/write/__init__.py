"""persistshard.core.write: turning a writer's input into sorted, consolidated parts.

- `validate`: input checks and the normal form every write path stores.
- `correction`: the Correction buffer updates are consolidated in and read back by time
  (spilling).
- `external`: a write task's input past its budget sorted by (row, time) and consolidated:
  sorted runs spilled to local files, then merged.
- `diff`: desired minus current, as a bounded-memory merge of sorted runs (overwrite,
  complete-mode sinks).

Invariant: nothing here commits; a write becomes visible only through the state machine.
"""
