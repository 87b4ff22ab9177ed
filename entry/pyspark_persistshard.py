"""Spark finds the `persistshard` format through this module (its name starts with `pyspark_`).

Kept tiny and safe: a failure to import here would disable every automatic data source
registration in the environment, so an import error is turned into a source that reports it.
"""

try:
    from persistshard.datasource.source import PersistShardDataSource as DefaultSource
except Exception as _error:  # pragma: no cover - only when the installation is broken
    from pyspark.sql.datasource import DataSource

    _reason = f"{type(_error).__name__}: {_error}"

    class DefaultSource(DataSource):  # type: ignore[no-redef]
        """Stands in for the real source when persistshard cannot be imported."""

        @classmethod
        def name(cls) -> str:
            return "persistshard"

        def schema(self) -> str:
            raise ImportError(f"persistshard is installed but cannot be imported: {_reason}")


__all__ = ["DefaultSource"]
