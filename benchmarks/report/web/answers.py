"""The site's answers to "can we do this size on what we have, and how long would it take?": the front page (the
guide's size classes at a glance, under a banner saying what is measured and how far the models were off on
published figures), a page per size class (the plan over every card and count) and a page per GPU class of the
catalogue (what the models predict on it, beside what was measured there)."""

from __future__ import annotations

import statistics
from html import escape

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.model import guide, search
from benchmarks.model.memory.predict import GIB
from benchmarks.report import frames, published_scores
from benchmarks.report.markdown import sizing, time_tables
from benchmarks.report.web import svg
from benchmarks.results.records import readable
from benchmarks.results.schema import Result

GUIDE_SIZES = tuple(sizing.GUIDE_SAYS)  # the size classes the guide's table names
JOB = guide.GUIDE_RECIPE


def gpu_classes() -> list[str]:
    """Every GPU class of the catalogue that has a memory to size against, smallest first."""
    catalog = load_hardware()
    known = {h.gpu_class for h in catalog.values() if h.memory_gib and h.gpu_class != "cpu"}
    return sorted(known, key=lambda c: sizing.hardware_for(c, catalog)[1].memory_gib)


def measured_classes(results: list[Result]) -> list[str]:
    return sorted({frames.gpu_class(r.hardware) for r in results if r.kind == "grpo"} - {"cpu"})


def banner(results: list[Result]) -> str:
    """How many GPU classes this suite measured, and how far the models were off on published figures."""
    measured, classes = measured_classes(results), gpu_classes()
    found = [s for s in published_scores.scores() if s.entry.role == "held-out" and s.entry.mapping]
    times = [s.ratio for s in found if s.entry.kind == "time" and s.ratio is not None]
    counts = [s for s in found if s.entry.kind == "min_gpus"]
    said = [f"{len(measured)} of {len(classes)} GPU classes measured by this suite"]
    said[0] += f" ({', '.join(measured)})" if measured else ": every GPU figure below is predicted"
    if times:
        median = statistics.median(times)
        said.append(f"on published step times held out of every fit its time model gives {readable(median)}x theirs")
    if counts:
        matched = sum(s.predicted == s.entry.stated.value for s in counts)
        said.append(f"it matches {matched} of {len(counts)} published fewest-GPU counts")
    return f'<p class="banner">{escape("; ".join(said))} (<a href="tables/published.html">published figures</a>).</p>'


def size_row(size: str, cells: list[dict], results: list[Result]) -> list[str]:
    """The front page's row of a size class: the class needing the fewest GPUs (the smaller on a tie), its
    lightest lever set, headroom, seconds a step, tokens a second per GPU and GPU-hours."""
    shape = load_shapes()[size]
    fits = [c for c in cells if c["size"] == size and c["fits"] and c["class"] != "cpu"]
    head = [f'<a href="sizes/{size}.html">{escape(size)}</a> ({shape.param_count() / 1e9:.1f}B)']
    if not fits:
        return [*head, "none up to 64 GPUs", "", "", "", "", "", "predicted"]
    best = min(fits, key=lambda c: c["gpus"])  # cells come smallest class first
    catalog = load_hardware()
    _, hardware = sizing.hardware_for(best["class"], catalog)
    cell = sizing.predicted_cell(size, hardware)
    rates = time_tables.class_rates(hardware, results)
    step = time_tables.cell_time(size, guide.GUIDE_DTYPE, cell.levers, guide.GUIDE_WORKLOAD, rates)
    hours = JOB.tokens / (step.tokens_per_s_per_gpu * 3600)
    where = f'{cell.count} x <a href="hardware/{best["class"]}.html">{escape(sizing.CLASS_NAMES[best["class"]])}</a>'
    spare = 1 - cell.peak / (hardware.memory_gib * GIB)
    return [
        *head,
        where,
        escape(cell.label),
        f"{readable(cell.peak / GIB)} GiB, {spare:.0%} spare",
        f"{readable(step.step_s)} s",
        readable(step.tokens_per_s_per_gpu),
        readable(hours),
        "predicted",
    ]


FRONT_COLUMNS = ("size class", "fewest GPUs", "lightest levers that fit", "peak per GPU", "s a step",
                 "tokens/s per GPU", "GPU-h per 1,000 steps", "basis")  # fmt: skip


def front_page(cited: list[Result], results: list[Result]) -> str:
    cells = sizing.sizing_cells(cited, results).to_dict("records")
    rows = [size_row(size, cells, results) for size in GUIDE_SIZES]
    head = "".join(f"<th>{c}</th>" for c in FRONT_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    measured_cpu = sum(1 for c in cells if c["class"] == "cpu" and c["file"])
    return f"""{banner(results)}
<table id="answers"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<p>Each row: the fewest GPUs of the smallest class that hold the guide's step ({JOB.global_batch} completions of
{JOB.completion_tokens} tokens, bf16, a reference model and a colocated vLLM engine), the lightest levers that fit
there, and its time. GPU-hours are for {escape(JOB.line())}. No price is set: <code>plan --price</code> adds
cost. Each size class opens its plan over every card and count, fastest and cheapest marked. Measured here: the CPU
({measured_cpu} sizing cells, <a href="sizing.html">sizing</a>). The guide's claims, each measured, published or
predicted: <a href="claims.html">the claims ledger</a>.</p>"""


def size_pages(results: list[Result]) -> dict[str, tuple[str, str]]:
    """A page per size class of the guide: ``plan``'s answer over every card and count, with a chart of wall
    time against GPU-hours."""
    cards = {n: h for n, h in load_hardware().items() if h.peak_bf16_tflops and h.gpu_class != "cpu"}
    found = {}
    for size in GUIDE_SIZES:
        setups = search.plan(search.Ask(load_shapes()[size]), cards)
        found[f"sizes/{size}.html"] = (f"{size}: what to rent, how many, how long", _plan_body(size, setups))
    listing = "".join(f'<li><a href="{s}.html">{s}</a></li>' for s in GUIDE_SIZES)
    found["sizes/index.html"] = ("Size classes", f"<ul>{listing}</ul>")
    return found


def _plan_body(size: str, setups: list[search.Setup]) -> str:
    if not setups:
        return "<p>Nothing fits any card or count up to 64 (predicted): <code>plan</code> says why.</p>"
    front = search.pareto(setups, JOB, {})
    shown = sorted(setups, key=lambda s: s.wall_s(JOB))
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{c}</td>"
            for c in (
                "*" if s in front else "",
                s.gpus,
                escape(s.card),
                escape(s.words()),
                f"{readable(s.peak / GIB)} GiB, {s.headroom:.0%} spare",
                f"{readable(s.step.step_s)} s",
                readable(s.wall_s(JOB) / 3600),
                readable(s.gpu_hours(JOB)),
                "predicted",
            )
        )
        + "</tr>"
        for s in shown
    )
    points = [
        svg.Scatter(s.card, s.wall_s(JOB) / 3600, s.gpu_hours(JOB), f"{s.gpus} x {s.card}: {s.words()}", s in front)
        for s in shown
    ]
    chart = svg.scatter_chart(f"{size}: wall time against GPU-hours (predicted)", "hours", "GPU-hours", points)
    head = "".join(
        f"<th>{c}</th>" for c in ("", "GPUs", "card", "levers", "peak per GPU", "s a step", "wall h", "GPU-h", "basis")
    )
    return f"""<p>Every card of the catalogue on 1 to 64 GPUs, the fastest lever set the memory model fits on each
(<code>python -m benchmarks plan --shape {escape(size)}</code>), for {escape(JOB.line())}. * marks the Pareto
front: no other row is both faster and fewer GPU-hours. Every row is predicted; how far the models were off on
published figures: <a href="../tables/published.html">published figures</a>.</p>
<figure class="chart-box">{chart}</figure>
<table class="plan"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"""


def class_prediction(gpu_class: str, cited: list[Result], results: list[Result]) -> str:
    """What the models predict for every size class on ``gpu_class`` (a measured cell where a GRPO file of it
    ran), and their published error there."""
    catalog = load_hardware()
    _, hardware = sizing.hardware_for(gpu_class, catalog)
    measured = sizing.measured_cells(cited)
    rates = time_tables.class_rates(hardware, results)
    rows = []
    for size in sizing.size_classes():
        found = measured.get((size, gpu_class))
        text = found[0] if found else sizing.predicted_text(size, gpu_class, hardware, rates)[0]
        rows.append(f"<tr><td>{escape(size)}</td><td>{escape(text)}</td></tr>")
    cards = [f"{escape(h.name)} ({h.memory_gib:g} GiB)" for h in catalog.values() if h.gpu_class == gpu_class]
    errors = published_scores.class_error(gpu_class) or ["none of this class scored yet"]
    return f"""<p>Cards: {", ".join(cards)}. Sized and timed on the smallest; <code>plan</code> weighs each.</p>
<p>On published figures of this class: {escape("; ".join(errors))}.</p>
<table class="class-sizes"><thead><tr><th>size class</th><th>the models (predicted unless a file is named)</th>
</tr></thead><tbody>{"".join(rows)}</tbody></table>"""


def predicted_figures(gpu_class: str, results: list[Result]) -> dict[str, list]:
    """A GPU class's predicted figures for the side-by-side page, by name: per size class of the guide, the fewest
    GPUs, the peak per GPU and the seconds a step of the lightest lever set that fits."""
    _, hardware = sizing.hardware_for(gpu_class, load_hardware())
    rates = time_tables.class_rates(hardware, results)
    figures: dict[str, list] = {}
    for size in GUIDE_SIZES:
        cell = sizing.predicted_cell(size, hardware)
        if cell is None or rates is None:
            continue
        step = time_tables.cell_time(size, guide.GUIDE_DTYPE, cell.levers, guide.GUIDE_WORKLOAD, rates)
        figures[f"{size}: fewest GPUs (predicted)"] = [cell.count, "GPUs"]
        figures[f"{size}: peak per GPU (predicted)"] = [cell.peak / GIB, "GiB"]
        figures[f"{size}: step (predicted)"] = [step.step_s, "s"]
    return figures
