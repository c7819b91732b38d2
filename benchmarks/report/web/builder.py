"""The results as a static site (``nox -s site``), rebuilt whole from ``results/runs`` and never committed:

    python -m benchmarks site [--results DIR] [--out DIR] [--screenshot FILE]

Pages, all plain files with relative links (open ``index.html`` or serve the folder with
``python -m http.server``): the claims ledger first; the sizing table, each cell linking to the run behind it or
marked predicted; a page per hardware class; a series per metric over every run; any two runs or classes side by
side; every generated table; and a page per result file with its machine, commit and raw file. Made from the same
records, frames and tables as ``nox -s tables``; the site's own pages are in ``sitemap``."""

from __future__ import annotations

import re
import shutil
import subprocess
from html import escape
from pathlib import Path

from benchmarks.report.markdown import regenerate
from benchmarks.report.web import sitemap
from benchmarks.results.schema import load_results

SITE_MARK = ".grpo-bench-site"  # in every folder this builds: the one kind of folder it may empty
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #1d1d1f; }
header { background: #20232a; padding: 6px 16px; }
header nav { display: flex; flex-wrap: wrap; gap: 2px 16px; }
header a { color: #e8e8e8; text-decoration: none; white-space: nowrap; }
main { padding: 8px 16px 32px; max-width: 1500px; overflow-wrap: anywhere; }
h1 { font-size: 24px; margin: 10px 0 6px; }
.scroll { overflow-x: auto; max-width: 100%; }
.scroll table { overflow-wrap: normal; }
.scroll.tall { max-height: 85vh; overflow: auto; }
.tall thead th { position: sticky; top: 0; z-index: 1; }
#sizing td { min-width: 9em; }
pre { overflow-x: auto; }
img, svg { max-width: 100%; height: auto; }
footer { padding: 12px 24px; color: #666; font-size: 13px; border-top: 1px solid #ddd; }
table { border-collapse: collapse; margin: 12px 0; font-size: 13px; }
th, td { border: 1px solid #d0d0d0; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f2f2f2; }
.status { font-weight: 600; white-space: nowrap; padding: 2px 6px; border-radius: 4px; }
.holds { background: #d7f5dd; } .fails { background: #fbd9d9; }
.published-holds { background: #e3f2e6; outline: 1px dashed #6a6; }
.published-fails { background: #f7e3e3; outline: 1px dashed #a66; }
.predicted-only { background: #fff1c9; } .unmeasured { background: #e6e6e6; } .no-figure { background: #dceafc; }
td.predicted { background: #fffbea; } td.measured { background: #eefbf0; }
#side tr.far td { background: #fde7d4; font-weight: 600; }
.chart { margin: 12px 0; max-width: 100%; height: auto; }
.chart .title { font-weight: 600; font-size: 14px; } .chart .tick, .chart .legend, .chart .label { font-size: 11px; }
.chart .grid { stroke: #e4e4e4; } .chart .noise { stroke-width: 2; opacity: 0.6; }
.chart .predicted { stroke: #000; stroke-width: 2; }
.lede { font-size: 17px; max-width: 900px; }
.banner { background: #fff1c9; padding: 6px 10px; border-radius: 4px; max-width: 1100px; }
.charts { display: flex; flex-wrap: wrap; gap: 4px 24px; }
.charts figure, figure.chart-box { margin: 0; max-width: 100%; overflow-x: auto; }
figure svg.chart { min-width: 600px; }  /* on a phone the chart scrolls in its box: its text stays legible */
.contents { columns: 2 320px; font-size: 13px; }
.flags { color: #a33; font-size: 13px; margin: 2px 0; }
#ledger td:first-child { min-width: 150px; } #ledger td:nth-child(3), #ledger td:nth-child(4) { width: 25%; }
"""


def build_site(results_dir: Path, out: Path) -> list[Path]:
    """Every page under ``out`` (an earlier site there replaced; any other folder with files in it refused, so
    that nothing else is lost), with the result files the pages link to; returns the pages."""
    if out.is_dir() and any(out.iterdir()) and not _built_here(out):
        raise ValueError(f"{out}: not empty and not a site this command built (no {SITE_MARK}): choose another --out")
    results = load_results(results_dir)
    cited = regenerate.headline(results)
    siblings = {r.path: _siblings(results_dir / r.path) for r in results}
    figures = {path: [p.name for p in found if p.suffix == ".png"] for path, found in siblings.items()}
    pages = sitemap.pages(cited, results, figures)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / SITE_MARK).write_text("built by `python -m benchmarks site`; rebuilt whole each time\n")
    (out / "style.css").write_text(STYLE)
    written = []
    footer = (
        f"Results as of {regenerate.last_verified(cited)} (the newest result file cited); built by "
        "<code>nox -s site</code> from results/runs and results/published."
    )
    for relative, (title, body) in pages.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page(title, body, relative.count("/"), footer, [r.path for r in results]))
        written.append(path)
    _copy_result_files(out / "runs", siblings)
    return written


def page(title: str, body: str, depth: int, footer: str, result_paths: list[str]) -> str:
    """A whole page: navigation, the body (result file names in it linked to their pages), the footer."""
    up = "../" * depth
    nav = "".join(f'<a href="{up}{href}">{escape(label)}</a>' for href, label in sitemap.NAV)
    body = re.sub(r"<table\b(?![^>]*data-boxed).*?</table>", lambda m: f'<div class="scroll">{m.group(0)}</div>', body,
                  flags=re.DOTALL)  # fmt: skip
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)} · grpo-bench</title>\n"
        f'<link rel="icon" href="data:,">\n<link rel="stylesheet" href="{up}style.css">\n</head>\n'
        f"<body>\n<header><nav>{nav}</nav></header>\n<main>\n<h1>{escape(title)}</h1>\n"
        f"{sitemap.link_result_files(body, up, result_paths)}\n</main>\n"
        f"<footer>{footer}</footer>\n</body>\n</html>\n"
    )


def _copy_result_files(runs: Path, siblings: dict[str, list[Path]]) -> None:
    """Each result file beside its page, with the figures and reports a run wrote next to it."""
    for path, found in siblings.items():
        for sibling in found:
            target = runs / Path(path).parent / sibling.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(sibling, target)


def _built_here(folder: Path) -> bool:
    """A site this command built: its marker, or (built before the marker) its front page, style and runs list."""
    earlier = ("index.html", "style.css", "runs/index.html")
    return (folder / SITE_MARK).is_file() or all((folder / name).is_file() for name in earlier)


def _siblings(source: Path) -> list[Path]:
    """A result file and what its run wrote beside it under the same name (a decode run's figure and report)."""
    return sorted(source.parent.glob(source.stem + ".*"))


SCREENS = {"": (1366, 800), "-phone": (390, 844)}  # a laptop's first screen and a phone's


def screenshot(index: Path, image: Path, browser: str = "chromium") -> list[Path]:
    """The front page's first screen as headless Chromium draws it on a laptop (``image``) and on a phone (beside
    it, ``-phone``): the README's pictures. Returns both."""
    if shutil.which(browser) is None:
        raise ValueError(f"no {browser} on PATH for the screenshot (Debian: apt-get install chromium)")
    image.parent.mkdir(parents=True, exist_ok=True)
    made = []
    for suffix, (width, height) in SCREENS.items():
        target = image.with_name(image.stem + suffix + image.suffix)
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        command += [f"--window-size={width},{height}", f"--screenshot={target.resolve()}", index.resolve().as_uri()]
        ran = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if ran.returncode != 0 or not target.exists():
            raise ValueError(f"{browser} made no screenshot of {index} (exit {ran.returncode}): {ran.stderr[-500:]}")
        made.append(target)
    return made
