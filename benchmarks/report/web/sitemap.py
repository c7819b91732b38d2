"""The site's pages (``benchmarks.report.web.builder`` writes them): each a title and an HTML body, by its path under
the site's root. Bodies link upwards with ``up`` (``../`` per folder) so that the site reads from plain files."""

from __future__ import annotations

import functools
import json
import re
from html import escape

import pandas as pd

from benchmarks.report.markdown import claims, ledger_page, regenerate, time_tables
from benchmarks.report.markdown.part_tables import context_table, decode_table, distributed_table, rewards_table
from benchmarks.report.markdown.sizing import CLASS_NAMES, sizing_cells, sizing_grid, sizing_notes
from benchmarks.report.time_validation import TimeCheck, validate_time
from benchmarks.report.web import answers, plotted, result_pages, svg
from benchmarks.results.schema import Result

NAV = (
    ("index.html", "Answers"),
    ("claims.html", "Claims"),
    ("sizing.html", "Sizing"),
    ("sizes/index.html", "Size classes"),
    ("hardware/index.html", "GPU classes"),
    ("series.html", "Series"),
    ("compare.html", "Side by side"),
    ("tables/published.html", "Published figures"),
    ("tables/index.html", "Tables"),
    ("runs/index.html", "Runs"),
)
STATUS_CLASS = {claims.HOLDS: "holds", claims.FAILS: "fails", claims.PREDICTED: "predicted-only"}
STATUS_CLASS |= {claims.UNMEASURED: "unmeasured", claims.NO_FIGURE: "no-figure"}
STATUS_CLASS |= {claims.PUBLISHED_HOLDS: "published-holds", claims.PUBLISHED_FAILS: "published-fails"}
Pages = dict[str, tuple[str, str]]
ANNOTATED = {"sizing.md": "sizing.html"}  # a table the site shows on a page of its own, with its links


def pages(cited: list[Result], results: list[Result], figures: dict[str, list[str]]) -> Pages:
    """Every page: ``cited``, the results the tables cite (``regenerate.headline``); ``results``, every file;
    ``figures``, the images runs wrote beside their files."""
    every = regenerate.headline(results, every_run=True)
    timed = validate_time(results)
    return {
        "index.html": ("Which GPUs, how many, how long", answers.front_page(cited, results)),
        "claims.html": ("What the GRPO sizing guide's claims look like measured", front_page(cited)),
        **answers.size_pages(results),
        "sizing.html": ("Which model size fits which GPU class", sizing_page(cited, results)),
        "series.html": ("Every metric over every run", series_page(every)),
        "compare.html": ("Side by side", compare_page(cited, every)),
        **table_pages(cited, results),
        **class_pages(cited, results, timed),
        **result_pages.run_pages(results, figures, timed),
    }


def html_of(text: str) -> str:
    """A generated table's markdown (pipe tables, paragraphs, lists) as HTML."""
    import markdown  # here: the command line imports this module where no site is built (a GPU box carries none)

    return markdown.markdown(text, extensions=["tables"])


def link_result_files(body: str, up: str, paths: list[str]) -> str:
    """Every result file named in the text of ``body`` (``cpu/...-grpo.json``) linked to its page; names inside
    tags, links and scripts are left alone."""
    if not paths:
        return body
    pattern = _names_of(tuple(paths))
    pieces = re.split(r"(<[^>]*>)", body)
    opaque = 0  # inside <a> or <script>
    for index, piece in enumerate(pieces):
        if piece.startswith("<"):
            opaque += bool(re.match(r"<(a|script)\b", piece)) - bool(re.match(r"</(a|script)>", piece))
        elif not opaque:
            pieces[index] = pattern.sub(
                lambda m: f'<a href="{up}{plotted.run_page(m.group(0))}">{m.group(0)}</a>', piece
            )
    return "".join(pieces)


@functools.cache
def _names_of(paths: tuple[str, ...]) -> re.Pattern:
    """One pattern for every result file's name (the longest first), made once for all the pages."""
    return re.compile("|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True)))


def front_page(cited: list[Result]) -> str:
    ledger = claims.ledger(cited)
    rows = "\n".join(_claim_row(claim) for claim in ledger)
    counts = pd.Series([c.status for c in ledger]).value_counts()
    summary = "; ".join(f"{n} {status}" for status, n in counts.items())
    classes = ", ".join(f'<a href="hardware/{h}.html">{escape(h)}</a>' for h in _classes(cited))
    return f"""<p class="lede">{claims.GUIDE} says which model size fits which GPU, with which levers;
that DGX Spark rollouts run at 180–192 GB/s; that Unsloth's chunked loss gives ~7x longer context;
and ships reward functions. This suite measures each claim on the hardware at hand and predicts the rest with a
memory and time model. Each row says whether the claim was measured, on what, and what the model says beside it.</p>
<p>{len(ledger)} claims: {escape(summary)}. Hardware classes with results: {classes}.</p>
<table id="ledger">
<thead><tr><th>claim</th><th>status</th><th>measured</th><th>model</th><th>evidence</th><th>detail</th></tr></thead>
<tbody>
{rows}
</tbody>
</table>
<h2>The guide's words</h2>
<ul>{"".join(f"<li><b>{escape(c.title)}</b>: {escape(ledger_page.quote(c.guide))}</li>" for c in ledger)}</ul>
<p>The same ledger as markdown: <code>results/claims.md</code>, regenerated by <code>nox -s tables</code>.</p>"""


def _claim_row(claim: claims.Claim) -> str:
    evidence = "<br>".join(
        f'<a href="{plotted.run_page(e.file)}">{escape(e.file)}</a> ({escape(e.machine)}, {escape(e.commit)}, {e.date})'
        for e in claim.evidence
    )
    annotated = ANNOTATED.get(claim.detail, f"tables/{claim.detail.removesuffix('.md')}.html")
    detail = f'<a href="{annotated}">{claim.detail}</a>' if claim.detail else ""
    status = f'<span class="status {STATUS_CLASS[claim.status]}">{escape(claim.status)}</span>'
    cells = [escape(claim.title), status, escape(claim.measured), escape(claim.model), evidence or "none", detail]
    return f'<tr data-claim="{claim.key}" id="{claim.key}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def sizing_page(cited: list[Result], results: list[Result]) -> str:
    """The sizing table in a few words a cell, its header fixed while it scrolls: a measured cell opens its run, a
    predicted one its explanation (the size class's plan, or the GPU class's predictions)."""
    table, files = sizing_grid(cited, results, short=True)
    classes = list(dict.fromkeys(sizing_cells(cited, results)["class"]))
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    body = []
    for i in range(len(table)):
        size = str(table.index[i])
        cells = [f"<td>{escape(str(text))}</td>" for text in table.iloc[i, :3]]
        for j in range(3, len(table.columns)):
            text, file = table.iat[i, j], files.iat[i, j]
            if isinstance(file, str):
                link = f'<a href="{plotted.run_page(file)}">{escape(text)}</a>'
                cells.append(f'<td class="measured" data-file="{escape(file)}">{link}</td>')
            else:
                why = f"sizes/{size}.html" if size in answers.GUIDE_SIZES else f"hardware/{classes[j - 3]}.html"
                cells.append(f'<td class="predicted"><a href="{why}">{escape(text)}</a> (predicted)</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    notes = "\n\n".join(sizing_notes())
    return (
        "<p>Each cell: the fewest GPUs of the class, the lightest levers that fit, the headroom and the seconds a "
        "step. Green cells were measured (the link opens the run); yellow cells are predicted (the link opens the "
        "plan of the size class or the predictions for the GPU class; <code>results/tables/sizing.md</code> has each "
        "cell in full).</p>\n"
        f'<div class="scroll tall"><table id="sizing" data-boxed><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>\n{html_of(notes)}"
    )


def series_page(every: list[Result]) -> str:
    charts = plotted.series(every)
    contents = "".join(f'<li><a href="#chart-{i}">{escape(c.title)}</a></li>' for i, c in enumerate(charts))
    drawn = "\n".join(
        f'<figure id="chart-{i}">{svg.series_chart(c.title, c.unit, c.points)}{_steps(c)}{_numbers(c)}</figure>'
        for i, c in enumerate(charts)
    )
    return (
        "<p>Each chart is one metric over every complete run, oldest on the left, a line per hardware class, shape "
        "and machine (runs on different CPUs are not one series): a step in a line is a regression or an "
        "improvement. The bar through a point is its noise where the run recorded it (the fastest to the slowest "
        "measured step, the peak's spread between steps, the reward's quartiles). Each chart's numbers, machine and "
        "commit are in the list under it (and on hover); click a point for its run. Every point is measured; "
        f"nothing here is predicted. Metrics with a single run are left out.</p>\n<p>{len(charts)} charts:</p>\n"
        f'<ol class="contents">{contents}</ol>\n<div class="charts">\n{drawn}\n</div>'
    )


def _steps(chart: plotted.Chart) -> str:
    """Each step in a line beyond both points' recorded noise, with the commits around it: a regression or an
    improvement to look at, not noise."""
    flagged = []
    for name in dict.fromkeys(p.series for p in chart.points):
        line = sorted((p for p in chart.points if p.series == name), key=lambda p: p.x)
        for before, after in zip(line, line[1:]):
            known = None not in (before.low, before.high, after.low, after.high)
            if known and not (before.low <= after.value <= before.high or after.low <= before.value <= after.high):
                commits = [p.note.splitlines()[1].split("commit ")[-1] for p in (before, after)]
                flagged.append(
                    f"{escape(name)}: {before.value:.4g} to {after.value:.4g} {escape(chart.unit)}, beyond the noise "
                    f"of both (commits {escape(commits[0])} then {escape(commits[1])})"
                )
    return f'<ul class="flags">{"".join(f"<li>{f}</li>" for f in flagged)}</ul>' if flagged else ""


def _numbers(chart: plotted.Chart) -> str:
    """A chart's points as a table under it: reachable without hover (a phone has none)."""
    rows = "".join(
        f"<tr><td>{escape(p.x[:16].replace('T', ' '))}</td><td>{escape(p.series)}</td>"
        f'<td>{p.value:.4g} {escape(chart.unit)}</td><td><a href="{escape(p.href)}">run</a></td></tr>'
        for p in sorted(chart.points, key=lambda p: (p.x, p.series))
    )
    return (
        f"<details><summary>the numbers</summary><table><thead><tr><th>run started</th><th>series</th><th>value</th>"
        f"<th></th></tr></thead><tbody>{rows}</tbody></table></details>"
    )


def compare_page(cited: list[Result], every: list[Result]) -> str:
    """Two pickers over every run and hardware class (a class: its newest run of each kind); the figures both
    have, side by side with their ratio. The data is in the page (no server needed)."""
    entries = [
        {
            "id": f"class:{h}",
            "label": f"class {h} (its newest runs)",
            "figures": plotted.figures_by_name([r for r in cited if r.hardware == h]),
        }
        for h in _classes(cited)
    ]
    entries += [{"id": r.path, "label": r.path, "figures": plotted.figures_by_name([r])} for r in reversed(every)]
    entries += [
        {
            "id": f"predicted:{c}",
            "label": f"class {CLASS_NAMES.get(c, c)}, predicted by the models",
            "figures": answers.predicted_figures(c, cited),
        }
        for c in answers.gpu_classes()
    ]
    data = json.dumps(entries, allow_nan=False).replace("</", "<\\/")
    return f"""<p>Pick two runs or hardware classes: every figure they share is shown side by side, with the right's
over the left's, a ratio beyond 1.5x either way marked. Runs and classes with results are measured; the entries
"predicted by the models" (every GPU class of the catalogue) are predictions, labelled so. The address keeps
the pair, to share. Each run's own page has the rest; each GPU class's page, what the models predict there.</p>
<p><label>left <select id="left"></select></label> <label>right <select id="right"></select></label>
<label><input type="checkbox" id="shared" checked> only figures both have</label> <span id="count"></span></p>
<table id="side"><thead><tr><th>figure</th><th>left</th><th>right</th><th>right / left</th><th>unit</th></tr></thead>
<tbody></tbody></table>
<script type="application/json" id="figures">{data}</script>
<script>{COMPARE_SCRIPT}</script>"""


COMPARE_SCRIPT = """
const entries = JSON.parse(document.getElementById("figures").textContent);
const left = document.getElementById("left"), right = document.getElementById("right");
const shared = document.getElementById("shared");
for (const entry of entries) {
  left.add(new Option(entry.label, entry.id));
  right.add(new Option(entry.label, entry.id));
}
const same = (a, b) => JSON.stringify(a.figures) === JSON.stringify(b.figures);
const shares = (a, b) => Object.keys(a.figures).some((name) => name in b.figures);
// the address keeps the pair (#left=...&right=...); else two different entries that share a figure
const asked = new URLSearchParams(location.hash.slice(1));
const at = (id) => entries.findIndex((entry) => entry.id === id);
left.selectedIndex = Math.max(0, at(asked.get("left")));
const other = entries.findIndex((e) => !same(e, entries[left.selectedIndex]) && shares(e, entries[left.selectedIndex]));
right.selectedIndex = at(asked.get("right")) >= 0 ? at(asked.get("right")) : Math.max(0, other);
const number = (value) => value === undefined ? "" : value.toPrecision(4);
const natural = (a, b) => a.localeCompare(b, undefined, {numeric: true});
function show() {
  const a = entries[left.selectedIndex].figures, b = entries[right.selectedIndex].figures;
  const names = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort(natural);
  const both = names.filter((name) => name in a && name in b);
  const body = document.querySelector("#side tbody");
  body.replaceChildren();
  if (!both.length && shared.checked) {
    body.insertRow().insertCell().textContent = "nothing in common: these two measured different things";
  }
  for (const name of shared.checked ? both : names) {
    const row = body.insertRow();
    const [x, unit] = a[name] || [undefined, b[name][1]];
    const y = (b[name] || [undefined])[0];
    const ratio = x && y !== undefined ? y / x : undefined;
    if (ratio !== undefined && (ratio > 1.5 || ratio < 1 / 1.5)) row.className = "far";
    for (const text of [name, number(x), number(y), ratio === undefined ? "" : ratio.toFixed(2) + "x", unit]) {
      row.insertCell().textContent = text;
    }
  }
  document.getElementById("count").textContent = `${both.length} of ${names.length} figures in both`;
  history.replaceState(null, "", `#left=${encodeURIComponent(left.value)}&right=${encodeURIComponent(right.value)}`);
}
for (const control of [left, right, shared]) control.addEventListener("change", show);
show();
"""


def _classes(results: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.hardware for r in results))


def table_pages(cited: list[Result], results: list[Result]) -> Pages:
    """Every generated table as a page, with an index."""
    built = regenerate.build(cited, results)
    found = {f"tables/{name}.html": (f"{name}.md", html_of(text)) for name, text in built.items()}
    listing = "".join(f'<li><a href="{name}.html">{name}.md</a></li>' for name in built)
    intro = "<p>The tables <code>nox -s tables</code> writes under <code>results/tables/</code>, as pages.</p>"
    return {"tables/index.html": ("Tables", f"{intro}<ul>{listing}</ul>"), **found}


def class_pages(cited: list[Result], results: list[Result], timed: list[TimeCheck]) -> Pages:
    """A page per GPU class of the catalogue and per class with results: what the models predict for every size
    class on it, and, where it has results, its runs, GRPO steps and memory, decode, context and rewards."""
    found = {}
    with_results = _classes(results)
    catalogued = answers.gpu_classes()
    every = [*catalogued, *(h for h in with_results if h not in catalogued)]
    for hardware in every:
        sections = []
        if hardware in catalogued or hardware == "cpu":
            sections.append(("What the models predict", answers.class_prediction(hardware, cited, results)))
        if hardware in with_results:
            sections += _measured_sections(hardware, cited, results, timed)
        else:
            sections.append(("Measured here", "<p>No run on this class yet: every figure above is predicted.</p>"))
        body = "\n".join(f"<h2>{escape(title)}</h2>\n{html}" for title, html in sections)
        found[f"hardware/{hardware}.html"] = (f"GPU class {CLASS_NAMES.get(hardware, hardware)}", body)
    listing = "".join(
        f'<li><a href="{h}.html">{escape(CLASS_NAMES.get(h, h))}</a>: '
        f"{sum(r.hardware == h for r in results) or 'no'} result files</li>"
        for h in every
    )
    found["hardware/index.html"] = ("GPU classes", f"<ul>{listing}</ul>")
    return found


def _measured_sections(hardware: str, cited: list[Result], results: list[Result], timed: list[TimeCheck]) -> list:
    mine, all_mine = [r for r in cited if r.hardware == hardware], [r for r in results if r.hardware == hardware]
    return [
        ("GRPO steps: per lever, the newest run", html_of(time_tables.steps_table(mine))),
        ("GRPO memory: measured against the model", result_pages.memory_figure(mine, "../")),
        ("GRPO time: measured against the model", result_pages.time_figure(mine, timed, "../")),
        ("Many ranks", html_of(distributed_table(mine))),
        ("Decode: against its ceiling and the spec", html_of(decode_table(mine))),
        ("Context", html_of(context_table(mine))),
        ("Rewards", html_of(rewards_table(mine))),
        ("Every run", result_pages.runs_list(all_mine, up="../")),
    ]
