"""Tables and figures made from result files only: never from a device, never by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.catalog.profiles import load_hardware
from benchmarks.report import frames
from benchmarks.results.schema import DecodeFile, SchemaError, read_result


def decode_table(run: DecodeFile) -> str:
    """Markdown: the ceiling, the sweep, and Spark's rollout seconds per size class."""
    best = run.device_ceiling
    points = frames.sweep(run)
    ok = points.status == "ok"

    def measured(column: str, spec: str) -> list[str]:
        return [format(v, spec) if good else "" for v, good in zip(points[column], ok)]

    sweep = pd.DataFrame(
        {
            "engine": points.engine,
            "batch": [frames.count(b) for b in points.batch],
            "context": [frames.count(c) for c in points.context],
            # a point that did not run says why in the first measured column
            "TTFT s": [
                f"{t:.2f}" if good else f"{s}: {r}"
                for t, good, s, r in zip(points.ttft_s, ok, points.status, points.reason)
            ],
            "decode tok/s": measured("decode_tokens_per_s", ".1f"),
            "GB/s": measured("achieved_gb_s", ".2f"),
            "of ceiling": measured("efficiency_vs_ceiling", ".0%"),
        }
    )
    spark = frames.projections(run).query("hardware == 'spark'")
    rollout = spark.pivot_table(index="size", columns="basis", values="rollout_s", aggfunc="last", sort=False)
    rollout = rollout.map(lambda v: f"{v:.1f}")
    rollout.insert(0, "size class", rollout.index)
    shape = run.projection_rollout
    lines = [
        f"Measured on {measured_on(run)}, commit {run.commit.short}, {run.started}.",
        "",
        f"Ceiling: {best.kernel} {best.median_gb_s:.1f} GB/s (median; {best.min_gb_s:.1f}-{best.max_gb_s:.1f}).",
        "",
        frames.markdown(sweep, numeric=("batch", "context", "TTFT s", "decode tok/s", "GB/s", "of ceiling")),
        "",
        f"Predicted rollout seconds of one GRPO step on DGX Spark ({shape.sequences} sequences x "
        f"{shape.completion_tokens} tokens after {shape.prompt_tokens}-token prompts, "
        f"{shape.dtype_bytes:g} bytes per weight and KV element; {shape.what}):",
        "",
        frames.markdown(rollout, numeric=tuple(rollout.columns[1:])),
    ]
    return "\n".join(lines) + "\n"


def measured_on(run: DecodeFile) -> str:
    """The device a decode run measured: its GPU where the run had one (the host beside it), else the CPU."""
    host = f"{run.machine.cpu} ({run.machine.cores} cores)"
    gpus = run.machine.gpus
    return f"{gpus[0].name} ({gpus[0].memory_gib:g} GiB; host {host})" if gpus else host


def decode_figure(run: DecodeFile, path: Path) -> None:
    """Achieved GB/s against batch per engine and context, with the device's ceiling and its spread, and its
    class's spec and sustained budget where profiles/hardware.toml has them (an H200's spec, not Spark's band:
    Spark appears in the table's projection), on a log scale."""
    import matplotlib  # optional, heavy: only where a figure is drawn
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    points = frames.sweep(run).query("status == 'ok'")
    for (engine, context), line in points.groupby(["engine", "context"], sort=False):
        line = line.sort_values(["batch", "achieved_gb_s"])
        axes.plot(line.batch, line.achieved_gb_s, marker="o", label=f"{engine}, context {context}")
    best = run.device_ceiling
    axes.axhline(best.median_gb_s, color="black", label=f"this device's ceiling ({best.kernel}, median)")
    axes.axhspan(best.min_gb_s, best.max_gb_s, color="black", alpha=0.1)
    own = load_hardware().get(run.profile.hardware)  # this class's spec and budget only; Spark's is a projection
    if own and own.sustained_bandwidth_gb_s:
        low, high = own.sustained_bandwidth_gb_s
        axes.axhspan(
            low, high, color="tab:red", alpha=0.25, label=f"{own.name}: sustained budget {low:g}-{high:g} GB/s"
        )
    if own and own.spec_bandwidth_gb_s:
        spec = own.spec_bandwidth_gb_s
        axes.axhline(spec, color="tab:red", linestyle="--", label=f"{own.name}: spec {spec:g} GB/s")
    axes.set(xscale="log", yscale="log", xlabel="batch (sequences decoded together)", ylabel="achieved GB/s")
    axes.set_xticks(sorted(points.batch.unique()))
    axes.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes.set_title(f"Decode bandwidth: {run.profile.decode.shape} shape, {run.profile.decode.dtype}")
    axes.legend(fontsize=7, loc="center left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_decode_report(result_path: Path) -> tuple[Path, Path]:
    """The table (markdown) and the figure (PNG) beside a decode result file."""
    run = read_result(result_path, str(result_path)).record
    if not isinstance(run, DecodeFile) or not run.sweep or run.device_ceiling is None:
        raise SchemaError(f"{result_path}: not a decode result with a sweep")
    table, image = result_path.with_suffix(".md"), result_path.with_suffix(".png")
    table.write_text(decode_table(run))
    decode_figure(run, image)
    return table, image
