"""Tables and figures made from result files only: never from a device, never by hand."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results.schema import DecodeFile, SchemaError, read_result
from benchmarks.run.probe import ARRAYS_TOUCHED


def decode_table(run: DecodeFile) -> str:
    """Markdown: the ceiling, the sweep, and Spark's rollout seconds per size class."""
    best = run.device_ceiling
    lines = [
        f"Measured on {run.machine.cpu} ({run.machine.cores} cores), commit {run.commit.short}, {run.started}.",
        "",
        f"Ceiling: {best.kernel} {best.median_gb_s:.1f} GB/s (median; {best.min_gb_s:.1f}-{best.max_gb_s:.1f}).",
        "",
        "| engine | batch | context | TTFT s | decode tok/s | GB/s | of ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in run.sweep:
        if row.status == "ok":
            lines.append(
                f"| {row.engine} | {row.batch} | {row.context} | {row.ttft_s:.2f} | "
                f"{row.decode_tokens_per_s:.1f} | {row.achieved_gb_s:.2f} | {row.efficiency_vs_ceiling:.0%} |"
            )
        else:
            batch, context = ("" if v is None else v for v in (row.batch, row.context))
            lines.append(f"| {row.engine} | {batch} | {context} | {row.status}: {row.reason} | | | |")
    rollout = run.projection_rollout
    spark = [r for r in run.projections if r.hardware == "spark"]
    bases = list(dict.fromkeys(r.basis for r in spark))
    lines += [
        "",
        f"Predicted rollout seconds of one GRPO step on DGX Spark ({rollout.sequences} sequences x "
        f"{rollout.completion_tokens} tokens after {rollout.prompt_tokens}-token prompts, "
        f"{rollout.dtype_bytes:g} bytes per weight and KV element; {rollout.what}):",
        "",
        "| size class | " + " | ".join(bases) + " |",
        "|---|" + "---:|" * len(bases),
    ]
    for shape in dict.fromkeys(r.shape for r in spark):
        cells = {r.basis: r.rollout_s for r in spark if r.shape == shape}
        lines.append(f"| {shape} | " + " | ".join(f"{cells[b]:.1f}" for b in bases) + " |")
    return "\n".join(lines) + "\n"


def decode_figure(run: DecodeFile, path: Path) -> None:
    """Achieved GB/s against batch per engine and context, with the device's ceiling and its
    spread, and DGX Spark's 180-192 GB/s budget and 273 GB/s spec, on a log scale."""
    import matplotlib  # optional, heavy: only where a figure is drawn
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    rows = [r for r in run.sweep if r.status == "ok"]
    for engine, context in dict.fromkeys((r.engine, r.context) for r in rows):
        line = sorted((r.batch, r.achieved_gb_s) for r in rows if (r.engine, r.context) == (engine, context))
        axes.plot(*zip(*line), marker="o", label=f"{engine}, context {context}")
    best = run.device_ceiling
    axes.axhline(best.median_gb_s, color="black", label=f"this device's ceiling ({best.kernel}, median)")
    axes.axhspan(best.min_gb_s, best.max_gb_s, color="black", alpha=0.1)
    axes.axhspan(180, 192, color="tab:red", alpha=0.25, label="DGX Spark sustained budget 180-192 GB/s")
    axes.axhline(273, color="tab:red", linestyle="--", label="DGX Spark spec 273 GB/s")
    axes.set(xscale="log", yscale="log", xlabel="batch (sequences decoded together)", ylabel="achieved GB/s")
    axes.set_xticks(sorted({r.batch for r in rows}))
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


def print_decode_summary(path: Path) -> None:
    """Every kernel of the probe, then the run's table (the same one written beside the file)."""
    run = read_result(path, str(path)).record
    for kernel in ARRAYS_TOUCHED:
        rates = getattr(run.ceiling, kernel)
        print(f"{kernel:6} {rates.median_gb_s:8.1f} GB/s (min {rates.min_gb_s:.1f}, max {rates.max_gb_s:.1f})")
    print()
    print(decode_table(run))
