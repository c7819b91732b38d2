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

import pandas as pd

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.model.memory.predict import GIB
from benchmarks.report import frames
from benchmarks.report.markdown import sizing, time_tables
from benchmarks.report.markdown.figures import decode_figure
from benchmarks.report.validation import measured_phases, predict_configuration
from benchmarks.results.schema import GrpoFile, Result, load_results, read_result

KINDS = ("grpo", "decode", "context", "rewards")


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
                raise ValueError(
                    f"{argument}: a {result.kind} result file; compare takes {', '.join(KINDS)} files "
                    "(many-ranks runs are tabled per rank in results/tables/distributed.md)"
                )
            label = path.stem if result.complete else f"{path.stem} (incomplete: ended early)"
            sides.append(Side(label, {result.kind: result}))
        elif argument in newest:
            sides.append(Side(argument, newest[argument]))
        else:
            have = ", ".join(newest) or "none"
            raise ValueError(
                f"{argument}: neither a result file nor a hardware class with results (classes: {have}); classes "
                "with no run at all compare with each other on the models' predictions"
            )
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


def _side_by_side(frames_: list[pd.DataFrame], key: list[str], labels: list[str]) -> pd.DataFrame:
    """The rows every side has, matched on ``key``: one frame, each side's columns suffixed by its label."""
    merged = frames_[0].add_suffix(f" {labels[0]}").rename(columns={f"{k} {labels[0]}": k for k in key})
    for frame, label in zip(frames_[1:], labels[1:]):
        merged = merged.merge(frame.add_suffix(f" {label}").rename(columns={f"{k} {label}": k for k in key}), on=key)
    return merged


def grpo_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["grpo"]) for s in sides if "grpo" in s.files]
    if len(runs) < 2:
        return []
    labels = [s.label for s, _ in runs]
    # Like with like by lever values, not names: a name lists only the levers its profile varied, and
    # files of other versions carry levers the older ones lack; match on the levers every side records.
    per_side = [frames.configurations([r]) for _, r in runs]
    levers = sorted(set.intersection(*({c for c in f.columns if c.startswith("lever_")} for f in per_side)))
    for frame in per_side:
        frame[levers] = frame[levers].astype(str)  # values compare as recorded (1e-06 and 1e-06, True and True)
        frame["cell"] = [
            f"{step:.2f}, {peak / GIB:.2f}" if status == "ok" and step == step else status
            for status, step, peak in zip(frame.status, frame.step_s, frame.peak_bytes)
        ]
    merged = _side_by_side([f[[*levers, "name", "cell", "step_s", "peak_bytes"]] for f in per_side], levers, labels)
    first, last = labels[0], labels[-1]
    table = pd.DataFrame({"configuration": merged[f"name {first}"]})
    for label in labels:
        table[f"{label} s/step, peak GiB"] = merged[f"cell {label}"]
    table["ratio s/step, peak"] = [
        f"{_ratio(a, b)}, {_ratio(c, d)}"
        for a, b, c, d in zip(
            merged[f"step_s {last}"],
            merged[f"step_s {first}"],
            merged[f"peak_bytes {last}"],
            merged[f"peak_bytes {first}"],
        )
    ]
    measures = sorted({m for f in per_side for m in f.peak_measure.dropna()})
    shapes = ", ".join(f"{label} {r.shape}" for label, (_, r) in zip(labels, runs))
    head = f"GRPO configurations in every side ({len(table)}; shapes: {shapes}); peak: " + "; ".join(measures)
    return [head, "", frames.markdown(table), ""]


def _ratio(value: float | None, base: float | None) -> str:
    """``value / base`` as a ratio cell; empty where either is missing (None or NaN) or zero."""
    known = value is not None and base is not None and pd.notna(value) and pd.notna(base)
    return f"{value / base:.2f}x" if known and value and base else ""


def _swept(side: Side) -> bool:
    return "decode" in side.files and bool(side.files["decode"].record.sweep)


def decode_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["decode"].record) for s in sides if _swept(s)]
    if len(runs) < 2:
        return []
    labels = [s.label for s, _ in runs]
    per_side = [frames.sweep(run).query("status == 'ok'") for _, run in runs]
    key = ["engine", "batch", "context"]
    merged = _side_by_side([f[[*key, "achieved_gb_s", "efficiency_vs_ceiling"]] for f in per_side], key, labels)
    table = pd.DataFrame(
        {"engine, batch, context": [f"{e}, {b}, {c}" for e, b, c in merged[key].itertuples(index=False)]}
    )
    for label in labels:
        table[f"{label} GB/s (of ceiling)"] = [
            f"{gb:.2f} ({share:.0%})"
            for gb, share in zip(merged[f"achieved_gb_s {label}"], merged[f"efficiency_vs_ceiling {label}"])
        ]
    first, last = f"achieved_gb_s {labels[0]}", f"achieved_gb_s {labels[-1]}"
    table["ratio"] = [_ratio(a, b) for a, b in zip(merged[last], merged[first])]
    return ["Decode points in every side:", "", frames.markdown(table), ""]


def context_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["context"].record) for s in sides if "context" in s.files]
    if len(runs) < 2:
        return []
    per_side = [frames.contenders(run).set_index("name").max_completion_tokens for _, run in runs]
    names = list(dict.fromkeys(n for tokens in per_side for n in tokens.index))
    table = pd.DataFrame({"contender": names})
    for (side, _), tokens in zip(runs, per_side):
        table[f"{side.label} max tokens"] = [frames.count(tokens.get(n), missing="-") for n in names]
    table["ratio"] = [_ratio(per_side[-1].get(n), per_side[0].get(n)) for n in names]
    return ["Max completion tokens per contender:", "", frames.markdown(table), ""]


def rewards_rows(sides: list[Side]) -> list[str]:
    runs = [(s, s.files["rewards"].record) for s in sides if "rewards" in s.files]
    if len(runs) < 2:
        return []
    labels = [s.label for s, _ in runs]
    key = ["reward", "implementation", "batch", "words", "format"]
    per_side = [frames.reward_rows(run) for _, run in runs]
    merged = _side_by_side([f[[*key, "completions_per_s"]] for f in per_side], key, labels)
    merged = merged.query("implementation == 'grpo-bench' and format == 'str'").sort_values(key, kind="stable")
    table = pd.DataFrame(
        {
            "reward, batch, words": [
                f"{r}, {b}, {w}" for r, b, w in merged[["reward", "batch", "words"]].itertuples(index=False)
            ]
        }
    )
    for label in labels:
        table[f"{label} completions/s"] = [f"{v:,.0f}" for v in merged[f"completions_per_s {label}"]]
    first, last = f"completions_per_s {labels[0]}", f"completions_per_s {labels[-1]}"
    table["ratio"] = [_ratio(a, b) for a, b in zip(merged[last], merged[first])]
    return ["Reward throughput in every side:", "", frames.markdown(table), ""]


def _pyplot():
    """matplotlib, imported only where a figure is drawn (heavy, and the tables need none)."""
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
    for number, steps in frames.phases(side.files["grpo"]).groupby("number", sort=False):
        ends = steps.seconds.cumsum()
        xs = [x for start, end in zip(ends - steps.seconds, ends) for x in (start, end)]
        ys = [y / GIB for y in steps.peak_bytes for _ in (0, 1)]  # device memory on CUDA, host RSS on CPU
        axes.plot(xs, ys, label=f"{number}")
    axes.set(xlabel="seconds into the step (phases in order, exclusive time)", ylabel="peak GiB in the phase")
    axes.set_title(f"{side.label}: memory by phase through a measured step")
    axes.legend(fontsize=6, ncol=3, title="configuration")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def context_figure(sides: list[Side], path: Path) -> None:
    plt = _pyplot()
    runs = [(s, frames.contenders(s.files["context"].record).set_index("name")) for s in sides if "context" in s.files]
    names = list(dict.fromkeys(n for _, contenders in runs for n in contenders.index))
    figure, axes = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(runs))
    for offset, (side, contenders) in enumerate(runs):
        contenders = contenders.reindex(names).fillna(
            {"max_completion_tokens": 0, "predicted_max_completion_tokens": 0}
        )
        xs = [i + offset * width for i in range(len(names))]
        axes.bar(xs, contenders.max_completion_tokens, width, label=f"{side.label}: measured")
        axes.scatter(xs, contenders.predicted_max_completion_tokens, marker="_", s=300, color="black", zorder=3)
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


def predicted_classes(arguments: list[str], results_dir: Path) -> list[str] | None:
    """The GPU classes named, where every argument is a class of the catalogue and none has a result file to
    compare: those are compared on the models' predictions; else None."""
    classes = {h.gpu_class for h in load_hardware().values() if h.memory_gib}
    with_results = {r.hardware for r in load_results(results_dir) if _comparable(r)} if results_dir.is_dir() else set()
    if len(arguments) >= 2 and all(a in classes and a not in with_results for a in arguments):
        return arguments
    return None


def write_predicted(classes: list[str], results_dir: Path, out: Path) -> list[Path]:
    """Two or more GPU classes side by side on the models' predictions, every cell labelled so: per size class the
    fewest GPUs, the lightest levers, the headroom and the seconds a step (sizing's cells)."""
    results = load_results(results_dir) if any(results_dir.glob("*/*.json")) else []
    catalog, rows = load_hardware(), []
    for size in sizing.size_classes():
        row = {"size class": size}
        for gpu_class in classes:
            _, hardware = sizing.hardware_for(gpu_class, catalog)
            rates = time_tables.class_rates(hardware, results)
            row[f"{sizing.column_name(gpu_class, catalog)}, predicted"] = sizing.short_text(
                size, gpu_class, hardware, rates
            )
        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "compare.md"
    table.write_text(
        "<!-- generated by `nox -s compare` from the models: do not edit by hand -->\n\n"
        f"Predicted by the memory and time models: no result file of {', '.join(classes)} yet. Each cell: the fewest "
        "GPUs, the lightest levers that fit, the headroom and the seconds a step (results/tables/sizing.md).\n\n"
        + frames.markdown(pd.DataFrame(rows))
        + "\n"
    )
    return [table]
