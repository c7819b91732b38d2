"""What each part prints when it ends, read back from the result file it wrote (and what ``tables`` prints of
the memory model): one home for every summary on the command line. The files hold everything; these are views."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.catalog.contenders import BASELINE, OPTIMIZED
from benchmarks.catalog.targets import MEMORY_WITHIN
from benchmarks.model.memory.predict import GIB
from benchmarks.report import validation
from benchmarks.report.markdown import figures, regenerate
from benchmarks.results import schema
from benchmarks.results.records import readable
from benchmarks.run.machine.bandwidth_probe import ARRAYS_TOUCHED
from benchmarks.run.max_context.verdict import RATIO_KINDS


def rewards(path: Path) -> None:
    """Every row's completions/s and latency, then the targets against the guide's code."""
    run = schema.read_result(path, str(path)).record
    print(f"\n{'reward':42} {'impl':10} {'batch':>5} {'words':>5} {'format':14} {'completions/s':>13}  p50/p99 s")
    for info in sorted((row.extra_info for row in run.benchmarks), key=lambda i: (i.reward, i.batch)):
        latency = (
            f"{readable(info.p50_latency_s)}/{readable(info.p99_latency_s)}" if info.p50_latency_s is not None else ""
        )
        print(
            f"{info.reward:42} {info.implementation:10} {info.batch:>5} {info.words:>5} "
            f"{info.format:14} {readable(info.completions_per_s):>13}  {latency}"
        )
    for target in run.grpo_bench.targets:
        lowest = target.lowest_ratio
        verdict = (
            "not measured"
            if lowest is None
            else f"lowest ratio {readable(lowest)}x: {'met' if target.met else 'MISSED'}"
        )
        if target.within_noise and lowest is not None:
            verdict += " (within the rows' spread)"
        print(f"target: {target.claim} (>= {target.minimum_ratio:g}x): {verdict}")


def decode(path: Path) -> None:
    """Every kernel of the probe, then the run's table (the same one written beside the file)."""
    run = schema.read_result(path, str(path)).record
    for kernel in ARRAYS_TOUCHED:
        rates = getattr(run.ceiling, kernel)
        print(
            f"{kernel:6} {readable(rates.median_gb_s):>8} GB/s "
            f"(min {readable(rates.min_gb_s)}, max {readable(rates.max_gb_s)})"
        )
    print()
    print(figures.decode_table(run))


def grpo(path: Path) -> None:
    """The targets, then each configuration's speed and peak per phase (per rank's model states), then the
    memory model beside each measured phase."""
    result = schema.read_result(path, str(path))
    run = result.record
    for target in run.targets:
        print(target.line())
    if not run.complete:
        print(f"INCOMPLETE: {run.ended_early or 'the run ended before its last configuration'}")
    phases = ("rollout", "logprob", "forward_backward", "optimizer")
    measures = {r.summary.peak_measure for r in run.configurations if r.summary}
    header = f"peak GiB by phase ({'; '.join(sorted(measures)) or 'none measured'}): " + " / ".join(phases)
    print(f"\n{'configuration':80} {'status':8} {'s/step':>7} {'tok/s':>7}  {header}")
    for record in run.configurations:
        summary = record.summary
        if record.status != "ok" or summary is None:
            print(f"{record.name:80} {record.status:8} {record.reason or record.phase or ''}")
            continue
        by_phase = " / ".join(f"{readable(summary.peak_bytes_by_phase.get(p, 0) / GIB):>5}" for p in phases)
        speed = f"{readable(summary.step_s_median):>7} {readable(summary.completion_tokens_per_s_median):>7}"
        print(f"{record.name:80} {'ok':8} {speed}  {by_phase}")
        for rank in record.ranks:
            states = rank.summary.model_states if rank.summary else None
            if states is not None:
                parts = ", ".join(
                    f"{name} {readable(getattr(states, name) / GIB)}"
                    for name in ("parameters", "master", "optimizer", "gradients")
                )
                peak = readable(rank.summary.peak_bytes / GIB)
                print(
                    f"    rank {rank.rank}: model states {readable(states.total / GIB)} GiB ({parts}); peak {peak} GiB"
                )
    lines = validation.phase_lines(result)
    print("\nthe model beside each measured phase (on CUDA: the tensors torch held in it)", *lines, sep="\n")


def context(path: Path) -> None:
    """Each contender's maximum, prediction and ratios, the model's logits share, the claims and the verdict."""
    run = schema.read_result(path, str(path)).record
    search_settings = run.search
    print(
        f"\nbudget {search_settings.budget_gib} GiB ({search_settings.budget_enforced_by}); "
        f"{run.shape.name} {search_settings.dtype}; {search_settings.searched}; "
        f"{search_settings.completions_per_step} completions per step"
    )
    header = f"{'contender':20} {'status':9} {'max tokens':>10} {'predicted':>9} {'anchored':>8} {'probes':>6}"
    print(f"{header}  ratios (measured / predicted / anchored)")
    for entry in run.contenders:
        row = (run.ratios or {}).get(entry.name, {})
        ratio_text = "  ".join(
            f"vs {ref}: " + " / ".join(_x(row.get(f"{kind}_vs_{ref}")) for kind in RATIO_KINDS)
            for ref in (BASELINE, OPTIMIZED)
        )
        if entry.status != "measured":
            print(f"{entry.name:20} {entry.status:9} {entry.reason}")
            continue
        best = entry.max_completion_tokens
        best_text = "none" if best is None else f">={best}" if entry.at_ceiling else str(best)
        print(
            f"{entry.name:20} {'measured':9} {best_text:>10} "
            f"{entry.predicted_max_completion_tokens or 'none':>9} "
            f"{entry.anchored_max_completion_tokens or 'none':>8} {len(entry.probes):>6}  {ratio_text}"
        )
    for name, share in run.prediction.items():
        print(
            f"model at {name}'s max ({share.completion_tokens} tokens): "
            f"logits {share.logits_bytes / GIB:.2f} GiB against the rest {share.rest_bytes / GIB:.2f} GiB"
        )
    errors = [
        abs(p.predicted_peak_bytes - p.peak_bytes) / p.peak_bytes
        for entry in run.contenders
        for p in entry.probes
        if p.fits and p.peak_bytes
    ]
    if errors:
        print(f"analytic peak vs measured over the fitting probes: median abs error {statistics.median(errors):.0%}")
    print(f"\nclaim (seed): {run.verdict.seed_claim}")
    print(f"claim (Unsloth): {run.verdict.unsloth_claim}")
    print(
        "predicted: the analytic model alone; anchored: its per-token terms on top of the smallest fitting "
        "probe's measured peak (its fixed part replaced by the measurement)"
    )
    print(f"verdict: {run.verdict.text}")
    if run.earlier:
        print(f"earlier search of these settings: {run.earlier.file}")
        for name, earlier in run.earlier.contenders.items():
            print(f"  {name:20} max {earlier['max_completion_tokens']} in {earlier['probes']} probes")
    for target in run.targets:
        print(target.line())


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def model_error(results_dir: Path, every_run: bool = False) -> None:
    """The memory model's median error over the fitted and the held-out configurations the tables cite."""
    results = schema.load_results(results_dir)
    _, medians = regenerate.model_table(regenerate.with_fitted_runs(regenerate.headline(results, every_run), results))
    for name, median in medians.items():
        print(
            f"analytic model, training-phase peak: median absolute error {median:.1%} over the {name} "
            f"configurations (target <= {MEMORY_WITHIN[0]:.0%}; each one in model.md)"
        )
