"""Timed GRPO steps: every configuration of a profile in its own worker process.

The parent samples the memory of the worker and its children (RSS, every 20 ms and at every
phase boundary; on CUDA also the device memory its processes hold, vLLM's included: see
``benchmarks.run.machine.nvml_gpus``) and attributes each sample to the step and phase the worker last
reported. A worker tree above the profile's memory budget is stopped and recorded as ``oom``
in its phase, one past its time limit as ``timeout``. The result file is rewritten atomically
after every configuration and says whether the run is complete, so an interrupted run keeps
everything that finished and says so.
"""

from __future__ import annotations

import fnmatch
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from benchmarks.catalog.profiles import (
    GrpoBench,
    Hardware,
    Levers,
    Profile,
    configurations,
    load_hardware,
    load_shapes,
)
from benchmarks.catalog.shapes import Shape
from benchmarks.catalog.targets import (
    DISTRIBUTED_PART_S,
    GRPO_PART_S,
    HARNESS_OVERHEAD,
    PEAK_REPEAT_SPREAD,
    ZERO3_STATES_WITHIN,
    part_limit_s,
)
from benchmarks.model.memory.placement import as_run
from benchmarks.model.memory.predict import GIB
from benchmarks.model.memory.sharding import rank_model_states
from benchmarks.model.profile_fit import predicted_fits
from benchmarks.results import schema
from benchmarks.run.ceilings import INVALID, step_fault
from benchmarks.run.grpo import cluster
from benchmarks.run.grpo.configuration import run_configuration
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.multinode import run_machines, slurm_record, submit_to_slurm
from benchmarks.run.machine import provenance
from benchmarks.run.model_dirs import materialise_recorded


def run_grpo(
    profile: Profile,
    quick: bool,
    out: Path,
    only: Sequence[str] = (),
    part: str = "grpo",
    deadline: float | None = None,
) -> Path:
    """The configurations of the profile's ``grpo`` or ``distributed`` part (those whose name matches
    a pattern of ``only``, if given), each ending by ``deadline`` where given (``within``); returns the result
    file written. The file says ``complete: false`` until the last configuration has been recorded, and why it
    ended early where it did."""
    bench = getattr(profile, part)
    assert bench is not None
    shape, hardware = load_shapes()[bench.shape], load_hardware()[profile.hardware]
    print(f"shape {bench.shape}: {shape.param_count() / 1e6:,.1f}M parameters ({shape.source}); building or reusing it")
    path = out / profile.hardware / f"{provenance.stamp()}-{part}.json"
    result = schema.GrpoFile(**provenance.header(part, profile, quick), shape=provenance.shape_record(bench.shape))
    model_dir = materialise_recorded(bench.shape, bench.dtype, bench.weights, result.built_models)
    budget = int(bench.memory_budget_gib * GIB)
    todo = [
        (name, levers)
        for name, levers in configurations(bench)
        if not only or any(fnmatch.fnmatch(name, x) for x in only)
    ]
    started = time.monotonic()
    as_given = {number: as_run(bench, levers, shape, hardware) for number, (_, levers) in enumerate(todo, 1)}
    jobs = {number: _job(bench, levers, model_dir, budget) for number, levers in as_given.items()}
    gpus, timeout_s = profile.hardware != "cpu", bench.configuration_timeout_s
    over_cap = unified_over_cap(profile, part, hardware)
    with tempfile.TemporaryDirectory() as logs, schema.marked_incomplete(path, result):
        on_slurm = cluster.kind() == "slurm"
        submitted = submit_to_slurm(jobs, budget, Path(logs), timeout_s, gpus) if on_slurm else {}
        for number, (name, _) in enumerate(todo, 1):
            print(
                f"[{number}/{len(todo)}] {progress(time.monotonic() - started, number - 1, len(todo))} {name} ...",
                end=" ",
                flush=True,
            )
            levers, job, log = as_given[number], jobs[number], Path(logs) / f"{number}.log"
            if name in over_cap:
                ran = schema.WorkerRecord(status="skipped", reason=over_cap[name])
            elif on_slurm:
                ran = slurm_record(submitted[number])
            elif levers.num_machines > 1:
                ran = run_machines(job, budget, log, timeout_s=within(timeout_s, deadline), gpus=gpus)
            else:
                ran = run_configuration(job, budget, log, timeout_s=within(timeout_s, deadline))
            configuration = _judged(name, levers, ran, shape, hardware)
            result.configurations.append(configuration)
            result.finished = schema.now()
            schema.write(path, result)
            print(_one_line(configuration), flush=True)
        wall = time.monotonic() - started
        if part == "distributed":
            result.targets = distributed_targets(result.configurations, wall, quick, shape, bench.dtype)
        else:
            result.targets = targets(result.configurations, wall, quick)
    return path


# A configuration predicted this close to its cap on unified memory may pass it: the memory model's worst held-out
# ratio on published peaks is 1.171x (results/tables/published.md, "held-out memory: worst"), taken up to 15%.
UNIFIED_MARGIN = 0.15


def unified_over_cap(profile: Profile, part: str, hardware: Hardware) -> dict[str, str]:
    """On unified memory (a class with a MemAvailable floor), the configurations the memory model predicts past
    their cap or within ``UNIFIED_MARGIN`` of it, each with the line that skips it: running the pool out can wedge the
    whole machine instead of raising an out-of-memory error, so such a configuration is not tried there."""
    if not hardware.unified_floor_gib:
        return {}
    skipped = {}
    for fit in predicted_fits(profile):
        if fit.part != part or fit.fits is None:
            continue
        if fit.fits is False:
            skipped[fit.name] = f"skipped on unified memory: the memory model predicts it past its cap ({fit.line()})"
        elif fit.peak_bytes > (1 - UNIFIED_MARGIN) * fit.capacity_bytes:
            skipped[fit.name] = (
                f"skipped on unified memory: predicted within the memory model's {UNIFIED_MARGIN:.0%} error of its "
                f"cap ({fit.line()})"
            )
    return skipped


def _judged(
    name: str, levers: Levers, ran: schema.WorkerRecord, shape: Shape, hardware: Hardware
) -> schema.Configuration:
    """The configuration as recorded; ``invalid``, with the reason, where its steps ran faster than physics allows."""
    configuration = schema.Configuration(name=name, levers=asdict(levers), **vars(ran))
    fault = step_fault(configuration.summary, shape, hardware.peak_bf16_tflops, levers.world_size)
    if configuration.status == "ok" and fault:
        configuration.status, configuration.reason = INVALID, fault
    return configuration


def within(limit_s: float, deadline: float | None) -> float:
    """A configuration's time limit, cut to end by ``deadline`` (``time.time()`` seconds) where a caller has one of
    its own; at least a second, so that a configuration started late is still recorded as the timeout it is."""
    return limit_s if deadline is None else max(1.0, min(limit_s, deadline - time.time()))


def _job(bench: GrpoBench, levers: Levers, model_dir: Path, budget: int) -> Job:
    return Job(
        levers=levers,
        model_dir=str(model_dir),
        dtype=bench.dtype,
        warmup_steps=bench.warmup_steps,
        measured_steps=bench.measured_steps,
        prompt_words=bench.prompt_words,
        weights=bench.weights,
        memory_budget_bytes=budget,
    )


def progress(elapsed_s: float, done: int, total: int) -> str:
    """Elapsed time, and the time left at the pace so far (the mean of the configurations done)."""

    def clock(seconds: float) -> str:
        return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"

    left = f", ~{clock(elapsed_s / done * (total - done))} left" if done else ""
    return f"({clock(elapsed_s)} elapsed{left})"


def targets(records: list[schema.Configuration], wall_s: float, quick: bool) -> list[schema.Target]:
    """This part's targets, as measured in this run (not asserted anywhere)."""
    summaries = [r.summary for r in records if r.status == "ok" and r.summary]
    spread = max((s.peak_repeat_spread for s in summaries if s.measured_steps > 1), default=None)
    limit_s = part_limit_s(GRPO_PART_S, quick)
    return [
        schema.Target.at_most(
            f"the {'--quick ' if quick else ''}GRPO part finishes within {limit_s // 60} minutes", wall_s, limit_s
        ),
        schema.Target.at_most(
            "harness overhead (the parent's memory sampler, CPU time over wall time) at most "
            f"{HARNESS_OVERHEAD:.0%} of step time",
            harness_overhead(records),
            HARNESS_OVERHEAD,
        ),
        schema.Target.at_most(
            f"peak memory of repeated measured steps within {PEAK_REPEAT_SPREAD:.0%} of each other",
            spread,
            PEAK_REPEAT_SPREAD,
        ),
    ]


def harness_overhead(records: list[schema.Configuration]) -> float | None:
    """The parent's sampler CPU time over wall time, the largest over the configurations."""
    return max((r.harness.overhead_fraction for r in records if r.harness), default=None)


def distributed_targets(
    records: list[schema.Configuration], wall_s: float, quick: bool, shape: Shape, dtype: str
) -> list[schema.Target]:
    """The many-ranks part's targets, as measured in this run: ZeRO-3's per-rank model states against
    the analytic model's (``sharding.rank_model_states``), the harness's overhead, the part's time."""
    errors = []
    for record in records:
        levers = record.lever_values
        if record.status == "ok" and levers.distributed_type == "zero3" and levers.world_size == 2 and record.ranks:
            predicted = rank_model_states(shape, dtype, levers).total
            for rank in record.ranks:
                if rank.summary and rank.summary.model_states:
                    errors.append(abs(rank.summary.model_states.total / predicted - 1))
    limit_s = part_limit_s(DISTRIBUTED_PART_S, quick)
    return [
        schema.Target.at_most(
            f"per-rank model-state memory at 2 ranks with ZeRO-3 within {ZERO3_STATES_WITHIN:.0%} of what the "
            "analytic model predicts for that rank (largest relative error over the ranks)",
            max(errors, default=None),
            ZERO3_STATES_WITHIN,
        ),
        schema.Target.at_most(
            "the harness's overhead per rank (the parent's sampler CPU time over wall time) at most "
            f"{HARNESS_OVERHEAD:.0%} of step time",
            harness_overhead(records),
            HARNESS_OVERHEAD,
        ),
        schema.Target.at_most(
            f"the {'--quick ' if quick else ''}distributed part finishes within {limit_s // 60} minutes",
            wall_s,
            limit_s,
        ),
    ]


def _one_line(record: schema.Configuration) -> str:
    summary = record.summary
    if record.status != "ok" or summary is None:
        return f"{record.status}: {record.reason or record.phase or ''}".strip()
    return (
        f"ok: {summary.step_s_median:.2f} s/step, {summary.completion_tokens_per_s_median:.1f} tok/s, "
        f"peak {summary.peak_bytes / GIB:.2f} GiB ({summary.peak_measure})"
    )
