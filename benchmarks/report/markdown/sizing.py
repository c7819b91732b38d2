"""The guide's "Memory Anchors by Size Class" (``sizing.md``): per size class and hardware class the fewest
GPUs and the lightest lever set that fit, each cell measured (a GRPO result file) or predicted (the memory
model), with the step's seconds (the time model)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import pandas as pd

from benchmarks.catalog.levers import GUIDE_LEVERS, MODELS
from benchmarks.catalog.profiles import Hardware, Levers, load_hardware, load_shapes
from benchmarks.model import guide, search
from benchmarks.model.guide import GUIDE_BASE, GUIDE_DTYPE, GUIDE_RECIPE, GUIDE_WORKLOAD, LADDER
from benchmarks.model.memory.placement import GPU_COUNTS, on_gpus
from benchmarks.model.memory.predict import GIB, estimate
from benchmarks.model.time.calibration import fitted
from benchmarks.model.time.work_rates import Rates
from benchmarks.report import frames
from benchmarks.report.markdown import time_tables
from benchmarks.report.time_validation import FITTED_TIME_FILES
from benchmarks.results.schema import Result

GUIDE_ANCHORS = ("24gb", "h200", "b200")  # the classes the guide's table names: always shown
CLASS_NAMES = {"24gb": "24GB-class", "a100": "A100-class", "h100": "H100-class", "h200": "H200-class"}
CLASS_NAMES |= {"b200": "B200-class", "spark": "DGX Spark", "cpu": "CPU only", "gpu": "other GPUs"}
# What the guide's "Memory Anchors by Size Class" says, per size class, beside what this suite finds.
GUIDE_SAYS = {
    "0.5b": "24GB-class, with vLLM sleep + 8-bit AdamW + checkpointing together",
    "1.5b": "24GB-class, with vLLM sleep + 8-bit AdamW + checkpointing together",
    "3b": "24GB-class, with vLLM sleep + 8-bit AdamW + checkpointing together",
    "32b": "H200-class",
    "70b": "B200-class",
    "72b": "B200-class",
}


def hardware_for(gpu_class: str, catalog: dict[str, Hardware]) -> tuple[str, Hardware]:
    """A size class's smallest member: the one its cell has to fit."""
    members = [(name, hw) for name, hw in catalog.items() if hw.gpu_class == gpu_class]
    return min(members, key=lambda item: item[1].memory_gib)


def vllm_share(levers: Levers, shape_name: str, hardware: Hardware) -> Levers:
    """The engine's share by the one rule (``guide.engine_share``)."""
    return guide.engine_share(load_shapes()[shape_name], GUIDE_DTYPE, levers, hardware, GUIDE_WORKLOAD.prompt_tokens)


@dataclass(frozen=True)
class Cell:
    """A predicted cell: the fewest GPUs, the lightest lever set there (its label, peak and levers) and the
    fastest (``search.fastest``; None on a CPU, which has no GPU count to weigh)."""

    count: int
    label: str
    peak: float
    levers: Levers
    fastest: search.Setup | None


@functools.cache  # the tables, the ledger and the site's pages each ask for the same cells
def predicted_cell(shape_name: str, hardware: Hardware) -> Cell | None:
    """The fewest GPUs of ``hardware`` (``GPU_COUNTS``: 1, 2, 4, 8, then 8-GPU machines) and the first
    lever set of LADDER on them whose predicted peak per GPU fits, with that peak and levers; many GPUs run ZeRO-3
    with the colocated engine split over each machine's ranks (``on_gpus``); and the fastest lever set on as many
    GPUs (``search.fastest``). A CPU is one machine."""
    shape = load_shapes()[shape_name]
    counts = (1,) if hardware.gpu_class == "cpu" else GPU_COUNTS
    for count in counts:
        for label, change in guide.ladder(hardware):
            levers = vllm_share(on_gpus(GUIDE_BASE.changed(**change), count), shape_name, hardware)
            predicted = estimate(shape, GUIDE_DTYPE, levers, GUIDE_WORKLOAD, hardware, malloc_fixed=True)
            if predicted.fits(hardware.memory_gib * GIB):
                fastest = None
                if hardware.peak_bf16_tflops and hardware.gpu_class != "cpu":
                    every_gpu = replace(GUIDE_RECIPE, prompts=count)  # the guide's step on each GPU, as the cell
                    fastest = search.fastest(search.Ask(shape, recipe=every_gpu), hardware, hardware.name, count)
                return Cell(count, label + (", ZeRO-3" if count > 1 else ""), predicted.peak, levers, fastest)
    return None


def _lever_label(levers: Levers) -> str:
    parts = [levers.model, levers.optim]
    parts += ["checkpointing"] * levers.gradient_checkpointing
    if levers.use_vllm:
        parts.append(f"vLLM {levers.vllm_mode}" + (" + sleep" if levers.vllm_enable_sleep_mode else ""))
    parts += [f"beta {levers.beta}"] * (levers.beta > 0)
    return ", ".join(parts)


def _lightness(levers: Levers) -> tuple:
    """Fewer levers engaged first: full before LoRA before QLoRA, then optimizer, checkpointing, sleep."""
    return (
        MODELS.index(levers.model),
        levers.optim.endswith("8bit"),
        levers.gradient_checkpointing,
        levers.vllm_enable_sleep_mode,
    )


def workload(row: pd.Series) -> str:
    """What a measured row ran where it is less than the guide's workload: its figure does not stand for the
    guide's step, which stays predicted."""
    ran = (row.levers.per_device_train_batch_size, row.levers.max_completion_length)
    guide = (GUIDE_LEVERS.per_device_train_batch_size, GUIDE_LEVERS.max_completion_length)
    if ran[0] >= guide[0] and ran[1] >= guide[1]:
        return ""
    return (
        f"; measured on {ran[0]} completions x {ran[1]} tokens, not the guide's {guide[0]} x {guide[1]}, which "
        "stays predicted"
    )


# What a configuration's run can end as and say of a fit: ``skipped`` and ``invalid`` runs measured nothing of it.
ATTEMPTED = ("ok", "oom", "error", "timeout")


def measured_cells(results: list[Result]) -> dict[tuple[str, str], tuple[str, str]]:
    """(size class, hardware class) -> the cell text from GRPO result files and the file, newest file first: the
    lightest configuration that ran within its budget; "does not fit" only when every one ran out of memory; else
    "failed" with the first failure's reason, never a fit verdict from a run that broke."""
    configurations = frames.configurations([r for r in results if not r.quick])
    if configurations.empty:
        return {}
    ran = configurations[configurations.status.isin(ATTEMPTED)].copy()
    ran["lightness"], ran["label"] = ran.levers.map(_lightness), ran.levers.map(_lever_label)
    cells: dict[tuple[str, str], tuple[str, str]] = {}
    for (shape, size, file, date), group in ran.sort_values("date", kind="stable").groupby(
        ["shape", "gpu_class", "file", "date"], sort=False
    ):
        cells[(shape, size)] = (_measured_text(group, f"measured: {file}, {date}"), file)
    return cells  # groups in date order: the newest file of a cell is the last written


def _measured_text(group: pd.DataFrame, where: str) -> str:
    """One file's cell: the lightest fit; or every configuration out of memory (those whose engine could not
    start in its share named); or the first configuration that failed otherwise, with its reason."""
    fits = group[group.status == "ok"].sort_values("lightness", kind="stable")
    if len(fits):
        best = fits.iloc[0]
        what = "device" if "device" in best.peak_measure else "host RSS"
        timed = f"{best.step_s:.1f} s/step, rollout {best.rollout_share:.0%}"
        return f"fits with {best.label} ({best.peak_bytes / GIB:.1f} GiB {what}; {timed}{workload(best)}; {where})"
    out = group[group.status == "oom"]
    if len(out) == len(group):
        engines = int((out.phase == "engine_start").sum())
        started = f"; {engines} of them at the engine's start, its share too small" if engines else ""
        return f"does not fit: every configuration ran out of memory ({where}{started})"
    failed = group[group.status != "oom"].iloc[0]
    reason = " ".join(str(failed.reason or "no reason recorded").split())
    reason = reason if len(reason) <= 160 else reason[:157] + "..."
    counts = f"{len(group) - len(out)} of {len(group)} configurations failed, {len(out)} ran out of memory"
    phase = f" in {failed.phase}" if isinstance(failed.phase, str) else ""
    return f"failed: {failed.status}{phase}: {reason} ({counts}; {where})"


def predicted_text(size: str, gpu_class: str, hardware: Hardware, rates: Rates | None) -> tuple[str, bool, int]:
    """A predicted cell: the GPUs and lever set that fit, the peak and the step's seconds at ``rates`` (the
    class's, per device); whether it fits."""
    name = CLASS_NAMES.get(gpu_class, gpu_class)
    cell = predicted_cell(size, hardware)
    if cell is None:
        if gpu_class == "cpu":
            return "does not fit (predicted)", False, 1
        return f"does not fit {GPU_COUNTS[-1]} GPUs at this workload per GPU (predicted)", False, 1
    spare = f"{1 - cell.peak / (hardware.memory_gib * GIB):.0%} spare"
    timed, step = "", None
    if rates is not None:
        step = time_tables.cell_time(size, GUIDE_DTYPE, cell.levers, GUIDE_WORKLOAD, rates)
        hours = GUIDE_RECIPE.tokens / (step.tokens_per_s_per_gpu * 3600)  # every GPU held: the same work, sooner
        timed = f"; {time_tables.cell_text(step)}, {hours:,.4g} GPU-h"
    if gpu_class == "cpu":
        return f"{cell.label} ({cell.peak / GIB:.0f} GiB, {spare}{timed}; predicted)", True, cell.count
    text = f"{cell.count} x {name}: {cell.label} ({cell.peak / GIB:.0f} GiB per GPU, {spare}{timed})"
    fastest = cell.fastest
    if fastest is not None and step is not None and fastest.step.step_s < 0.99 * step.step_s:
        text += (
            f"; fastest: {fastest.words()} (~{time_tables.seconds_text(fastest.step.step_s)} s/step, "
            f"{GUIDE_RECIPE.tokens * fastest.gpus / (fastest.tokens_per_s * 3600):,.4g} GPU-h)"
        )
    return text + " (predicted)", True, cell.count


def short_text(size: str, gpu_class: str, hardware: Hardware, rates: Rates | None) -> str:
    """A predicted cell in a few words: GPUs, levers, headroom and seconds a step."""
    cell = predicted_cell(size, hardware)
    if cell is None:
        return "does not fit"
    spare = f"{1 - cell.peak / (hardware.memory_gib * GIB):.0%} spare"
    step = ""
    if rates is not None:
        seconds = time_tables.cell_time(size, GUIDE_DTYPE, cell.levers, GUIDE_WORKLOAD, rates).step_s
        step = f" · ~{time_tables.seconds_text(seconds)} s"
    levers = cell.label.replace("checkpointing", "ckpt").replace("vLLM sleep", "sleep").replace(", ZeRO-3", "")
    return f"{cell.count}× · {levers} · {spare}{step}"


def sizing_table(results: list[Result], every: list[Result] | None = None) -> str:
    """The guide's "Memory Anchors by Size Class" (``sizing_grid``) with its notes. ``every``: all results (the
    time model's fitted run among them), default ``results``."""
    table, _ = sizing_grid(results, every)
    return "\n".join([frames.markdown(table), "", *sizing_notes()]) + "\n"


def sizing_grid(
    results: list[Result], every: list[Result] | None = None, short: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cells (size class x hardware class, each measured or predicted, with the step's seconds), pivoted,
    beside what the guide says and the smallest class that fits; and, cell for cell, the result file behind a
    measured cell (None elsewhere). ``short``: each cell in a few words (the site's)."""
    catalog, shapes = load_hardware(), load_shapes()
    frame = sizing_cells(results, every)
    if short:
        frame = frame.assign(text=frame["short"], named=frame["class"].map(CLASS_NAMES) + " " + frame["short"])
    classes, sizes = list(dict.fromkeys(frame["class"])), list(dict.fromkeys(frame["size"]))
    columns = {c: column_name(c, catalog) for c in classes}
    table = frame.pivot(index="size", columns="class", values="text").reindex(index=sizes, columns=classes)
    files = frame.pivot(index="size", columns="class", values="file").reindex(index=sizes, columns=classes)
    gpu_fits = (  # the fewest GPUs, then the smallest class (the classes are in order of memory)
        frame[frame.fits & (frame["class"] != "cpu")].sort_values("gpus", kind="stable").drop_duplicates("size")
    ).set_index("size")
    smallest = [gpu_fits.at[s, "named"] if s in gpu_fits.index else "none of these classes" for s in sizes]
    table.insert(0, "Feasible with (smallest class that fits)", smallest)
    table.insert(0, "The guide says", [GUIDE_SAYS.get(s, "(not in its table)") for s in sizes])
    table.insert(0, "Size class", [f"{s} ({shapes[s].param_count() / 1e9:.1f}B)" for s in sizes])
    files = files.reindex(columns=table.columns).astype(object).map(lambda f: f if isinstance(f, str) else None)
    return table.rename(columns=columns), files.rename(columns=columns)


def column_name(gpu_class: str, catalog: dict[str, Hardware]) -> str:
    """A class's column: its memory, and the card its cells are sized and timed on where the class has several."""
    _, hardware = hardware_for(gpu_class, catalog)
    members = [h for h in catalog.values() if h.gpu_class == gpu_class]
    on = f"; sized and timed on the {hardware.name}" if len(members) > 1 else ""
    return f"{CLASS_NAMES.get(gpu_class, gpu_class)} ({hardware.memory_gib:g} GiB{on})"


def _sizing_classes(results: list[Result], catalog: dict[str, Hardware]) -> list[str]:
    """The guide's classes and every class with a GRPO result, smallest memory first."""
    classes = list(GUIDE_ANCHORS)
    classes += [
        c for c in dict.fromkeys(frames.gpu_class(r.hardware) for r in results if r.kind == "grpo") if c not in classes
    ]
    known = {h.gpu_class for h in catalog.values()}
    return sorted(classes, key=lambda c: hardware_for(c, catalog)[1].memory_gib if c in known else 0)


def sizing_cells(results: list[Result], every: list[Result] | None = None) -> pd.DataFrame:
    """One row per size class (smallest first) and hardware class (the guide's and every class with a GRPO result,
    smallest memory first): the cell's text, whether it fits, on how many GPUs, and the result file of a measured
    cell (None where predicted). ``every``: all results (the time model's fit), default ``results``."""
    catalog, cells = load_hardware(), []
    classes = _sizing_classes(results, catalog)
    sizes = size_classes()
    measured = measured_cells(results)
    every = results if every is None else every
    # each class's rates once (the CPU's is a fit over the results), not once a cell
    rates = {c: time_tables.class_rates(hardware_for(c, catalog)[1], every) for c in classes}
    for size in sizes:
        for gpu_class in classes:
            _, hardware = hardware_for(gpu_class, catalog)
            count, name, file = 1, CLASS_NAMES.get(gpu_class, gpu_class), None
            if (size, gpu_class) in measured:
                text, file = measured[(size, gpu_class)]
                fits = text.startswith("fits")
                short = ("" if text.startswith("failed") else "measured: ") + text.split(" (")[0]
            elif not hardware.memory_gib:  # the generic `gpu` class: each device's own memory, in its files
                text, fits = "(no prediction: the class's memory is each device's own)", False
                short = "no prediction"
            else:
                text, fits, count = predicted_text(size, gpu_class, hardware, rates[gpu_class])
                short = short_text(size, gpu_class, hardware, rates[gpu_class])
            named = text if text.startswith(f"{count} x {name}") else f"{name}: {text}"
            cells.append(
                {
                    "size": size,
                    "class": gpu_class,
                    "text": text,
                    "short": short,
                    "fits": fits,
                    "gpus": count,
                    "named": named,
                    "file": file,
                }
            )
    return pd.DataFrame(cells)


def size_classes() -> list[str]:
    """Every size class of profiles/shapes.toml but the smoke shapes, smallest first."""
    shapes = load_shapes()
    return sorted((n for n in shapes if not n.startswith("tiny")), key=lambda n: shapes[n].param_count())


def sizing_notes() -> list[str]:
    return [
        f"Predicted cells: the analytic model (`python -m benchmarks estimate`) for one GRPO step of "
        f"{GUIDE_WORKLOAD.completions} completions x {GUIDE_WORKLOAD.completion_tokens} tokens after "
        f"{GUIDE_WORKLOAD.prompt_tokens}-token prompts, {GUIDE_DTYPE}, a reference model (beta 0.04) and a "
        "colocated vLLM engine sized to the rollout (the guide's three-way residency); the first lever set that "
        "fits, in the order: " + "; ".join(label for label, _ in LADDER) + ".",
        "Each cell is the fewest GPUs of its class that fit (1, 2, 4, 8, then 8-GPU machines: "
        f"{', '.join(map(str, GPU_COUNTS))}), then the lightest lever set; on many GPUs the model states are "
        "partitioned with DeepSpeed ZeRO-3 (per GPU as DeepSpeed's own estimator counts them) and the colocated "
        "engine is split over each machine's GPUs by tensor parallelism. The smallest class that fits is the one "
        "needing the fewest GPUs, the smaller on a tie; the CPU column is one machine and skips QLoRA and vLLM "
        "sleep mode (both need CUDA).",
        "Measured cells: the lightest configuration that ran within the budget in the newest full (not --quick) "
        "GRPO result file of that class and size class; its own workload and levers, as its file says, with its "
        "measured median step and the rollout's share of it.",
        "A class of several cards is sized and timed on its smallest (the column names it): a faster member "
        "(the 24GB-class's RTX 4090 beside its L4) takes fewer seconds; `python -m benchmarks plan` weighs every "
        "card. "
        f"GPU-h: GPU-hours for {GUIDE_RECIPE.line()}, every GPU held counted, whatever the setup's own batch. "
        "Where another lever set on as many GPUs is faster than the lightest (`plan`'s search: method, optimizer, "
        "checkpointing, "
        "vLLM colocated, asleep or a server, DDP or ZeRO-3, micro-batch), the cell names it as the fastest.",
        "Seconds per step (per GPU, the synthetic reward's negligible cost; rewards.md gives a real reward's): the "
        "time model (model.md), on GPU classes from their peaks at efficiencies ("
        + fitted().words()
        + "), on the CPU at the rates fitted on "
        + FITTED_TIME_FILES[0]
        + " (that machine's calibration). How far both models were off on published GPU figures (fewest GPUs, "
        "seconds a step), held out of every fit: published.md.",
    ]
