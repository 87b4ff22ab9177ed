"""persistshard: versioned, compacting storage of (row, time, diff) updates, for Spark.

``persistshard.compact(spark, location)`` (distributed compaction),
``persistshard.overwrite(spark, df, location)`` (distributed self-correcting overwrite),
``persistshard.register(spark)`` (the SQL function ``persistshard_history``),
``persistshard.configure_spark(builder)`` and ``persistshard.companion_jar()`` (the JVM
companion) are loaded on first use,
so ``import persistshard`` never imports pyspark.
"""

from typing import Any

from persistshard.core.remap import RemapShard, open_remap, resume_frontier, resume_offsets
from persistshard.core.shard import Shard, VerifyReport, advance_consumer, open_shard
from persistshard.core.txns import Txn, TxnsShard, open_txns
from persistshard.errors import (
    CommitDeadline,
    CorruptData,
    HoldExpired,
    Indeterminate,
    InvalidOption,
    InvalidUpdates,
    LeaseExpired,
    NegativeDiff,
    NoShard,
    NotSealed,
    PersistShardError,
    SinceViolation,
    StateConflict,
    StorageError,
    StorageUnsupported,
    UpperMismatch,
    VersionCollected,
)

__version__ = "0.1.0"

__all__ = [
    "CommitDeadline",
    "CorruptData",
    "HoldExpired",
    "Indeterminate",
    "InvalidOption",
    "InvalidUpdates",
    "LeaseExpired",
    "NegativeDiff",
    "NoShard",
    "NotSealed",
    "PersistShardError",
    "RemapShard",
    "Shard",
    "SinceViolation",
    "StateConflict",
    "StorageError",
    "StorageUnsupported",
    "Txn",
    "TxnsShard",
    "UpperMismatch",
    "VerifyReport",
    "VersionCollected",
    "__version__",
    "advance_consumer",
    "metrics",
    "metrics_collector",
    "open_remap",
    "open_shard",
    "open_txns",
    "resume_frontier",
    "resume_offsets",
]


def metrics() -> dict[str, Any]:
    """This process's counters and store latency histograms
    (`persistshard.core.storage.metrics`)."""
    from persistshard.core.storage.metrics import snapshot

    return snapshot()


def metrics_collector() -> Any:
    """A ``prometheus_client`` collector of `metrics` (needs ``pip install
    'persistshard[prometheus]'``)."""
    from persistshard.core.storage.metrics import prometheus_collector

    return prometheus_collector()


def __getattr__(name: str) -> Any:
    if name == "compact":
        from persistshard.datasource.compact import compact

        return compact
    if name == "write_together":  # transactions over many shards in Spark
        from persistshard.datasource.together import write_together

        return write_together
    if name == "overwrite":
        from persistshard.datasource.overwrite import overwrite

        return overwrite
    if name in ("configure_spark", "companion_jar"):  # the JVM companion
        from persistshard.datasource import companion

        return getattr(companion, name)
    if name == "register":  # the SQL function persistshard_history (datasource/udtf.py)
        from persistshard.datasource.udtf import register

        return register
    raise AttributeError(f"module 'persistshard' has no attribute {name!r}")
