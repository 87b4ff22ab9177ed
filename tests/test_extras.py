"""A feature whose package comes with an extra, used without that package: the error is a
`ModuleNotFoundError` (so ``except ImportError`` still catches it) that names the feature and
the extra to install (`persistshard.errors.import_extra`), not Python's bare one. Each
package is hidden here the way a missing one fails (``None`` in ``sys.modules``)."""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest

import persistshard as ps
from persistshard.cli import main as cli_main
from persistshard.errors import import_extra


@pytest.fixture
def shard(tmp_path):
    s = ps.open_shard(str(tmp_path / "s"))
    s.append(pa.table({"id": [1, 2, 3]}))
    return s


def _hide(monkeypatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)


def test_import_extra_returns_an_installed_module():
    assert import_extra("json", "none", "a test") is sys.modules["json"]


@pytest.mark.parametrize(
    ("call", "module", "extra"),
    [
        (lambda s: s.scan().to_polars(), "polars", "polars"),
        (lambda s: s.scan().to_duckdb(), "duckdb", "duckdb"),
        (lambda s: ps.metrics_collector(), "prometheus_client", "prometheus"),
    ],
    ids=["to_polars", "to_duckdb", "metrics_collector"],
)
def test_a_missing_extra_names_the_extra(shard, monkeypatch, call, module, extra):
    _hide(monkeypatch, module)
    with pytest.raises(ModuleNotFoundError) as caught:
        call(shard)
    assert f"pip install 'persistshard[{extra}]'" in str(caught.value)
    assert caught.value.name == module


def _without_s3fs(monkeypatch) -> None:
    registry = sys.modules["fsspec.registry"]._registry  # fsspec's cache of loaded classes
    for protocol in ("s3", "s3a"):
        monkeypatch.delitem(registry, protocol, raising=False)
    _hide(monkeypatch, "s3fs")


def test_an_s3_location_without_s3fs_names_the_s3_extra(monkeypatch):
    _without_s3fs(monkeypatch)
    with pytest.raises(ImportError) as caught:
        ps.open_shard("s3://bucket/orders")
    assert isinstance(caught.value, ModuleNotFoundError) and caught.value.name == "s3fs"
    assert "pip install 'persistshard[s3]'" in str(caught.value)
    assert "s3://" in str(caught.value)


def test_the_cli_says_which_extra_in_one_line(monkeypatch, capsys):
    _without_s3fs(monkeypatch)
    assert cli_main(["inspect", "s3://bucket/orders"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ModuleNotFoundError: ") and "persistshard[s3]" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
