"""persistshard.conformance: the contract every storage and every shard must meet, shipped.

- `storage`: blob and consensus contract tests (racing put-if-absent, read-after-write, ...).
- `model`: a reference model of shard semantics and a hypothesis state machine against it.
- `faults`: a fault-injecting blob (fails, times out, or succeeds and reports failure).
- `run_suite`: the suite `persistshard conformance LOCATION` runs (needs the `conformance`
  extra: pytest and hypothesis).
"""
