"""What the site plots and compares, made from the same records and frames as the tables: a series per metric
over every complete run (asv's way: a regression or an improvement shows as a step in a line), and each run's
and each hardware class's figures by name, for the side-by-side page."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from benchmarks.model.memory.predict import GIB
from benchmarks.report import frames
from benchmarks.report.web.svg import Point
from benchmarks.results.schema import ContextFile, DecodeFile, Result, RewardsFile
from benchmarks.run.machine import pace


def run_page(path: str) -> str:
    """A result file's page, relative to the site's root (``cpu/2026...-grpo.json`` -> ``runs/cpu/...html``)."""
    return "runs/" + path.removesuffix(".json") + ".html"


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    points: list[Point]


def series(results: list[Result]) -> list[Chart]:
    """Every metric's chart over ``results`` (every complete run, oldest first); each point links to its run's
    page (relative to the site's root, where the series page is)."""
    notes = {r.path: _note(r) for r in results}
    charts = [*_grpo_charts(results, notes), *_decode_charts(results, notes)]
    charts += [*_reward_charts(results, notes), *_context_charts(results, notes), _run_chart(results, notes)]
    return [by_machine(chart) for chart in charts if len({p.x for p in chart.points}) > 1]


def by_machine(chart: Chart) -> Chart:
    """A line per machine too: runs of one class on different CPUs are not one series (the note's second line
    names the machine)."""
    points = [replace(p, series=f"{p.series}, {p.note.splitlines()[1].split(', commit')[0]}") for p in chart.points]
    return replace(chart, points=points)


def _note(result: Result) -> str:
    machine, commit = frames.provenance(result)
    found = pace.pace_of(result.record)
    calibrated = found and found.calibration
    calibration = f"\ncalibration: Python {found.calibration.python_s * 1e3:.0f} ms" if calibrated else ""
    return f"{result.path}\n{machine}, commit {commit}{calibration}"


def _started(result: Result) -> str:
    record = result.record
    return record.datetime if isinstance(record, RewardsFile) else record.started


def _grpo_charts(results: list[Result], notes: dict[str, str]) -> list[Chart]:
    """Per lever change against its run's first configuration: the median step (from the fastest to the slowest
    measured step) and the headline peak (its spread between steps), a series per hardware class and shape."""
    found = frames.configurations([r for r in results if not r.quick])
    if found.empty:
        return []
    ran = found[found.status == "ok"]
    charts = []
    for change, group in ran.groupby("change", sort=False):
        steps, peaks = [], []
        for row in group.itertuples():
            name, href = f"{row.hardware} {row.shape}", run_page(row.file)
            steps.append(Point(name, row.started, row.step_s, row.step_s_min, row.step_s_max, href, notes[row.file]))
            peak, spread = row.peak_bytes / GIB, row.peak_spread or 0.0
            low, high = peak * (1 - spread), peak * (1 + spread)
            peaks.append(Point(name, row.started, peak, low, high, href, notes[row.file]))
        charts += [Chart(f"GRPO step, {change}", "s/step", steps), Chart(f"GRPO peak, {change}", "GiB", peaks)]
    return charts


def _decode_charts(results: list[Result], notes: dict[str, str]) -> list[Chart]:
    """Per engine, batch and context: the GB/s decode streamed (its repeats' spread is not recorded)."""
    points: dict[str, list[Point]] = {}
    for result in results:
        if not isinstance(result.record, DecodeFile) or not result.record.sweep:
            continue
        name = f"{result.hardware} {result.record.profile.decode.shape} {result.record.profile.decode.dtype}"
        for point in frames.sweep(result.record).query("status == 'ok'").itertuples():
            title = f"decode, {point.engine}, batch {point.batch}, context {point.context}"
            href, note = run_page(result.path), notes[result.path]
            points.setdefault(title, []).append(
                Point(name, _started(result), point.achieved_gb_s, href=href, note=note)
            )
    return [Chart(title, "GB/s", found) for title, found in points.items()]


def _reward_charts(results: list[Result], notes: dict[str, str]) -> list[Chart]:
    """Per reward of ours (plain-text completions, its largest batch, fewest words): completions/s at the median
    round, from the slower to the faster quartile."""
    points: dict[str, list[Point]] = {}
    for result in results:
        if not isinstance(result.record, RewardsFile) or result.quick:
            continue
        rows = [b for b in result.record.benchmarks if b.extra_info.implementation == "grpo-bench"]
        rows = [b for b in rows if b.extra_info.format == "str"]
        largest = {}
        for row in sorted(rows, key=lambda b: (b.extra_info.batch, -b.extra_info.words)):
            largest[row.extra_info.reward] = row
        for reward, row in largest.items():
            info, stats = row.extra_info, row.stats
            low = info.batch / (stats.median + stats.iqr / 2)
            high = info.batch / max(stats.median - stats.iqr / 2, 1e-12)
            title = f"reward, {reward} (batch {info.batch}, {info.words} words)"
            href, note = run_page(result.path), notes[result.path]
            point = Point(result.hardware, _started(result), info.completions_per_s, low, high, href, note)
            points.setdefault(title, []).append(point)
    return [Chart(title, "completions/s", found) for title, found in points.items()]


def _context_charts(results: list[Result], notes: dict[str, str]) -> list[Chart]:
    """Per contender: the longest completion one step fitted, a series per class, shape and budget."""
    points: dict[str, list[Point]] = {}
    for result in results:
        if not isinstance(result.record, ContextFile):
            continue
        search = result.record.search
        name = f"{result.hardware} {result.shape} {search.dtype}, {search.budget_gib:g} GiB"
        for entry in result.record.contenders:
            if entry.status == "measured" and entry.max_completion_tokens:
                points.setdefault(f"max context, {entry.name}", []).append(
                    Point(
                        name,
                        result.record.started,
                        entry.max_completion_tokens,
                        entry.max_completion_tokens,
                        entry.first_failing_tokens or entry.max_completion_tokens,
                        run_page(result.path),
                        notes[result.path] + "\n(bar: up to the first length that failed)",
                    )
                )
    return [Chart(title, "completion tokens", found) for title, found in points.items()]


def _run_chart(results: list[Result], notes: dict[str, str]) -> Chart:
    """The whole run's minutes, from the last part of each run that recorded its pace, a series per profile."""
    points = []
    for result in results:
        found = pace.pace_of(result.record)
        if found is not None and found.run_s:
            name = pace.profile_name(result.record) + (" --quick" if result.quick else "")
            note = notes[result.path]
            points.append(Point(name, _started(result), found.run_s / 60, href=run_page(result.path), note=note))
    return Chart("whole run", "minutes", points)


def figures_by_name(results: list[Result]) -> dict[str, tuple[float, str]]:
    """A run's (or a class's newest runs') figures by name, with their units: what the side-by-side page shows."""
    figures: dict[str, tuple[float, str]] = {}
    configurations = frames.configurations([r for r in results if r.kind == "grpo"])
    for row in configurations.itertuples() if not configurations.empty else ():
        if row.status == "ok":
            figures[f"GRPO {row.shape}, {row.change}: step"] = (row.step_s, "s/step")
            figures[f"GRPO {row.shape}, {row.change}: peak"] = (row.peak_bytes / GIB, "GiB")
    ranks = frames.ranks([r for r in results if r.kind == "distributed"])
    for row in ranks.itertuples() if not ranks.empty else ():
        if row.status == "ok" and not pd.isna(row.peak_bytes):
            figures[f"ranks {row.configuration}, rank {row.rank_number}: step"] = (row.step_s, "s/step")
            figures[f"ranks {row.configuration}, rank {row.rank_number}: peak"] = (row.peak_bytes / GIB, "GiB")
    for result in results:
        record = result.record
        if isinstance(record, DecodeFile):
            for p in frames.sweep(record).query("status == 'ok'").itertuples():
                figures[f"decode {record.profile.decode.shape}, {p.engine}, batch {p.batch}, context {p.context}"] = (
                    p.achieved_gb_s,
                    "GB/s",
                )
        elif isinstance(record, RewardsFile):
            for r in frames.reward_rows(record).itertuples():
                key = f"reward {r.reward} ({r.implementation}), batch {r.batch}, {r.words} words, {r.format}"
                figures[key] = (r.completions_per_s, "completions/s")
        elif isinstance(record, ContextFile):
            for c in frames.contenders(record).itertuples():
                if c.status == "measured" and not pd.isna(c.max_completion_tokens):
                    key = f"context {result.shape} {record.search.budget_gib:g} GiB, {c.name}"
                    figures[key] = (float(c.max_completion_tokens), "completion tokens")
    return figures
