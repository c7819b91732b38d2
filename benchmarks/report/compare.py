"""Result files side by side (``nox -s compare -- A B ...``): matching configurations with ratios,
and figures, made from the files alone.

    python -m benchmarks compare A B ... [--results DIR] [--out DIR]

Each side is a result file or a hardware class (its newest file of each kind under
``results/runs/<class>/``). With no sides: every hardware class that has results, or, with one
class only, its two newest files of each kind. Writes ``compare.md`` and PNG figures: the memory
breakdown per configuration (the model's terms stacked, beside the measured peak), memory by phase
through a step, decode bandwidth against the device ceiling and Spark's budget, and max context
per contender.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.model.estimate import GIB
from benchmarks.report.figures import decode_figure
from benchmarks.report.tables import markdown_head
from benchmarks.report.validation import measured_phases, predict_configuration
from benchmarks.results.schema import GrpoFile, Result, load_results, read_result

KINDS = ("grpo", "decode", "context", "rewards")
PHASE_ORDER = ("setup", "rollout", "sleep_wake", "reward", "scoring", "logprob", "forward_backward", "optimizer")


@dataclass(frozen=True)
class Side:
    label: str
    files: dict[str, Result]  # kind -> file


def resolve_sides(arguments: list[str], results_dir: Path) -> list[Side]:
    """Sides from files or hardware classes; see the module's docstring for the default."""
    named_files = bool(arguments) and all(Path(a).is_file() for a in arguments)
    if named_files and not any(results_dir.glob("*/*.json")):
        results = []  # files named directly need no results directory
    else:
        results = [r for r in load_results(results_dir) if _comparable(r)]
    newest: dict[str, dict[str, Result]] = {}
    for result in results:
        newest.setdefault(result.hardware, {})[result.kind] = result
    if not arguments:
        if len(newest) >= 2:
            return [Side(hardware, files) for hardware, files in newest.items()]
        sides = [Side("newest", {}), Side("previous", {})]
        for kind in KINDS:
            runs = [r for r in results if r.kind == kind]
            if runs:
                sides[0].files[kind] = runs[-1]
            if len(runs) >= 2:
                sides[1].files[kind] = runs[-2]
        return sides[::-1]
    sides = []
    for argument in arguments:
        path = Path(argument)
        if path.is_file():
            result = read_result(path, argument)
            if result.kind not in KINDS:
                raise ValueError(f"{argument}: not a grpo-bench result file (kind {result.kind!r})")
            label = path.stem if result.complete else f"{path.stem} (incomplete: ended early)"
            sides.append(Side(label, {result.kind: result}))
        elif argument in newest:
            sides.append(Side(argument, newest[argument]))
        else:
            have = ", ".join(newest) or "none"
            raise ValueError(f"{argument}: neither a result file nor a hardware class with results (classes: {have})")
    if len(sides) < 2:
        raise ValueError("compare needs at least two sides (files or hardware classes)")
    for kind in KINDS:
        files = [side.files[kind] for side in sides if kind in side.files]
        if len({r.quick for r in files}) > 1:
            quick = ", ".join(f"{r.path} ({'--quick' if r.quick else 'full'})" for r in files)
            raise ValueError(f"{kind}: a --quick run and a full run are not like for like: {quick}")
    return sides


def _comparable(result: Result) -> bool:
    """A file with something to compare: complete, whole, not --quick; for GRPO, a configuration
    that ran."""
    if result.quick or not result.complete or not result.whole:
        return False
    return not isinstance(result.record, GrpoFile) or any(c.status == "ok" for c in result.record.configurations)


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else ""


def grpo_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["grpo"].record) for s in sides if "grpo" in s.files]
    if len(runs) < 2:
        return []
    # Like with like by lever values, not names: a name lists only the levers its profile varied, and
    # files of other versions carry levers the older ones lack; match on the levers every side records.
    recorded = [{lever for c in run.configurations for lever in c.levers} for _, run in runs]
    levers = sorted(set.intersection(*recorded))
    by_levers = [{tuple(c.levers[k] for k in levers): c for c in run.configurations} for _, run in runs]
    common = [key for key in by_levers[0] if all(key in other for other in by_levers[1:])]
    measures = sorted({c.summary.peak_measure for _, run in runs for c in run.configurations if c.summary})
    header = ["configuration"] + [f"{s.label} s/step, peak GiB" for s, _ in runs] + ["ratio s/step, peak"]
    lines = [
        f"GRPO configurations in every side ({len(common)}; shapes: "
        + ", ".join(f"{s.label} {run.shape.name}" for s, run in runs)
        + "); peak: "
        + "; ".join(measures),
        "",
        *markdown_head(header),
    ]
    for key in common:
        records = [configurations[key] for configurations in by_levers]
        cells, speeds, peaks = [], [], []
        for record in records:
            summary = record.summary
            if record.status != "ok" or summary is None:
                cells.append(record.status)
                speeds.append(None)
                peaks.append(None)
                continue
            speeds.append(summary.step_s_median)
            peaks.append(summary.peak_bytes)
            cells.append(f"{summary.step_s_median:.2f}, {summary.peak_bytes / GIB:.2f}")
        ratio = f"{_ratio(speeds[-1], speeds[0])}, {_ratio(peaks[-1], peaks[0])}"
        lines.append(f"| {records[0].name} | " + " | ".join(cells) + f" | {ratio} |")
    return lines + [""]


def _swept(side: Side) -> bool:
    return "decode" in side.files and bool(side.files["decode"].record.sweep)


def decode_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["decode"].record) for s in sides if _swept(s)]
    if len(runs) < 2:
        return []
    tables = [{(r.engine, r.batch, r.context): r for r in run.sweep if r.status == "ok"} for _, run in runs]
    common = [k for k in tables[0] if all(k in t for t in tables[1:])]
    header = ["engine, batch, context"] + [f"{s.label} GB/s (of ceiling)" for s, _ in runs] + ["ratio"]
    lines = ["Decode points in every side:", "", *markdown_head(header)]
    for key in common:
        rows = [t[key] for t in tables]
        cells = [f"{r.achieved_gb_s:.2f} ({r.efficiency_vs_ceiling:.0%})" for r in rows]
        lines.append(
            f"| {', '.join(map(str, key))} | "
            + " | ".join(cells)
            + f" | {_ratio(rows[-1].achieved_gb_s, rows[0].achieved_gb_s)} |"
        )
    return lines + [""]


def _contenders(runs: list) -> list[str]:
    return list(dict.fromkeys(c.name for _, run in runs for c in run.contenders))


def context_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["context"].record) for s in sides if "context" in s.files]
    if len(runs) < 2:
        return []
    header = ["contender"] + [f"{s.label} max tokens" for s, _ in runs] + ["ratio"]
    lines = ["Max completion tokens per contender:", "", *markdown_head(header)]
    for name in _contenders(runs):
        entries = [next((c for c in run.contenders if c.name == name), None) for _, run in runs]
        values = [entry.max_completion_tokens if entry else None for entry in entries]
        cells = [str(v) if v is not None else "-" for v in values]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_ratio(values[-1], values[0])} |")
    return lines + [""]


def rewards_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["rewards"].record) for s in sides if "rewards" in s.files]
    if len(runs) < 2:
        return []
    tables = [
        {(i.reward, i.implementation, i.batch, i.words, i.format): i.completions_per_s for i in infos}
        for infos in ([b.extra_info for b in run.benchmarks] for _, run in runs)
    ]
    common = [k for k in tables[0] if all(k in t for t in tables[1:]) and k[1] == "grpo-bench" and k[4] == "str"]
    header = ["reward, batch, words"] + [f"{s.label} completions/s" for s, _ in runs] + ["ratio"]
    lines = ["Reward throughput in every side:", "", *markdown_head(header)]
    for key in sorted(common):
        values = [t[key] for t in tables]
        lines.append(
            f"| {key[0]}, {key[2]}, {key[3]} | "
            + " | ".join(f"{v:,.0f}" for v in values)
            + f" | {_ratio(values[-1], values[0])} |"
        )
    return lines + [""]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def memory_breakdown_figure(side: Side, path: Path) -> None:
    """Per configuration: the model's training-phase terms stacked, beside the measured peak."""
    plt = _pyplot()
    run = side.files["grpo"].record
    shapes, hardware = load_shapes(), load_hardware()
    numbered = [(n, c) for n, c in enumerate(run.configurations, 1) if c.status == "ok"]
    records = [c for _, c in numbered]
    terms: dict[str, list[float]] = {}
    for index, record in enumerate(records):
        for term, value in predict_configuration(run, record, shapes, hardware).phases["training"].items():
            terms.setdefault(term, [0.0] * len(records))[index] = value / GIB
    figure, axes = plt.subplots(figsize=(max(6, 1.1 * len(records)), 4.5))
    positions = range(len(records))
    bottom = [0.0] * len(records)
    for term, values in terms.items():
        axes.bar([p - 0.2 for p in positions], values, 0.4, bottom=bottom, label=f"predicted: {term}")
        bottom = [b + v for b, v in zip(bottom, values)]
    measured = [measured_phases(r).get("training", 0) / GIB for r in records]
    axes.bar([p + 0.2 for p in positions], measured, 0.4, color="black", label="measured training peak")
    axes.set_xticks(list(positions), [str(n) for n, _ in numbered])
    axes.set(xlabel="configuration (numbered as in compare.md)", ylabel="GiB")
    axes.set_title(f"{side.label}: memory per configuration, predicted terms beside measured")
    axes.legend(fontsize=6, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def memory_by_phase_figure(side: Side, path: Path) -> None:
    """Through one measured step of each configuration: each phase's peak, at its place in time."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for number, record in enumerate(side.files["grpo"].record.configurations, 1):
        steps = [s for s in record.steps if not s.warmup]
        if record.status != "ok" or not steps:
            continue
        step = steps[-1]
        elapsed, xs, ys = 0.0, [], []
        for phase in PHASE_ORDER:
            if phase in step.phase_s and phase in step.peaks:  # device memory on CUDA, host RSS on CPU
                xs += [elapsed, elapsed + step.phase_s[phase]]
                ys += [step.peaks[phase] / GIB] * 2
                elapsed += step.phase_s[phase]
        axes.plot(xs, ys, label=f"{number}")
    axes.set(xlabel="seconds into the step (phases in order, exclusive time)", ylabel="peak GiB in the phase")
    axes.set_title(f"{side.label}: memory by phase through a measured step")
    axes.legend(fontsize=6, ncol=3, title="configuration")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def context_figure(sides: list[Side], path: Path) -> None:
    plt = _pyplot()
    runs = [(s, s.files["context"].record) for s in sides if "context" in s.files]
    names = _contenders(runs)
    figure, axes = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(runs))
    for offset, (side, run) in enumerate(runs):
        entries = {c.name: c for c in run.contenders}
        xs = [i + offset * width for i in range(len(names))]
        measured = [(entries[n].max_completion_tokens if n in entries else None) or 0 for n in names]
        predicted = [(entries[n].predicted_max_completion_tokens if n in entries else None) or 0 for n in names]
        axes.bar(xs, measured, width, label=f"{side.label}: measured")
        axes.scatter(xs, predicted, marker="_", s=300, color="black", zorder=3)
    axes.scatter([], [], marker="_", color="black", label="predicted (analytic model)")
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, fontsize=7)
    axes.set(ylabel="max completion tokens within the budget")
    axes.set_title("Max context per contender")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_comparison(sides: list[Side], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["<!-- generated by `nox -s compare` from result files: do not edit by hand -->", ""]
    lines += ["Sides: " + "; ".join(f"{s.label} ({', '.join(r.path for r in s.files.values())})" for s in sides), ""]
    for rows in (grpo_rows(sides), decode_rows(sides), context_rows(sides), rewards_rows(sides)):
        lines += rows
    figures = []
    for side in sides:
        if "grpo" in side.files and _comparable(side.files["grpo"]):
            for name, draw in (
                ("memory-breakdown", memory_breakdown_figure),
                ("memory-by-phase", memory_by_phase_figure),
            ):
                figures.append(out / f"{name}-{side.label}.png")
                draw(side, figures[-1])
        if _swept(side):
            figures.append(out / f"decode-{side.label}.png")
            decode_figure(side.files["decode"].record, figures[-1])
    if any("context" in s.files for s in sides):
        figures.append(out / "context.png")
        context_figure(sides, figures[-1])
    numbered = _numbering(sides)
    lines += numbered + ["", "Figures: " + ", ".join(f.name for f in figures)]
    table = out / "compare.md"
    table.write_text("\n".join(lines) + "\n")
    return [table, *figures]


def _numbering(sides: Iterable[Side]) -> list[str]:
    lines = []
    for side in sides:
        if "grpo" in side.files:
            lines += [f"Configurations of {side.label} as numbered in its figures:", ""]
            configurations = side.files["grpo"].record.configurations
            lines += [f"{i}. {c.name} ({c.status})" for i, c in enumerate(configurations, 1)]
            lines.append("")
    return lines
