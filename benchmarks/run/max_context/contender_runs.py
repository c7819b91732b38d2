"""The max-context search: Unsloth's "~7x longer context" claim, measured at one memory budget.

For a shape, a lever set and a budget, each contender stack (its own venv: noxfile.py) gets
the longest completion (prompt fixed) for which one whole GRPO step (rollout, loss, backward,
optimizer) stays within the budget, until the first failing length is within ``resolution`` of the
last passing one: ``guided_search`` (the next length where the measured peaks and the analytic model
say the budget ends); ``search`` (doubling from ``start_tokens``, then bisection) is the model's
own search and the guided one's reference. Every probe is a fresh
worker process (``benchmarks.run.grpo.worker``, run by the contender's interpreter) and is recorded.
The budget is the peak RSS of the worker tree on CPU (the parent's sampler stops a tree above
it) and ``torch.cuda.set_per_process_memory_fraction`` on CUDA.

Beside each measured maximum stands the analytic model's (``benchmarks.model.memory.predict``) for the
same shape and budget, with the logits term against the rest, so that a reader sees why the
ratio is what it is.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.catalog.contenders import CONTENDERS
from benchmarks.catalog.profiles import ContextBench, Hardware, Levers, Profile, load_hardware, load_shapes
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.predict import GIB, Workload, estimate
from benchmarks.results import schema
from benchmarks.run.grpo.configuration import run_configuration
from benchmarks.run.grpo.job import Job
from benchmarks.run.machine import provenance
from benchmarks.run.max_context.bisection import ProbeFailed, bracket, search
from benchmarks.run.max_context.verdict import ratios, search_targets, verdict
from benchmarks.run.model_dirs import materialise

SEARCHED = {
    "guided": (
        "model-guided (the first probe, then each next length at the boundary's best guess: a secant through the "
        "two longest fitting probes' peaks, else the analytic model anchored on the longest fitting probe; "
        "log-space bisection where a guess leaves the bracket)"
    ),
    "doubling": "doubling from the first probe, then bisection",
}


def budgeted_peak(
    shape: Shape, settings: ContextBench, levers: Levers, hardware: Hardware, path: str, length: int
) -> int:
    """The model's peak at ``length`` in the budget's own measure: on CUDA what torch's allocator holds (the
    budget caps it; the CUDA context lies outside), on a CPU the whole process (the budget is its RSS)."""
    work = Workload.from_levers(levers, settings.prompt_words, length)
    predicted = estimate(shape, settings.dtype, levers, work, hardware, path, settings.malloc_mmap_threshold > 0)
    return predicted.allocator_peak if hardware.gpu_class != "cpu" else predicted.peak


def predicted_max(shape: Shape, settings: ContextBench, levers: Levers, hardware: Hardware, path: str) -> int | None:
    """The analytic model's longest completion within the budget (same search, same granule)."""
    budget = settings.budget_gib * GIB

    def fits(length: int) -> bool:
        return budgeted_peak(shape, settings, levers, hardware, path, length) <= budget

    passed, _ = search(fits, settings.start_tokens, settings.max_tokens, 0.0, settings.granule)
    return passed


def anchored_max(
    shape: Shape, settings: ContextBench, levers: Levers, hardware: Hardware, path: str, probes: list[schema.Probe]
) -> int | None:
    """The model's longest completion with its fixed part replaced by the measurement: the smallest
    fitting probe's measured peak plus the model's growth from that length. This checks the model's
    per-token terms (activations, the logits path) apart from its runtime and weights terms."""
    anchors = [p for p in probes if p.fits and p.peak_bytes]
    if not anchors:
        return None
    anchor = min(anchors, key=lambda p: p.completion_tokens)
    budget = settings.budget_gib * GIB

    def modelled(length: int) -> int:
        return budgeted_peak(shape, settings, levers, hardware, path, length)

    offset = anchor.peak_bytes - modelled(anchor.completion_tokens)  # what the model misses at the anchor
    passed, _ = search(
        lambda n: offset + modelled(n) <= budget,
        anchor.completion_tokens,
        settings.max_tokens,
        0.0,
        settings.granule,
    )
    return passed


def _probe_record(length: int, record: schema.WorkerRecord, predicted_peak: int, wall_s: float) -> schema.Probe:
    """One probe as the file holds it; its peaks in one measure: torch's allocator per phase where the worker
    ran on CUDA (a probe that ran out of memory: the phase it failed in), else the worker tree's RSS."""
    step = record.steps[-1] if record.steps else None
    if record.device is not None:  # the budget's measure: the pool the allocator's cap bounds
        peaks = {phase: peak.reserved for phase, peak in step.cuda_peak_bytes.items()} if step else {}
        failed_in = record.unfinished_cuda_peak_bytes
        if not step and failed_in is not None:
            peaks = {record.phase or "setup": failed_in.reserved}
        measure = schema.TORCH_RESERVED
    else:
        peaks = (step.peak_rss_bytes if step else None) or record.unfinished_peak_rss_bytes or {}
        measure = "peak RSS of the worker tree"
    return schema.Probe(
        completion_tokens=length,
        status=record.status,
        fits=record.status == "ok",
        phase=record.phase,
        reason=record.reason,
        peak_bytes=max(peaks.values(), default=None),
        peak_bytes_by_phase=peaks,
        peak_measure=measure,
        predicted_peak_bytes=predicted_peak,
        step_s=step.wall_s if step else None,
        phase_s=step.phase_s if step else None,
        wall_s=wall_s,
        device=record.device,
        log_tail=record.log_tail,
    )


def contender_levers(name: str, settings: ContextBench) -> Levers:
    """The search's levers with the contender's own over them (those that are levers)."""
    own = CONTENDERS[name].levers
    return settings.levers.changed(**{k: v for k, v in own.items() if hasattr(settings.levers, k)})


# Every contender's probes on CUDA run under these allocator settings: Unsloth's import sets them in its
# own process (unsloth_zoo), and the fit test and the peak both move with fragmentation, so the others
# get the same. Each probe's worker reports the settings it ran under (``device`` in its probes).
CUDA_ALLOC_CONF = "expandable_segments:True"


def new_entry(name: str, cuda: bool) -> schema.ContenderRun:
    contender = CONTENDERS[name]
    return schema.ContenderRun(
        name=name,
        role=contender.role,
        stack=contender.stack,
        logits_path=contender.logits_path["cuda" if cuda else "cpu"],
        status="skipped",
    )


def probe_job(name: str, settings: ContextBench, model_dir: Path, cuda: bool) -> Job:
    """A probe's worker job but for its length: the contender's stack and levers, one measured step."""
    levers = contender_levers(name, settings)
    own = CONTENDERS[name].levers
    return Job(
        stack=CONTENDERS[name].stack,
        levers=levers,
        extra_config={k: v for k, v in own.items() if not hasattr(levers, k)},
        model_dir=str(model_dir),
        dtype=settings.dtype,
        warmup_steps=0,
        measured_steps=1,
        prompt_words=settings.prompt_words,
        memory_budget_bytes=int(settings.budget_gib * GIB) if cuda else None,  # over the device's own total
        malloc_mmap_threshold=0 if cuda else settings.malloc_mmap_threshold,
        allocator_conf=CUDA_ALLOC_CONF if cuda else None,
    )


def run_contender(
    entry: schema.ContenderRun,
    python: str | None,
    settings: ContextBench,
    model_dir: Path,
    hardware: Hardware,
    cuda: bool,
    logs: Path,
    save: Callable[[], None],
) -> None:
    """One contender's search into ``entry`` (already in the result file), ``save``d after every probe, so
    that a run cut meanwhile keeps every probe that ended."""
    name, contender = entry.name, CONTENDERS[entry.name]
    levers = contender_levers(name, settings)
    shape = load_shapes()[settings.shape]
    if contender.needs_cuda and not cuda:
        entry.reason = contender.needs_cuda
        return
    if python is None:
        entry.reason = f"no interpreter for {name}: run `nox -s context` (it builds each stack)"
        return
    entry.status, entry.reason = "searching", "the search had not ended when this file was written"
    prober = _Prober(
        entry, python, settings, probe_job(name, settings, model_dir, cuda), levers, hardware, cuda, logs, save
    )
    if settings.warmup_probe:  # imports, compiles and on-disk caches paid once, outside the timed probes
        record, entry.warmup_s = prober.run_step(settings.granule, settings.probe_timeout_s)  # a probe's limit
        print(f"  {name} warm-up at {settings.granule} tokens: {record.status}, {entry.warmup_s:.0f} s", flush=True)
    try:
        passed, failed = bracket(settings, prober.probe, prober.modelled)
    except ProbeFailed as error:
        entry.status, entry.reason = "error", str(error)
        return
    entry.status, entry.reason = "measured", None
    entry.max_completion_tokens, entry.first_failing_tokens = passed, failed
    entry.at_ceiling = failed is None
    entry.predicted_max_completion_tokens = predicted_max(shape, settings, levers, hardware, entry.logits_path)
    entry.anchored_max_completion_tokens = anchored_max(
        shape, settings, levers, hardware, entry.logits_path, entry.probes
    )


@dataclass
class _Prober:
    """One contender's probes: a whole GRPO step at a completion length, each recorded into ``entry`` and
    saved as it ends."""

    entry: schema.ContenderRun
    python: str
    settings: ContextBench
    job: Job
    levers: Levers
    hardware: Hardware
    cuda: bool
    logs: Path
    save: Callable[[], None]

    def modelled(self, length: int) -> int:
        shape = load_shapes()[self.settings.shape]
        return budgeted_peak(shape, self.settings, self.levers, self.hardware, self.entry.logits_path, length)

    def run_step(self, length: int, timeout_s: float) -> tuple[schema.WorkerRecord, float]:
        started = time.monotonic()
        record = run_configuration(
            self.job.with_levers(max_completion_length=length),
            None if self.cuda else int(self.settings.budget_gib * GIB),
            self.logs / f"{self.entry.name}-{length}.log",
            python=self.python,
            timeout_s=timeout_s,
        )
        return record, time.monotonic() - started

    def probe(self, length: int) -> tuple[bool, int | None]:
        record, wall = self.run_step(length, self.settings.probe_timeout_s)
        probed = _probe_record(length, record, self.modelled(length), wall)
        self.entry.probes.append(probed)
        self.entry.versions = self.entry.versions or record.versions
        self.save()
        print(f"  {self.entry.name} {length:>6} tokens: {_probe_line(probed)}", flush=True)
        if record.status not in ("ok", "oom"):
            raise ProbeFailed(f"{record.status} at {length} tokens: {record.reason}")
        return probed.fits, probed.peak_bytes


def _probe_line(probe: schema.Probe) -> str:
    peak = f"peak {probe.peak_bytes / GIB:.2f} GiB" if probe.peak_bytes else "no peak"
    what = "fits" if probe.fits else f"{probe.status} in {probe.phase or '?'}"
    return f"{what}, {peak} (predicted {probe.predicted_peak_bytes / GIB:.2f}), {probe.wall_s:.0f} s"


def logits_share(settings: ContextBench, hardware: Hardware, length: int, path: str) -> schema.LogitsShare:
    """The training phase at ``length`` in the analytic model: the logits term against the rest."""
    shape = load_shapes()[settings.shape]
    work = Workload.from_levers(settings.levers, settings.prompt_words, length)
    fixed = settings.malloc_mmap_threshold > 0
    training = estimate(shape, settings.dtype, settings.levers, work, hardware, path, fixed).phases["training"]
    rest = sum(v for k, v in training.items() if k != "logits")
    return schema.LogitsShare(
        completion_tokens=length, logits_bytes=training["logits"], rest_bytes=rest, terms=training
    )


def search_record(settings: ContextBench, cuda: bool) -> schema.Search:
    """The search's settings as its file states them: what is searched, and what the budget means here."""
    if cuda:
        enforced = (
            f"torch's caching allocator capped at {settings.budget_gib:g} GiB (set_per_process_memory_fraction "
            "over the total the device reports): the CUDA context lies outside the cap, so the model is compared "
            "without its runtime term; a probe fits when its step ends without the allocator running out"
        )
    else:
        enforced = "peak RSS of the worker and its children, sampled every 20 ms; a tree over it is stopped" + (
            f"; glibc's mmap and trim thresholds fixed at {settings.malloc_mmap_threshold} bytes in each probe"
            if settings.malloc_mmap_threshold
            else "; glibc's own malloc thresholds"
        )
    recorded = {
        **asdict(settings),
        "allocator_conf": f"PYTORCH_ALLOC_CONF={CUDA_ALLOC_CONF} in every contender's probes" if cuda else "",
        "searched": f"completion length, prompt fixed at {settings.prompt_words} tokens; {SEARCHED[settings.search]}",
        "budget_enforced_by": enforced,
        "completions_per_step": settings.levers.per_device_train_batch_size,
    }
    return schema.decode(schema.Search, recorded, "search")


def run_context(
    profile: Profile, pythons: dict[str, str], out: Path, overrides: dict[str, Any] | None = None, quick: bool = False
) -> Path:
    """The search for every contender of ``profile.context`` (with ``overrides`` of its fields);
    the result file is rewritten after every contender."""
    import torch  # the platform decides each contender's path; no CUDA context is made here

    settings = replace(profile.context, **(overrides or {}))
    cuda = torch.cuda.is_available()
    hardware = load_hardware()[profile.hardware]
    model_dir = materialise(load_shapes()[settings.shape], settings.dtype)
    path = out / profile.hardware / f"{provenance.stamp()}-context.json"
    result = schema.ContextFile(
        **provenance.header("context", profile, quick),
        search=search_record(settings, cuda),
        shape=provenance.shape_record(settings.shape),
        earlier=earlier_search(out, profile.hardware, settings),
    )
    started = time.monotonic()

    def save() -> None:
        """The file as it stands: every probe so far, and the ratios and verdict of the searches ended."""
        result.ratios = ratios(result.contenders)
        result.verdict = verdict(result.contenders, result.ratios, cuda)
        result.prediction = {
            entry.name: logits_share(settings, hardware, entry.max_completion_tokens, entry.logits_path)
            for entry in result.contenders
            if entry.max_completion_tokens
        }
        result.finished = schema.now()
        schema.write(path, result)

    with tempfile.TemporaryDirectory() as logs, schema.marked_incomplete(path, result):
        for name in settings.contenders:
            print(f"{name}: {CONTENDERS[name].role}", flush=True)
            entry = new_entry(name, cuda)
            result.contenders.append(entry)
            run_contender(entry, pythons.get(name), settings, model_dir, hardware, cuda, Path(logs), save)
            if entry.status != "measured":
                print(f"  {entry.status}: {entry.reason}")
            save()
        result.targets = search_targets(result.contenders, result.earlier, settings, time.monotonic() - started)
    return path


SAME_SEARCH = ("shape", "dtype", "budget_gib", "prompt_words", "resolution", "granule", "malloc_mmap_threshold")


def earlier_search(results_dir: Path, hardware: str, settings: ContextBench) -> schema.EarlierSearch | None:
    """The newest complete search under ``results_dir`` on ``hardware`` with these settings (shape, dtype,
    budget, prompt, resolution, granule, levers), a doubling one where there is one, or None."""
    try:
        results = schema.load_results(results_dir)
    except (OSError, ValueError):
        return None
    same = [
        r
        for r in results
        if r.kind == "context"
        and r.hardware == hardware
        and r.complete
        and all(getattr(r.record.search, key) == getattr(settings, key) for key in SAME_SEARCH)
        and Levers.recorded(r.record.search.levers) == settings.levers
    ]
    if not same:
        return None
    newest = max(same, key=lambda r: (r.record.search.search == "doubling", r.record.started))  # a full one first
    return schema.EarlierSearch(
        file=newest.path,
        contenders={
            c.name: {
                "max_completion_tokens": c.max_completion_tokens,
                "first_failing_tokens": c.first_failing_tokens,
                "probes": len(c.probes),
            }
            for c in newest.record.contenders
            if c.status == "measured"
        },
    )
