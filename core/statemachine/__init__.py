"""persistshard.core.statemachine: a shard's versioned state and the one loop that moves it.

- `state`: `ShardState` and what it is made of, the named preconditions, and
  `check_transition`, the check of every new state before it is written; all pure.
- `commits`: one typed commit kind per module (``state(N) = apply(state(N-1), commit(N))``):
  its fields, stored arguments, transition and history summary.
- `encoding`: the stored bytes (checksummed log entries and rollups) and `fold`.
- `machine`: `StateMachine`, the only writer of the consensus log: refresh, the
  compare-and-set loop with jittered backoff and a deadline, rollups.
- `retention`: the pure rule by which since follows the upper minus a shard's history
  retention (applied by `commits`).
- `holds`: reader holds (leased claims on since); `leases`: write leases that gc honours
  and that a commit must still hold; `consumers`: durable consumers (named positions that
  hold since back with no lease, moved by compare-and-set).

Invariant: no module outside this package writes the consensus log.
"""
