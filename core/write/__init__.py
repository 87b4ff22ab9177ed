"""persistshard.core.write: turning a writer's input into sorted, consolidated parts.

- `validate`: input checks and the normal form every write path stores.
- `correction`: the Correction buffer a task consolidates its updates in (spilling).
- `diff`: desired minus current, as a bounded-memory merge of sorted runs (overwrite,
  complete-mode sinks).

Invariant: nothing here commits; a write becomes visible only through the state machine.
"""
