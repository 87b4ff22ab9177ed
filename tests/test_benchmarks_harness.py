"""The benchmark harness without Spark: result shape, alternation, the page, the check."""

from __future__ import annotations

import json
import sys
import types

import pytest

from benchmarks import harness as h
from benchmarks.__main__ import main


def fake_result(ours: list[float], anchor: list[float], target: float | None = 1.3) -> dict:
    return {
        "title": "Fake thing",
        "description": "A fake benchmark.",
        "params": {"rows": 10},
        "measurements": [
            h.measurement("append 10 rows", "ours", "anchor", ours, anchor, target=target)
        ],
    }


@pytest.fixture
def fake_module(monkeypatch):
    """A registered-looking benchmark module whose run returns a fixed result."""
    module = types.ModuleType("fake_bench")
    calls = []

    def run(rows: int, rounds: int) -> dict:
        calls.append((rows, rounds))
        return fake_result([1.0, 1.2, 1.1][:rounds], [1.0, 1.0, 1.0][:rounds])

    module.run = run
    module.calls = calls
    module.adapt = lambda raw: {**raw, "title": "Adapted"}
    monkeypatch.setitem(sys.modules, "fake_bench", module)
    return module


def bench(name: str = "fake", adapter: str | None = None, headings=("fake thing",)) -> h.Benchmark:
    return h.Benchmark(
        name=name,
        module="fake_bench",
        summary="fake",
        sizes={"quick": {"rows": 10}, "full": {"rows": 100}},
        adapter=adapter,
        headings=headings,
    )


def test_alternate_rotates_order_skips_warmup_and_uses_own_times():
    order = []
    times = h.alternate(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b") or 0.5},
        rounds=3,
        warmup=1,
    )
    assert order == ["b", "a", "a", "b", "b", "a", "a", "b"]
    assert len(times["a"]) == len(times["b"]) == 3
    assert times["b"] == [0.5, 0.5, 0.5]
    assert all(t >= 0 for t in times["a"])


def test_summary_is_median_of_per_round_ratios():
    m = h.summarize_measurement(
        h.measurement("w", "o", "a", [2.0, 3.0, 10.0], [1.0, 2.0, 4.0], target=2.0)
    )
    assert m["ratios"] == [2.0, 1.5, 2.5]
    assert m["ratio"] == {"median": 2.0, "min": 1.5, "max": 2.5}
    assert m["ours_stats"]["median"] == 3.0 and m["anchor_stats"]["max"] == 4.0
    assert m["met"] is True
    over = h.summarize_measurement(h.measurement("w", "o", "a", [3.0], [1.0], target=2.0))
    assert over["met"] is False


def test_single_anchor_value_is_broadcast_and_mismatched_rounds_refused():
    m = h.summarize_measurement(h.measurement("bytes", "o", "a", [4, 6], [2], unit="bytes"))
    assert m["ratios"] == [2.0, 3.0] and m["met"] is None
    with pytest.raises(ValueError, match="ratios are per round"):
        h.round_ratios([1, 2, 3], [1, 2])


def test_skipped_measurement_has_no_ratio_and_no_verdict():
    m = h.summarize_measurement(h.skipped("w", "o", "a", "not there yet", target=1.3))
    assert m["ratio"] is None and m["met"] is None
    assert m["skipped"] == "not there yet"


def test_run_benchmark_passes_size_and_rounds_and_stamps(fake_module):
    result = h.run_benchmark(bench(), "full", 2)
    assert fake_module.calls == [(100, 2)]
    assert result["name"] == "fake" and result["size"] == "full" and result["rounds"] == 2
    assert result["measurements"][0]["ratio"]["median"] == pytest.approx(1.1)
    assert {"date", "machine", "seconds"} <= set(result)
    json.dumps(result)  # the record is plain JSON
    adapted = h.run_benchmark(bench(adapter="fake_bench.adapt"), "quick", 1)
    assert adapted["title"] == "Adapted"


def test_page_has_tables_keeps_hand_written_sections_and_notes(fake_module):
    registry = [bench(), bench("other", headings=("other thing",))]
    old = (
        "# Benchmarks\n\nSome intro.\n\n"
        "## Fake thing (hand-written)\n\nold figures\n\n"
        "## Other thing\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n"
    )
    record = h.merge(h.empty_record(), [h.run_benchmark(bench(), "quick", 3)])
    page = h.render_page(record, registry, old)
    assert "## Fake thing (quick size)" in page
    assert (
        "| append 10 rows | ours | anchor | 1.100 s | 1.000 s "
        "| 1.10x | 1.00x to 1.20x | ≤ 1.3x | yes |" in page
    )
    assert "| fake | append 10 rows | ours | anchor | 1.10x | ≤ 1.3x | yes |" in page
    # The hand-written section the results replace moves into the notes block, words kept.
    notes = page.split("<!-- notes:fake -->")[1].split("<!-- /notes:fake -->")[0]
    assert '"Fake thing (hand-written)"' in notes and "old figures" in notes
    assert "## Fake thing (hand-written)" not in page
    assert "## Other thing\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n" in page  # kept verbatim
    assert "Some intro." in page

    # A human's notes inside the notes markers survive regeneration; regeneration is stable.
    edited = page.replace("<!-- notes:fake -->\n", "<!-- notes:fake -->\nWhy it is 1.1x.\n")
    again = h.render_page(record, registry, edited)
    assert "<!-- notes:fake -->\nWhy it is 1.1x.\n" in again
    assert h.render_page(record, registry, again) == again
    assert again.count("## Other thing") == 1 and again.count("Some intro.") == 1


def test_full_size_results_are_shown_over_quick_ones(fake_module):
    quick = h.run_benchmark(bench(), "quick", 3)
    full = h.run_benchmark(bench(), "full", 3)
    full["title"] = "Full thing"
    record = h.merge(h.merge(h.empty_record(), [full]), [quick])
    assert h.shown(record)["fake"]["title"] == "Full thing"
    assert set(record["runs"]["quick"]) == set(record["runs"]["full"]) == {"fake"}


def test_check_flags_ratios_worse_by_more_than_tolerance():
    recorded = {"x": h.summarize(fake_result([1.0], [1.0]), "x")}
    slightly = {"x": h.summarize(fake_result([1.15], [1.0]), "x")}
    much = {"x": h.summarize(fake_result([1.3], [1.0]), "x")}
    new = {"x": h.summarize({"measurements": [h.measurement("new", "o", "a", [1], [1])]}, "x")}
    assert not any(c.worse() for c in h.compare(recorded, slightly))
    [c] = h.compare(recorded, much)
    assert c.worse() and c.change == pytest.approx(0.3)
    assert "WORSE by more than 20%" in h.check_report([c])
    [n] = h.compare(recorded, new)
    assert n.recorded is None and not n.worse()


def test_check_flags_only_shifts_beyond_the_rounds_spread():
    """A median 30% worse whose rounds overlap the record's is noise (identical code measured
    twice does that at quick size); when every fresh round is worse than every recorded one,
    it is a regression. A change within the tolerance is never flagged."""
    recorded = {"x": h.summarize(fake_result([1.0, 0.8, 1.4], [1.0, 1.0, 1.0]), "x")}
    noisy = {"x": h.summarize(fake_result([1.3, 1.2, 1.5], [1.0, 1.0, 1.0]), "x")}
    shifted = {"x": h.summarize(fake_result([1.6, 1.5, 2.0], [1.0, 1.0, 1.0]), "x")}
    [n] = h.compare(recorded, noisy)
    assert n.change == pytest.approx(0.3) and not n.apart and not n.worse()
    assert "overlap" in h.check_report([n]) and "WORSE" not in h.check_report([n])
    [w] = h.compare(recorded, shifted)
    assert w.apart and w.worse()
    assert "WORSE by more than 20%" in h.check_report([w])
    within = {"x": h.summarize(fake_result([1.5, 1.45, 1.55], [1.0, 1.0, 1.0]), "x")}
    [c] = h.compare({"x": h.summarize(fake_result([1.3, 1.3, 1.3], [1.0] * 3), "x")}, within)
    assert c.apart and not c.worse()  # apart, but only 15% worse


def test_pool_adds_a_repeat_runs_rounds_and_confirms_or_clears_a_suspect():
    recorded = {"x": h.summarize(fake_result([1.0, 0.9, 1.1], [1.0, 1.0, 1.0]), "x")}
    chance = h.summarize(fake_result([1.3, 1.25, 1.4], [1.0, 1.0, 1.0]), "x")
    [c] = h.compare(recorded, {"x": chance})
    assert c.worse()  # three rounds against three can split by chance
    calm = h.summarize(fake_result([1.0, 1.05, 0.95], [1.0, 1.0, 1.0]), "x")
    pooled = h.pool(chance, calm)
    [m] = pooled["measurements"]
    assert m["ours_rounds"] == [1.3, 1.25, 1.4, 1.0, 1.05, 0.95] and len(m["ratios"]) == 6
    [p] = h.compare(recorded, {"x": pooled})
    assert not p.worse()
    again = h.summarize(fake_result([1.5, 1.35, 1.45], [1.0, 1.0, 1.0]), "x")
    [q] = h.compare(recorded, {"x": h.pool(chance, again)})
    assert q.worse()  # a real shift survives the repeat
    single = h.pool(
        h.summarize(fake_result([2.0], [1.0]), "x"), h.summarize(fake_result([3.0], [1.5]), "x")
    )
    assert single["measurements"][0]["ratios"] == [2.0, 2.0]


def test_check_command_exit_code(tmp_path, capsys):
    record, fresh_ok, fresh_bad = (tmp_path / f for f in ("r.json", "ok.json", "bad.json"))
    h.save_record(
        h.merge(
            h.empty_record(), [{**h.summarize(fake_result([1.0], [1.0]), "x"), "size": "quick"}]
        ),
        record,
    )
    h.save_record(
        h.merge(
            h.empty_record(), [{**h.summarize(fake_result([1.1], [1.0]), "x"), "size": "quick"}]
        ),
        fresh_ok,
    )
    h.save_record(
        h.merge(
            h.empty_record(), [{**h.summarize(fake_result([2.0], [1.0]), "x"), "size": "quick"}]
        ),
        fresh_bad,
    )
    base = ["--check", "--record", str(record)]
    assert main([*base, "--fresh", str(fresh_ok)]) == 0
    assert main([*base, "--fresh", str(fresh_bad)]) == 1
    assert "WORSE" in capsys.readouterr().out


def test_write_page_draws_series(tmp_path, fake_module):
    pytest.importorskip("matplotlib")
    result = h.run_benchmark(bench(), "quick", 3)
    result["series"] = [
        {
            "id": "tput",
            "title": "t",
            "x_label": "rows",
            "y_label": "rows/s",
            "x": [1, 2],
            "lines": {"ours": [1, 2]},
        }
    ]
    page = tmp_path / "benchmarks.md"
    h.write_page(h.merge(h.empty_record(), [result]), [bench()], page)
    assert (tmp_path / "img" / "fake_tput.png").stat().st_size > 0
    assert "![t](img/fake_tput.png)" in page.read_text()


def test_check_tells_contenders_apart_on_the_same_operation_and_anchor():
    def two(ours_ratio: float, pass_ratio: float) -> dict:
        return {
            "x": h.summarize(
                {
                    "measurements": [
                        h.measurement("w", "ours", "parquet", [ours_ratio], [1.0]),
                        h.measurement("w", "pass-through", "parquet", [pass_ratio], [1.0]),
                    ]
                },
                "x",
            )
        }

    comparisons = h.compare(two(1.0, 3.0), two(1.5, 3.0))
    assert [(c.ours, c.worse()) for c in comparisons] == [("ours", True), ("pass-through", False)]


def test_each_benchmark_runs_in_a_process_of_its_own(tmp_path, monkeypatch):
    """A run records what a fresh process measured: the invoking process never runs a
    benchmark itself (here it cannot), so nothing one benchmark leaves behind (a Spark
    session, a warm worker, cached memory) changes the next one's figures."""

    def not_here(*args, **kwargs):
        raise AssertionError("a benchmark ran in the invoking process")

    monkeypatch.setattr(h, "run_benchmark", not_here)
    record, page = tmp_path / "r.json", tmp_path / "p.md"
    argv = ["format", "--size", "quick", "--rounds", "1", "--record", str(record)]
    assert main([*argv, "--page", str(page)]) == 0
    result = h.load_record(record)["runs"]["quick"]["format"]
    assert result["rounds"] == 1 and result["measurements"]
    assert "## " in page.read_text()


def test_compare_covers_every_benchmark_of_a_run():
    """A check compares all the benchmarks of a run, each against its own record."""
    recorded = {
        "a": h.summarize(fake_result([1.0, 1.1, 1.2], [1.0, 1.0, 1.0]), "a"),
        "b": h.summarize(fake_result([2.0, 2.1, 2.2], [1.0, 1.0, 1.0]), "b"),
    }
    fresh = {
        "a": h.summarize(fake_result([1.0, 1.1, 1.2], [1.0, 1.0, 1.0]), "a"),
        "b": h.summarize(fake_result([3.0, 3.1, 3.2], [1.0, 1.0, 1.0]), "b"),
    }
    by_name = {c.benchmark: c for c in h.compare(recorded, fresh)}
    assert sorted(by_name) == ["a", "b"]
    assert not by_name["a"].worse() and by_name["b"].worse()
    assert by_name["b"].recorded == pytest.approx(2.1)


def test_a_ratio_that_rose_because_its_anchor_ran_faster_is_inconclusive():
    """Ours unchanged, the anchor faster beyond its spread: reported, not failed; ours
    slower against a steady anchor: failed."""
    recorded = {"q": h.summarize(fake_result([1.25, 1.19, 1.14], [0.80, 0.85, 1.00]), "q")}
    anchor_moved = {"q": h.summarize(fake_result([1.20, 1.14, 1.10], [0.60, 0.55, 0.50]), "q")}
    ours_slower = {"q": h.summarize(fake_result([1.90, 2.00, 2.10], [0.82, 0.90, 0.95]), "q")}
    [moved] = h.compare(recorded, anchor_moved)
    assert moved.change is not None and moved.change > h.TOLERANCE and moved.apart
    assert moved.inconclusive() and not moved.worse()
    report = h.check_report([moved])
    assert "inconclusive" in report and "WORSE" not in report
    [slower] = h.compare(recorded, ours_slower)
    assert slower.worse() and not slower.inconclusive()


def test_page_keeps_earlier_plots_when_matplotlib_is_missing(tmp_path, fake_module, monkeypatch):
    result = h.run_benchmark(bench(), "quick", 3)
    result["series"] = [
        {"id": "tput", "title": "t", "x_label": "", "y_label": "", "x": [1], "lines": {}},
        {"id": "gone", "title": "g", "x_label": "", "y_label": "", "x": [1], "lines": {}},
    ]
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "fake_tput.png").write_bytes(b"png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    page = tmp_path / "benchmarks.md"
    h.write_page(h.merge(h.empty_record(), [result]), [bench()], page)
    text = page.read_text()
    assert "![t](img/fake_tput.png)" in text
    assert "fake_gone.png" not in text


def test_the_harness_leaves_the_callers_spark_session_running(spark, tmp_path, monkeypatch):
    """The harness never stops a Spark session it did not start: every benchmark runs (and
    stops its session) in a child, so a session in the invoking process is its caller's. It
    once stopped it, and under pytest-xdist every later Spark test of that worker failed."""
    import benchmarks.__main__ as entry

    monkeypatch.setattr(entry, "_run_isolated", lambda name, size, rounds: None)
    record, page = tmp_path / "r.json", tmp_path / "p.md"
    assert main(["format", "--size", "quick", "--record", str(record), "--page", str(page)]) == 1
    assert spark.range(3).count() == 3
