"""persistshard.core.storage: where bytes and versions live, and nothing about what they mean.

Owns the two stores a shard sits on and the shape of its keys:

- `blob`: get/put/delete/list over any fsspec URL (fsync on local files, the only
  durability rule), plus the in-memory store for tests.
- `consensus`: the versioned log with compare-and-set at its head, kept next to the data
  (blob consensus with floor markers); `sqlconsensus`: the same contract in SQLite or
  PostgreSQL, chosen by a ``consensus=`` URL.
- `parts`: part files in and out (the only module of `core` that calls `persistshard.format`).
- `recent`: small parts this process just wrote, kept decoded for its own compaction (a
  merge takes its inputs from there; reads never do).
- `layout`: the key layout under a location, ids, the clock and shared defaults.
- `metrics`: per-process counters and store latency histograms (``persistshard.metrics()``,
  a Prometheus collector), the counting wrappers every `Shard` puts around its blob and
  consensus, operation scopes, and what a commit did (stored in its log entry).

Invariant: nothing here reads or interprets a shard's state; a store is correct by its own
contract (conformance suite), whatever the layers above put in it.
"""
