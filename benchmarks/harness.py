"""The benchmark harness: one result shape, side-by-side timing, the record, the page, the check.

Every benchmark is a module with ``run(..., rounds: int) -> dict`` returning a **result**
(plain JSON-able data, so it can be stored in ``docs/benchmarks.json`` as is)::

    {
      "name": "spark",                      # registry name (the harness fills it in if absent)
      "title": "Spark data source",         # section heading in docs/benchmarks.md
      "description": "markdown paragraph: what is measured, on what data",
      "params": {"rows": 2000000, ...},     # what the size knob chose
      "measurements": [                     # one row of the section's table each
        {
          "what": "append 2M rows",         # the operation
          "ours": "persistshard",           # label of the thing measured
          "anchor": "pass-through IPC",     # label of what it is compared with
          "unit": "s",                      # "s" (default) or e.g. "bytes"; lower is better
          "ours_rounds": [0.91, 0.88, ...], # one value per round, same rounds as the anchor's
          "anchor_rounds": [0.70, 0.72, ...],  # or a single value (e.g. bytes), broadcast
          "target": 1.3,                    # the ratio ours/anchor must stay at or under; or None
          "note": "",                       # optional, shown under the table
          "skipped": "",                    # set instead of rounds when one side could not run
          "extra": {"ours_bytes": 123},     # optional figures, shown in the JSON only
        },
      ],
      "series": [                           # optional: plots, drawn by the harness
        {"id": "throughput", "title": "...", "x_label": "rows", "y_label": "rows/s",
         "x": [1e6, 4e6], "lines": {"persistshard write": [..], "parquet write": [..]},
         "log_x": true, "log_y": false, "x_tick_labels": ["1M", "4M"]},  # the last three optional
      ],
      "notes": ["markdown line", ...],      # optional, shown at the end of the section
    }

Invariants the harness keeps (`summarize`):
- A ratio is always ``ours / anchor`` of one round, measured in the same process and run as
  its anchor with the two alternating (`alternate`): lower is better, 1.0 is parity. The
  figure that counts is the median of the per-round ratios, not the ratio of medians; min and
  max show the noise.
- ``met`` is ``ratio median <= target``; None when there is no target or the row was skipped.

The record (``docs/benchmarks.json``) keeps one result per benchmark per size (``quick`` and
``full``); the page shows the full-size figures, or the quick ones when there are no others.
`check` compares ratio medians of a fresh run with the record of the same size.
``python -m benchmarks`` runs each benchmark in a fresh Python process, so a figure does not
depend on which benchmarks ran before it in the same invocation.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RECORD = DOCS / "benchmarks.json"
PAGE = DOCS / "benchmarks.md"
IMG = DOCS / "img"
SIZES = ("quick", "full")
DEFAULT_ROUNDS = {"quick": 3, "full": 5}
#: A ratio worse than the record by more than this fraction is a regression.
TOLERANCE = 0.20
RECORD_FORMAT = 1

Result = dict[str, Any]
Adapter = Callable[[Any], Result]


# --- timing --------------------------------------------------------------------------------


def alternate(
    contenders: Mapping[str, Callable[[], float | None]],
    rounds: int,
    *,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """Run every contender once per round, alternating, and return each one's per-round times.

    A contender returns None (its wall time is measured around the call) or the seconds it
    measured itself (to leave out per-round setup such as a fresh directory). The order
    rotates every round so no contender always goes first (caches, turbo, a neighbour's load
    hit both sides alike); ``warmup`` rounds run first and are not recorded.
    """
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(-warmup, rounds):
        shift = r % len(names) if names else 0
        order = names[shift:] + names[:shift]
        for name in order:
            start = time.perf_counter()
            own = contenders[name]()
            elapsed = time.perf_counter() - start if own is None else float(own)
            if r >= 0:
                times[name].append(elapsed)
    return times


def measurement(
    what: str,
    ours: str,
    anchor: str,
    ours_rounds: Sequence[float],
    anchor_rounds: Sequence[float],
    *,
    target: float | None = None,
    unit: str = "s",
    note: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One measurement in the result shape (see the module docstring)."""
    m: dict[str, Any] = {
        "what": what,
        "ours": ours,
        "anchor": anchor,
        "unit": unit,
        "ours_rounds": [float(v) for v in ours_rounds],
        "anchor_rounds": [float(v) for v in anchor_rounds],
        "target": target,
    }
    if note:
        m["note"] = note
    if extra:
        m["extra"] = dict(extra)
    return m


def skipped(
    what: str, ours: str, anchor: str, reason: str, *, target: float | None = None
) -> dict[str, Any]:
    """A measurement that could not run, with the reason shown on the page."""
    return {
        "what": what,
        "ours": ours,
        "anchor": anchor,
        "unit": "s",
        "ours_rounds": [],
        "anchor_rounds": [],
        "target": target,
        "skipped": reason,
    }


# --- summaries -----------------------------------------------------------------------------


def stats(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def round_ratios(ours: Sequence[float], anchor: Sequence[float]) -> list[float]:
    """``ours[i] / anchor[i]`` per round; a single anchor value is used for every round."""
    if not ours or not anchor:
        return []
    ours, anchor = paired_rounds(ours, anchor)
    return [o / a if a else float("inf") for o, a in zip(ours, anchor, strict=True)]


def paired_rounds(
    ours: Sequence[float], anchor: Sequence[float]
) -> tuple[list[float], list[float]]:
    """``ours`` and ``anchor`` as equally long per-round lists: a single value on one side
    stands for every round of the other."""
    ours, anchor = list(ours), list(anchor)
    if len(anchor) == 1:
        anchor = anchor * len(ours)
    if len(ours) == 1 and len(anchor) > 1:
        ours = ours * len(anchor)
    if len(ours) != len(anchor):
        raise ValueError(
            f"ours has {len(ours)} rounds and the anchor {len(anchor)}: ratios are per round"
        )
    return ours, anchor


def summarize_measurement(m: Mapping[str, Any]) -> dict[str, Any]:
    """The measurement with ``ours_stats``, ``anchor_stats``, ``ratios``, ``ratio`` and
    ``met`` (re)computed from its rounds."""
    out = dict(m)
    out.setdefault("unit", "s")
    out.setdefault("target", None)
    ours = [float(v) for v in out.get("ours_rounds") or []]
    anchor = [float(v) for v in out.get("anchor_rounds") or []]
    out["ours_stats"] = stats(ours)
    out["anchor_stats"] = stats(anchor)
    ratios = round_ratios(ours, anchor)
    out["ratios"] = ratios
    out["ratio"] = stats(ratios)
    target = out["target"]
    out["met"] = (
        None if target is None or out["ratio"] is None else out["ratio"]["median"] <= target
    )
    return out


def summarize(result: Mapping[str, Any], name: str) -> Result:
    """A benchmark's result with every measurement summarized and the defaults filled in."""
    out = dict(result)
    out.setdefault("name", name)
    out.setdefault("title", name)
    out.setdefault("description", "")
    out.setdefault("params", {})
    out.setdefault("series", [])
    out.setdefault("notes", [])
    out["measurements"] = [summarize_measurement(m) for m in result.get("measurements", [])]
    return out


# --- registry ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A registered benchmark: where its ``run`` lives and what the size knob passes to it."""

    name: str
    module: str
    summary: str
    #: keyword arguments of ``run`` for each size (``rounds`` is added by the harness)
    sizes: Mapping[str, Mapping[str, Any]]
    #: turns what ``run`` returns into the result shape, for modules that return another shape
    adapter: str | None = None
    #: words that identify a hand-written section of the page this benchmark's results replace
    headings: tuple[str, ...] = ()
    uses_spark: bool = False
    #: rounds per size when the command line does not say (else `DEFAULT_ROUNDS`)
    rounds: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def default_rounds(self, size: str) -> int:
        return self.rounds.get(size, DEFAULT_ROUNDS[size])

    def load(self) -> Callable[..., Any]:
        return importlib.import_module(self.module).run  # type: ignore[no-any-return]

    def adapt(self, raw: Any) -> Result:
        if self.adapter is None:
            return dict(raw)
        module, _, func = self.adapter.rpartition(".")
        return getattr(importlib.import_module(module), func)(raw)  # type: ignore[no-any-return]


def run_benchmark(bench: Benchmark, size: str, rounds: int) -> Result:
    """Run one benchmark at ``size`` and return its summarized result, stamped."""
    started = time.time()
    raw = bench.load()(**dict(bench.sizes[size]), rounds=rounds)
    result = summarize(bench.adapt(raw), bench.name)
    result["size"] = size
    result["rounds"] = rounds
    result["seconds"] = round(time.time() - started, 1)
    result["date"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["machine"] = machine()
    return result


def machine() -> dict[str, Any]:
    """Where a result was measured (no paths, no host names)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "commit": _git_commit(),
    }
    for package in ("pyarrow", "pyspark", "deltalake"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:  # not installed: leave it out
            continue
    mem = _memory_gib()
    if mem is not None:
        info["memory_gib"] = mem
    return info


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        return None
    return None


# --- the record ----------------------------------------------------------------------------


def empty_record() -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "runs": {size: {} for size in SIZES}}


def load_record(path: Path) -> dict[str, Any]:
    if not path.exists():
        return empty_record()
    record = json.loads(path.read_text())
    if record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{path}: record format {record.get('format')}, expected {RECORD_FORMAT}")
    for size in SIZES:
        record["runs"].setdefault(size, {})
    return record


def save_record(record: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")


def merge(record: Mapping[str, Any], results: Iterable[Result]) -> dict[str, Any]:
    """The record with each result replacing the one of the same benchmark and size."""
    out = {"format": RECORD_FORMAT, "runs": {s: dict(record["runs"].get(s, {})) for s in SIZES}}
    for r in results:
        out["runs"][r["size"]][r["name"]] = r
    return out


def shown(record: Mapping[str, Any]) -> dict[str, Result]:
    """The result shown on the page for each benchmark: full size, else quick."""
    out: dict[str, Result] = {}
    for size in ("quick", "full"):
        out.update(record["runs"].get(size, {}))
    return out


# --- the regression check ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One ratio of a fresh run against the record (both ``ours / anchor``, lower is better).

    ``recorded``/``fresh`` are the medians over the rounds, ``*_range`` the (min, max) of the
    per-round ratios. A ratio is *worse* only when both hold: its median rose by more than
    the tolerance, and every fresh round is worse than every recorded round (the ranges do
    not overlap). The second condition is what keeps the check from failing on noise: quick
    runs of a few rounds swing by more than the tolerance on a shared machine (identical code
    measured twice flagged ten ratios of about sixty), while a real regression moves the
    whole range. With one round on each side it reduces to the median test.

    A ratio is only as steady as its anchor: when the anchor itself ran faster than recorded
    by the same rule (median faster by more than the tolerance, every fresh round faster
    than every recorded one), the comparison is *inconclusive*, reported and not failed.
    TPC-H's q12 against Spark parquet, identical code twice: ours 1.14 s to 1.25 s, then
    0.90 s to 1.38 s, while the parquet anchor went from 0.80 s to 1.00 s to 0.46 s to
    0.64 s. A regression of ours that coincides with such a shift of the anchor goes
    unreported in that run; the report says which ratios were inconclusive.
    """

    benchmark: str
    what: str
    ours: str
    anchor: str
    recorded: float | None
    fresh: float | None
    recorded_range: tuple[float, float] | None = None
    fresh_range: tuple[float, float] | None = None
    recorded_anchor: tuple[float, float, float] | None = None  # median, min, max
    fresh_anchor: tuple[float, float, float] | None = None

    @property
    def change(self) -> float | None:
        """Fractional change of the ratio median: +0.25 is 25% worse."""
        if self.recorded is None or self.fresh is None or self.recorded == 0:
            return None
        return self.fresh / self.recorded - 1.0

    @property
    def apart(self) -> bool:
        """Whether every fresh round is worse than every recorded round (True when either
        side's rounds are unknown: then only the median decides)."""
        if self.recorded_range is None or self.fresh_range is None:
            return True
        return self.fresh_range[0] > self.recorded_range[1]

    def anchor_faster(self, tolerance: float = TOLERANCE) -> bool:
        """Whether the anchor itself ran faster than recorded, beyond its rounds' spread."""
        if self.recorded_anchor is None or self.fresh_anchor is None:
            return False
        (old_median, old_min, _), (new_median, _, new_max) = self.recorded_anchor, self.fresh_anchor
        return new_median < old_median * (1.0 - tolerance) and new_max < old_min

    def _rose(self, tolerance: float) -> bool:
        """The ratio's own rule: median worse by more than the tolerance, ranges apart."""
        change = self.change
        return change is not None and change > tolerance and self.apart

    def inconclusive(self, tolerance: float = TOLERANCE) -> bool:
        """Worse by the ratio's rule, but the anchor moved (see the class doc)."""
        return self._rose(tolerance) and self.anchor_faster(tolerance)

    def worse(self, tolerance: float = TOLERANCE) -> bool:
        return self._rose(tolerance) and not self.anchor_faster(tolerance)


def _ratio_summary(m: Mapping[str, Any] | None) -> tuple[float | None, tuple[float, float] | None]:
    """The median and the (min, max) of a measurement's per-round ratios (None if unknown)."""
    ratio = None if m is None else summarize_measurement(m)["ratio"]
    if ratio is None:
        return None, None
    return float(ratio["median"]), (float(ratio["min"]), float(ratio["max"]))


def _anchor_summary(m: Mapping[str, Any] | None) -> tuple[float, float, float] | None:
    """The median, min and max of a measurement's anchor rounds (None if it has none)."""
    rounds = [float(v) for v in (m or {}).get("anchor_rounds") or []]
    if not rounds:
        return None
    return statistics.median(rounds), min(rounds), max(rounds)


def _key(m: Mapping[str, Any]) -> tuple[str, str, str]:
    return (m["what"], m["ours"], m["anchor"])


def compare(recorded: Mapping[str, Result], fresh: Mapping[str, Result]) -> list[Comparison]:
    """Every ratio of ``fresh`` next to the recorded ratio of the same benchmark, operation,
    contender and anchor (recorded None when the record has no such ratio)."""
    out = []
    for name, result in fresh.items():
        old = {_key(m): m for m in recorded.get(name, {}).get("measurements", [])}
        for m in result.get("measurements", []):
            before = old.get(_key(m))
            recorded_median, recorded_range = _ratio_summary(before)
            fresh_median, fresh_range = _ratio_summary(m)
            out.append(
                Comparison(
                    name,
                    m["what"],
                    m["ours"],
                    m["anchor"],
                    recorded_median,
                    fresh_median,
                    recorded_range,
                    fresh_range,
                    _anchor_summary(before),
                    _anchor_summary(m),
                )
            )
    return out


def pool(first: Result, second: Result) -> Result:
    """``first`` with the rounds of ``second`` (a repeat run of the same benchmark) added to
    every measurement both have: ``--check`` confirms a suspected regression on the pooled
    rounds, so a chance split of three rounds against three is not reported."""
    again = {_key(m): m for m in second.get("measurements", [])}
    measurements = []
    for m in first.get("measurements", []):
        other = again.get(_key(m))
        if other is None:
            measurements.append(m)
            continue
        rounds: dict[str, list[float]] = {"ours_rounds": [], "anchor_rounds": []}
        for side in (m, other):
            ours = [float(v) for v in side.get("ours_rounds") or []]
            anchor = [float(v) for v in side.get("anchor_rounds") or []]
            if ours and anchor:  # a skipped measurement has no rounds to pair
                ours, anchor = paired_rounds(ours, anchor)
            rounds["ours_rounds"] += ours
            rounds["anchor_rounds"] += anchor
        measurements.append(summarize_measurement({**m, **rounds}))
    return {**first, "measurements": measurements}


def check_report(comparisons: Sequence[Comparison], tolerance: float = TOLERANCE) -> str:
    """A plain-text table of the comparisons, regressions marked."""

    def spread(r: tuple[float, float] | None) -> str:
        return "" if r is None else f"{r[0]:.2f}-{r[1]:.2f}"

    lines = [
        f"{'benchmark':<12} {'what':<48} {'ours':<24} {'anchor':<22} {'record':>7} "
        f"{'rounds':>11} {'fresh':>7} {'rounds':>11} change"
    ]
    for c in comparisons:
        rec = "-" if c.recorded is None else f"{c.recorded:.2f}"
        new = "-" if c.fresh is None else f"{c.fresh:.2f}"
        change = c.change
        verdict = "" if change is None else f"{change:+.0%}"
        if c.worse(tolerance):
            verdict += f"  WORSE by more than {tolerance:.0%}"
        elif c.inconclusive(tolerance):
            verdict += "  (the anchor ran faster than recorded: inconclusive)"
        elif change is not None and change > tolerance:
            verdict += "  (rounds overlap the record's: noise)"
        lines.append(
            f"{c.benchmark:<12} {c.what[:48]:<48} {c.ours[:24]:<24} {c.anchor[:22]:<22} "
            f"{rec:>7} {spread(c.recorded_range):>11} {new:>7} {spread(c.fresh_range):>11} "
            f"{verdict}"
        )
    worse = [c for c in comparisons if c.worse(tolerance)]
    unsure = [c for c in comparisons if c.inconclusive(tolerance)]
    if unsure:
        lines.append(
            f"{len(unsure)} ratio(s) inconclusive: worse, but their anchor ran faster than "
            "recorded beyond its spread"
        )
    lines.append(
        f"{len(worse)} ratio(s) worse than the record by more than {tolerance:.0%}, every "
        "fresh round worse than every recorded one"
        if worse
        else f"no ratio worse than the record by more than {tolerance:.0%} beyond the rounds' "
        "spread"
    )
    return "\n".join(lines)


# --- the page ------------------------------------------------------------------------------

GENERATED = (
    "<!-- Generated by `python -m benchmarks` from docs/benchmarks.json. Edit only between "
    "notes markers; everything else is rewritten. -->"
)
_BENCH_BLOCK = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->.*?<!-- /bench:(?P=name) -->\n?", re.S)
_NOTES_BLOCK = re.compile(
    r"<!-- notes:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /notes:(?P=name) -->", re.S
)


def _fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if unit == "bytes":
        for scale, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if v >= scale:
                return f"{v / scale:.1f} {suffix}"
        return f"{v:.0f} B"
    return f"{v:.3g} {unit}"


def _fmt_ratio(v: float) -> str:
    return f"{v:.2f}x"


def section_table(result: Mapping[str, Any]) -> list[str]:
    lines = [
        "| what | ours | anchor | median ours | median anchor | ratio median | ratio min to max "
        "| target | met |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for m in result["measurements"]:
        unit = m.get("unit", "s")
        if m.get("skipped"):
            lines.append(
                f"| {m['what']} | {m['ours']} | {m['anchor']} | skipped: {m['skipped']} "
                f"| | | | {_target(m)} | |"
            )
            continue
        o, a, r = m["ours_stats"], m["anchor_stats"], m["ratio"]
        met = {True: "yes", False: "**no**", None: ""}[m["met"]]
        lines.append(
            f"| {m['what']} | {m['ours']} | {m['anchor']} "
            f"| {_fmt_value(o and o['median'], unit)} | {_fmt_value(a and a['median'], unit)} "
            f"| {_fmt_ratio(r['median']) if r else '-'} "
            f"| {(_fmt_ratio(r['min']) + ' to ' + _fmt_ratio(r['max'])) if r else '-'} "
            f"| {_target(m)} | {met} |"
        )
    return lines


def _target(m: Mapping[str, Any]) -> str:
    t = m.get("target")
    return "" if t is None else f"≤ {t:g}x"


def render_section(result: Mapping[str, Any], notes: str | None, images: Mapping[str, str]) -> str:
    name = result["name"]
    mach = result.get("machine", {})
    size_label = "" if result.get("size") == "full" else " (quick size)"
    lines = [f"<!-- bench:{name} -->", f"## {result['title']}{size_label}", ""]
    if result.get("description"):
        lines += [result["description"].strip(), ""]
    params = ", ".join(f"{k}={v}" for k, v in result.get("params", {}).items())
    lines += [
        f"`python -m benchmarks {name} --size {result.get('size', '?')}`: "
        f"{result.get('rounds', '?')} rounds{'; ' + params if params else ''}. "
        f"Measured {result.get('date', '?')} at commit {mach.get('commit', '?')}, "
        f"{mach.get('cpus', '?')} CPUs.",
        "",
    ]
    lines += section_table(result)
    lines.append("")
    for m in result["measurements"]:
        if m.get("note"):
            lines.append(f"- {m['ours']} vs {m['anchor']}, {m['what']}: {m['note']}")
    for note in result.get("notes", []):
        lines.append(f"- {note}")
    if any(m.get("note") for m in result["measurements"]) or result.get("notes"):
        lines.append("")
    for series in result.get("series", []):
        image = images.get(series["id"])
        if image:
            lines += [f"![{series['title']}]({image})", ""]
    lines.append(f"<!-- notes:{name} -->")
    if notes and notes.strip():
        lines.append(notes.rstrip("\n"))
    lines += [f"<!-- /notes:{name} -->", f"<!-- /bench:{name} -->", ""]
    return "\n".join(lines)


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``(before the first '## ', [(heading, whole section text), ...])`` of markdown with
    the generated blocks already removed."""
    parts = re.split(r"(?m)^(?=## )", text)
    head = parts[0] if parts and not parts[0].startswith("## ") else ""
    sections = []
    for p in parts:
        if p.startswith("## "):
            sections.append((p.splitlines()[0][3:].strip(), p))
    return head, sections


def hand_written_sections(
    old_page: str, results: Mapping[str, Result], registry: Sequence[Benchmark]
) -> tuple[list[str], dict[str, list[str]]]:
    """The sections of ``old_page`` outside the generated blocks: ``(kept, replaced)``.

    A section is replaced when a benchmark with results claims it (one of its ``headings``
    words occurs in the section's heading); ``replaced`` maps the benchmark to those
    sections, whose words move into its notes block. Every other section is kept verbatim.
    """
    without = _BENCH_BLOCK.sub("", old_page)
    _head, sections = split_sections(without)
    replacing = [b for b in registry if b.name in results]
    kept: list[str] = []
    replaced: dict[str, list[str]] = {}
    for heading, body in sections:
        h = heading.lower()
        owner = next((b for b in replacing if any(w.lower() in h for w in b.headings)), None)
        if owner is None:
            kept.append(body.rstrip("\n") + "\n")
        else:
            replaced.setdefault(owner.name, []).append(body)
    return kept, replaced


def carried_notes(sections: Sequence[str]) -> str:
    """Hand-written sections a generated one replaces, as notes: their text verbatim under a
    heading that says where it came from (its figures are from the run it was written for)."""
    out = []
    for body in sections:
        heading, _, rest = body.partition("\n")
        out += [
            f'### Notes carried over from the hand-written section "{heading[3:].strip()}"',
            "",
            "(Its figures are from the run it was written for; the table above is the record.)",
            "",
            rest.strip("\n"),
            "",
        ]
    return "\n".join(out)


def old_notes(old_page: str) -> dict[str, str]:
    return {m["name"]: m["body"] for m in _NOTES_BLOCK.finditer(old_page)}


def render_page(
    record: Mapping[str, Any],
    registry: Sequence[Benchmark],
    old_page: str = "",
    images: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """docs/benchmarks.md from the record, keeping the old page's notes blocks and its
    hand-written sections that no result replaces yet."""
    results = shown(record)
    images = images or {}
    order = [b.name for b in registry if b.name in results] + sorted(
        n for n in results if n not in {b.name for b in registry}
    )
    lines = [
        "# Benchmarks",
        "",
        "<!-- bench:header -->",
        GENERATED,
        "",
        "How persistshard compares with what you would use instead. Every benchmark runs our "
        "code and its anchor in the same process (a fresh one per benchmark), alternating, for "
        "several rounds (after a warm-up round); the tables give medians and the **ratio "
        "ours / anchor per round** (median, min and max). Lower is better; 1.00x is parity. "
        "The machines these ran on are shared and noisy, so the side-by-side ratio is the "
        "figure that counts, not the absolute times.",
        "",
        "## How to run",
        "",
        "```",
        "pip install -e '.[bench]'               # matplotlib (plots), deltalake (the peer)",
        "python -m benchmarks --size quick        # every benchmark, laptop size",
        "python -m benchmarks spark --size full   # one benchmark at the size of the figures",
        "python -m benchmarks --check             # fresh run vs docs/benchmarks.json: exit 1 if a"
        " ratio got >20% worse, all rounds beyond the record's, its anchor steady",
        "python -m benchmarks --render            # only regenerate this page from the JSON",
        "```",
        "",
        "Results go to `docs/benchmarks.json` (one record per benchmark and size) and to this "
        "page, which shows the full-size figures where there are any. The default storage is "
        "local files.",
        "",
        "## Summary",
        "",
        "| benchmark | what | ours | anchor | ratio median | target | met |",
        "| --- | --- | --- | --- | ---: | ---: | :---: |",
    ]
    for name in order:
        for m in results[name]["measurements"]:
            if m.get("target") is None:
                continue
            r = m.get("ratio")
            met = {True: "yes", False: "**no**", None: ""}[m.get("met")]
            lines.append(
                f"| {name} | {m['what']} | {m['ours']} | {m['anchor']} "
                f"| {_fmt_ratio(r['median']) if r else 'skipped'} | {_target(m)} | {met} |"
            )
    lines += ["<!-- /bench:header -->", ""]
    intro = kept_intro(old_page)
    if intro:
        lines += [intro, ""]
    notes = old_notes(old_page)
    kept, replaced = hand_written_sections(old_page, results, registry)
    for name, sections in replaced.items():
        carried = carried_notes(sections)
        notes[name] = f"{notes[name].rstrip()}\n\n{carried}" if notes.get(name) else carried
    body = [render_section(results[n], notes.get(n), images.get(n, {})) for n in order]
    return "\n".join(lines) + "\n" + "\n".join(body + kept)


def kept_intro(old_page: str) -> str:
    """Hand-written text of ``old_page`` before its first section, without the title."""
    head, _ = split_sections(_BENCH_BLOCK.sub("", old_page))
    return "\n".join(line for line in head.splitlines() if not line.startswith("# ")).strip()


# --- plots ---------------------------------------------------------------------------------


def plot_series(
    result: Mapping[str, Any], img_dir: Path, link_prefix: str = "img"
) -> dict[str, str]:
    """Draw every series of ``result`` as a PNG in ``img_dir``; returns {series id: link}.
    Without matplotlib (the optional ``bench`` extra), draws nothing."""
    if not result.get("series"):
        return {}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Keep the links to plots drawn earlier: re-rendering the page without the
        # ``bench`` extra must not drop them.
        return {
            s["id"]: f"{link_prefix}/{result['name']}_{s['id']}.png"
            for s in result["series"]
            if (img_dir / f"{result['name']}_{s['id']}.png").exists()
        }
    from matplotlib import ticker

    img_dir.mkdir(parents=True, exist_ok=True)
    links = {}
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]
    for s in result["series"]:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        for i, (label, ys) in enumerate(s["lines"].items()):
            points = [(x, y) for x, y in zip(s["x"], ys, strict=False) if y is not None]
            if points:
                marker, dash = styles[i % len(styles)]
                # Distinct markers and dashes keep coinciding lines visible.
                ax.plot(*zip(*points, strict=True), marker=marker, linestyle=dash, label=label)
        ax.set_title(s.get("title", ""), fontsize="medium")
        ax.set_xlabel(s.get("x_label", ""))
        ax.set_ylabel(s.get("y_label", ""))
        if s.get("log_x"):
            ax.set_xscale("log")
        if s.get("x_tick_labels"):
            ax.minorticks_off()
            ax.set_xticks(s["x"], s["x_tick_labels"])
        elif all(isinstance(x, int) for x in s["x"]):
            ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        if s.get("log_y"):
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        file = f"{result['name']}_{s['id']}.png"
        fig.savefig(img_dir / file, metadata={"Software": None})
        plt.close(fig)
        links[s["id"]] = f"{link_prefix}/{file}"
    return links


def write_page(
    record: Mapping[str, Any],
    registry: Sequence[Benchmark],
    page: Path = PAGE,
    img_dir: Path | None = None,
) -> None:
    """Regenerate ``page`` (and its plots) from ``record``."""
    img_dir = img_dir or page.parent / "img"
    old = page.read_text() if page.exists() else ""
    images = {name: plot_series(r, img_dir) for name, r in shown(record).items()}
    page.write_text(render_page(record, registry, old, images))
