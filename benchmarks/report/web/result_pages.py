"""The site's page per result file (``runs/<class>/<file>.html``, beside the file itself): where and when it ran,
from which commit, its targets, and what it measured, by kind; and the runs list and memory figure the other
pages share."""

from __future__ import annotations

from html import escape

import pandas as pd

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.model.memory.predict import GIB
from benchmarks.report import frames
from benchmarks.report.time_validation import TimeCheck
from benchmarks.report.validation import validate
from benchmarks.report.web import plotted, svg
from benchmarks.results.schema import ContextFile, DecodeFile, GrpoFile, Result, RewardsFile
from benchmarks.run.machine import pace


def run_pages(
    results: list[Result], figures: dict[str, list[str]], timed: list[TimeCheck]
) -> dict[str, tuple[str, str]]:
    """A page per result file; ``figures``: the images a run wrote beside its file, by the file's path;
    ``timed``: the time model against every measured configuration (``time_validation.validate_time``)."""
    found = {plotted.run_page(r.path): (r.path, run_body(r, figures.get(r.path, []), timed)) for r in results}
    found["runs/index.html"] = ("Every result file", runs_list(results, up="../"))
    return found


def runs_list(results: list[Result], up: str) -> str:
    """Newest first: each file linked to its page, with its kind, class, machine, commit and state."""
    rows = []
    for result in reversed(results):
        machine, commit = frames.provenance(result)
        state = "complete" if result.complete else "ended early"
        state += " (--quick)" if result.quick else ""
        link = f'<a href="{up}{plotted.run_page(result.path)}">{escape(result.path)}</a>'
        cells = [link, result.kind, result.hardware, escape(machine), escape(commit), result.date, state]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("file", "kind", "class", "machine", "commit", "date", "state"))
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def run_body(result: Result, figures: list[str], timed: list[TimeCheck]) -> str:
    name = result.path.rsplit("/", 1)[-1]
    parts = [_header(result), f'<p>The file itself: <a href="{name}">{escape(name)}</a>.</p>']
    record = result.record
    if isinstance(record, GrpoFile):
        parts += [_configurations(result), memory_figure([result], "../../"), time_figure([result], timed, "../../")]
    elif isinstance(record, DecodeFile):
        parts.append(_html(frames.sweep(record)))
    elif isinstance(record, ContextFile):
        parts.append(_html(frames.contenders(record)))
        parts.append(f"<p>Verdict: {escape(record.verdict.text)}</p>" if record.verdict else "")
    elif isinstance(record, RewardsFile):
        parts.append(_html(frames.reward_rows(record)))
    parts += [
        f'<p><img src="{escape(f)}" alt="{escape(f)}: a figure this run made" class="chart"></p>' for f in figures
    ]
    return "\n".join(parts)


def _size(result: Result) -> str:
    """The size class a run measured, with its parameters, where it names one."""
    shape = result.shape
    if not shape or shape not in load_shapes():
        return "(none: not a model run)" if not shape else shape
    return f"{shape} ({load_shapes()[shape].param_count() / 1e9:.3g}B parameters)"


def _header(result: Result) -> str:
    machine, commit = frames.provenance(result)
    record = result.record
    found = pace.pace_of(record)
    rows = {
        "kind": result.kind,
        "model size": _size(result),
        "hardware class": result.hardware,
        "machine": machine,
        "commit": commit,
        "date": result.date,
        "state": ("complete" if result.complete else "ended early") + (", --quick" if result.quick else ""),
        "profile": pace.profile_name(record),
        "part's time": pace.clock(found.part_s) if found else "not recorded",
    }
    targets = getattr(record, "targets", None) or getattr(getattr(record, "grpo_bench", None), "targets", [])
    table = "".join(f"<tr><th>{k}</th><td>{escape(str(v))}</td></tr>" for k, v in rows.items())
    lines = [f"<li>{escape(_target_line(t))}</li>" for t in targets]
    return f"<table>{table}</table>" + (f"<h2>Targets</h2><ul>{''.join(lines)}</ul>" if lines else "")


def _target_line(target) -> str:
    met = {True: "met", False: "MISSED", None: "not measured"}[target.met]
    return f"{target.claim}: {met}"


def _configurations(result: Result) -> str:
    found = frames.configurations([result])
    if found.empty:
        return "<p>No configuration finished.</p>"
    table = pd.DataFrame(
        {
            "configuration": found.change,
            "status": found.status,
            "s/step (fastest..slowest)": [_range(r.step_s, r.step_s_min, r.step_s_max) for r in found.itertuples()],
            "rollout share": found.rollout_share.map(lambda s: "" if pd.isna(s) else f"{s:.0%}"),
            "peak GiB": found.peak_bytes.map(lambda b: "" if pd.isna(b) else f"{b / GIB:.2f}"),
        }
    )
    phases = frames.phases(result)
    per_phase = ""
    if not phases.empty:  # a row per configuration, by the levers it changes, not by its number
        names = dict(enumerate(found.change, 1))
        pivot = phases.pivot(index="number", columns="phase", values="seconds").round(3)
        pivot = pivot.rename(index=names).rename_axis(index="configuration", columns=None)
        per_phase = pivot.reset_index().to_html(index=False, border=0, na_rep="")
    return _html(table) + "<h2>Seconds per phase, the last measured step</h2>" + per_phase


def _range(median: float, low: float, high: float) -> str:
    return "" if pd.isna(median) else f"{median:.2f} ({low:.2f}..{high:.2f})"


def memory_figure(results: list[Result], up: str) -> str:
    """The newest full GRPO run's training peaks per configuration: measured (bars) against the model (marks)."""
    runs = [r for r in results if r.kind == "grpo" and not r.quick]
    if not runs:
        return "<p>No GRPO run here.</p>"
    run = runs[-1]
    checks = frames.checks(validate([run], load_shapes(), load_hardware())).query("phase == 'training'")
    if checks.empty:
        return "<p>No configuration of the newest GRPO run was checked against the model.</p>"
    change = frames.configurations([run]).set_index("name").change
    rows = [
        (change[c.configuration], c.measured_bytes / GIB, c.predicted_bytes / GIB, up + plotted.run_page(run.path))
        for c in checks.itertuples()
    ]
    title = "Training peak per configuration: bar measured, mark the memory model"
    return svg.bar_chart(title, "GiB", rows, f"{run.path}, {checks.measure.iloc[0]}")


def time_figure(results: list[Result], timed: list[TimeCheck], up: str) -> str:
    """The newest full GRPO run's median step per configuration: measured (bars) against the time model (marks)."""
    runs = [r for r in results if r.kind == "grpo" and not r.quick]
    steps = [c for c in timed if runs and c.file == runs[-1].path and c.phase == "step"]
    if not steps:
        return "<p>No configuration of the newest GRPO run was timed against the model (no calibration recorded).</p>"
    change = frames.configurations(runs[-1:]).set_index("name").change
    href = up + plotted.run_page(runs[-1].path)
    rows = [(change[c.configuration], c.measured_s, c.predicted_s, href) for c in steps]
    title = "Median step per configuration: bar measured, mark the time model"
    return svg.bar_chart(title, "s", rows, f"{runs[-1].path}, each run described by its own calibration")


def _html(frame: pd.DataFrame) -> str:
    return frame.to_html(index=frame.index.name is not None, border=0, na_rep="")
