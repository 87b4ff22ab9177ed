"""The state machine's names in one place, for code and users that import them from here.

A shard's state is the fold of its commits: ``state(N) = apply(state(N-1), commit(N))``. The
parts live in three modules (this one only re-exports them, and adds nothing):
- `persistshard.core.statemachine.model`: `ShardState` and what it is made of, the named
  preconditions, the rules commits share, `check_transition` (the invariants are stated there);
- `persistshard.core.statemachine.commits`: `Commit` and one module per commit kind, with its
  typed fields, stored arguments, transition and history summary; `apply`;
- `persistshard.core.statemachine.encoding`: the stored bytes (entries, rollups) and `fold`.
"""

from __future__ import annotations

from persistshard.core.statemachine.commits import KINDS, Commit, apply
from persistshard.core.statemachine.commits.advance_since import AdvanceSince
from persistshard.core.statemachine.commits.append import Append
from persistshard.core.statemachine.commits.compact import Compact
from persistshard.core.statemachine.commits.downgrade_since import DowngradeSince
from persistshard.core.statemachine.commits.expire_reader import ExpireReader
from persistshard.core.statemachine.commits.heartbeat import Heartbeat
from persistshard.core.statemachine.commits.register_reader import RegisterReader
from persistshard.core.statemachine.commits.renew_lease import RenewLease
from persistshard.core.statemachine.commits.set_retention import SetRetention
from persistshard.core.statemachine.commits.sweep_leases import SweepLeases
from persistshard.core.statemachine.encoding import (
    ENTRY_MAGIC,
    ROLLUP_MAGIC,
    STORED_VERSION,
    Entry,
    decode_rollup,
    encode_rollup,
    fold,
    seal,
    unseal,
)
from persistshard.core.statemachine.model import (
    MAX_INLINE_PART_BYTES,
    MAX_WRITER_RECORDS,
    PRUNE_EVERY,
    WRITER_RECORD_MS,
    AssertBatchesPresent,
    AssertLevelsOrdered,
    AssertLiveHold,
    AssertNoLiveHold,
    AssertUpper,
    Batch,
    BatchIdentity,
    Hold,
    PartRef,
    ShardState,
    WriterBatch,
    WriterVerdict,
    check_transition,
    judge_writer_batch,
    key_problem,
    lease_covers,
    part_write_id,
    prune_due,
    prune_writers,
    schema_from_b64,
    schema_to_b64,
)

__all__ = [
    "ENTRY_MAGIC",
    "KINDS",
    "MAX_INLINE_PART_BYTES",
    "MAX_WRITER_RECORDS",
    "PRUNE_EVERY",
    "ROLLUP_MAGIC",
    "STORED_VERSION",
    "WRITER_RECORD_MS",
    "AdvanceSince",
    "Append",
    "AssertBatchesPresent",
    "AssertLevelsOrdered",
    "AssertLiveHold",
    "AssertNoLiveHold",
    "AssertUpper",
    "Batch",
    "BatchIdentity",
    "Commit",
    "Compact",
    "DowngradeSince",
    "Entry",
    "ExpireReader",
    "Heartbeat",
    "Hold",
    "PartRef",
    "RegisterReader",
    "RenewLease",
    "SetRetention",
    "ShardState",
    "SweepLeases",
    "WriterBatch",
    "WriterVerdict",
    "apply",
    "check_transition",
    "decode_rollup",
    "encode_rollup",
    "fold",
    "judge_writer_batch",
    "key_problem",
    "lease_covers",
    "part_write_id",
    "prune_due",
    "prune_writers",
    "schema_from_b64",
    "schema_to_b64",
    "seal",
    "unseal",
]
