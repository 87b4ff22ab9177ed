"""persistshard.format: the part file format, bytes on storage (spec: docs/format.md).

A part holds updates (user columns, `_time`, `_diff`) as chunks of independently
compressed, checksummed column segments plus a JSON footer indexing them. This package
never imports pyspark or `persistshard.core`; it depends only on pyarrow, numpy, zstandard
and crc32c.
"""

from .part import (
    FORMAT_VERSION,
    PLAIN_ABOVE,
    READ_VERSIONS,
    ChunkInfo,
    PartInfo,
    PartReader,
    PartWriter,
    Segment,
    encode_part,
)
from .stats import ColumnStats

__all__ = [
    "FORMAT_VERSION",
    "PLAIN_ABOVE",
    "READ_VERSIONS",
    "ChunkInfo",
    "ColumnStats",
    "PartInfo",
    "PartReader",
    "PartWriter",
    "Segment",
    "encode_part",
]
