"""persistshard.conformance: what any storage and any shard must do, as runnable tests.

- `storage`: the Blob and Consensus contracts (`BlobContract`, `ConsensusContract`) over a
  `Store` factory (``wrap`` runs them under a fault: `faults.Faults`; `BLOB_CONTRACT_UNDER`
  says which blob tests hold under which fault), the racing-workers helper and
  `probe_atomic_create`.
- `model`: a reference model of a shard and a hypothesis state machine comparing a real
  shard with it.
- `faults`: `FaultyBlob`, a wrapper of any `Blob` that fails before or after an operation,
  loses responses (with or without the client library's own retry), repeats requests, or
  ignores the condition of a conditional create; `Faults`, a picklable factory of them.
- `proxy`: `FaultProxy`, a fault-injecting HTTP proxy in front of an S3 endpoint (lost,
  delayed, cut, 500-after-applied and repeated requests), for s3fs with its own retries on.
- `s3server`: a local S3-compatible server (moto on loopback) with one bucket, for tests and
  benchmarks (needs the `test` extra).
- `run_suite`: the pytest module `persistshard conformance LOCATION` runs against a user's
  storage (needs the `conformance` extra: pytest and hypothesis).
"""
