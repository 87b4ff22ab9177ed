"""persistshard: versioned, compacting storage of (row, time, diff) updates, for Spark."""

from persistshard.errors import (
    CorruptData,
    Indeterminate,
    InvalidUpdates,
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
    "NotSealed",
    "PersistShardError",
    "SinceViolation",
    "StateConflict",
    "StorageUnsupported",
    "UpperMismatch",
    "__version__",
]
