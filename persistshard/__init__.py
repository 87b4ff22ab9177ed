"""persistshard: versioned, compacting storage of (row, time, diff) updates, for Spark."""

from persistshard.core.shard import Shard, VerifyReport, open_shard
from persistshard.errors import (
    CorruptData,
    Indeterminate,
    InvalidUpdates,
    NegativeDiff,
    NotSealed,
    PersistShardError,
    SinceViolation,
    StateConflict,
    StorageUnsupported,
    UpperMismatch,
)

__version__ = "0.1.0"

__all__ = [
    "CorruptData",
    "Indeterminate",
    "InvalidUpdates",
    "NegativeDiff",
    "NotSealed",
    "PersistShardError",
    "Shard",
    "SinceViolation",
    "StateConflict",
    "StorageUnsupported",
    "UpperMismatch",
    "VerifyReport",
    "__version__",
    "open_shard",
]
