"""persistshard.core.statemachine: a shard's versioned state and the one loop that moves it.

- `state`: `ShardState` and the commit kinds as pure functions (``state(N) =
  apply(state(N-1), commit(N))``), with every transition checked before it is written.
- `machine`: `StateMachine`, the only writer of the consensus log: refresh, the
  compare-and-set loop with jittered backoff and a deadline, rollups.
- `retention`: the pure rule by which since follows the upper minus a shard's history
  retention (applied by `state`).
- `holds`: reader holds (leased claims on since); `leases`: write leases that gc honours
  and that a commit must still hold.

Invariant: no module outside this package writes the consensus log.
"""
