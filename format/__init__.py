"""persistshard.format: the part file format, bytes on storage (spec: docs/format.md).

A part holds updates (user columns, `_time`, `_diff`) as chunks of independently
compressed, checksummed column segments plus a JSON footer indexing them. This package
never imports pyspark or `persistshard.core`; it depends only on pyarrow, numpy, zstandard
and crc32c.
"""

from .part import (
    FORMAT_VERSION,
    ChunkInfo,
    PartInfo,
    PartReader,
    PartWriter,
    Segment,
    encode_part,
)

__all__ = [
    "FORMAT_VERSION",
    "ChunkInfo",
    "PartInfo",
    "PartReader",
    "PartWriter",
    "Segment",
    "encode_part",
]
