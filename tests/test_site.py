"""The static site, built from the committed results, in a real browser: headless Chromium (Debian's package,
driven by Playwright) loads every page over HTTP from 127.0.0.1; no console error, every internal link, style and
figure resolves, the ledger shows every claim, and every sizing cell links to a run that exists or says it is
predicted."""

import functools
import http.server
import re
import shutil
import threading
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import pytest

from benchmarks import REPO
from benchmarks.catalog.profiles import load_hardware
from benchmarks.report import frames
from benchmarks.report.markdown import claims, regenerate, sizing
from benchmarks.report.web import builder, plotted, sitemap, svg
from benchmarks.report.web.sitemap import link_result_files
from benchmarks.report.web.svg import Point
from benchmarks.results import schema


@pytest.fixture(scope="module")
def built(committed_results, tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    return out, builder.build_site(committed_results, out)


@pytest.fixture(scope="module")
def served(built):
    """The built site over HTTP on a free loopback port, as `python -m http.server` serves it."""
    out, _ = built
    handler = functools.partial(QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on PATH: Debian's `apt-get install chromium` (nox -s tests does it as root)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


class Links(HTMLParser):
    """Every href and src of a page."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        self.found += [value for name, value in attrs if name in ("href", "src") and value]


def test_every_internal_link_of_the_built_site_names_a_file_it_holds(built):
    out, pages = built
    assert {"index.html", "claims.html", "sizing.html", "series.html", "compare.html", "hardware/cpu.html"} <= {
        str(p.relative_to(out)) for p in pages
    }
    for page in pages:
        parser = Links()
        parser.feed(page.read_text())
        for link in parser.found:
            if link.startswith(("data:", "http://", "https://", "#")):
                continue
            target = (page.parent / unquote(link.split("#")[0])).resolve()
            assert target.is_file(), f"{page.relative_to(out)} links to {link}, which the site does not hold"


# each link as the browser resolves it (SVG's <a> too, whose href is no string)
RESOLVED = "els => els.map(e => new URL(e.getAttribute('href') || e.getAttribute('src'), document.baseURI).href)"


WIDTHS = (390, 1366)  # a phone and a laptop
WIDER = "() => document.documentElement.scrollWidth - window.innerWidth"


def test_every_page_loads_in_chromium_without_an_error_and_resolves_its_links_and_figures(built, served, browser):
    out, pages = built
    page = browser.new_page(viewport={"width": WIDTHS[1], "height": 800})
    errors = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("requestfailed", lambda request: errors.append(f"failed: {request.url}"))
    page.on("response", lambda response: response.status >= 400 and errors.append(f"{response.status}: {response.url}"))
    for path in pages:
        name = str(path.relative_to(out))
        page.goto(served + name)
        page.wait_for_load_state("load")
        assert not errors, f"{name}: {errors}"
        links = page.eval_on_selector_all("a[href], link[href], img[src]", RESOLVED)
        for link in links:
            if link.startswith(served):
                local = out / unquote(urlsplit(link).path).lstrip("/")
                assert local.is_file(), f"{name} links to {link}, which does not resolve"
        broken = page.eval_on_selector_all("img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0))")
        assert not broken, f"{name}: an image did not load"
        assert page.evaluate(WIDER) <= 0, f"{name}: wider than a {WIDTHS[1]} pixel window"
    page.close()


def test_no_page_is_wider_than_a_phone_wide_tables_scroll_inside_their_box(built, served, browser):
    out, pages = built
    page = browser.new_page(viewport={"width": WIDTHS[0], "height": 844})
    for path in pages:
        name = str(path.relative_to(out))
        page.goto(served + name)
        assert page.evaluate(WIDER) <= 0, f"{name}: {page.evaluate(WIDER)} pixels wider than a {WIDTHS[0]} px phone"
    tops = page.eval_on_selector_all("header nav a", "links => links.map(a => a.getClientRects().length)")
    assert tops and all(n == 1 for n in tops)  # no label wraps mid-label
    page.close()


def test_the_front_page_answers_on_its_first_screen_at_1366_by_800(built, served, browser):
    page = browser.new_page(viewport={"width": 1366, "height": 800})
    page.goto(served + "index.html")
    banner = page.locator(".banner").inner_text()
    assert re.search(r"\d+ of \d+ GPU classes measured by this suite", banner)
    rows = page.locator("#answers tbody tr")
    assert rows.count() == 6  # the guide's size classes
    header = page.locator("#answers thead").inner_text()
    assert "s a step" in header and "GPU-h per 1,000 steps" in header
    last = rows.nth(rows.count() - 1).bounding_box()
    assert last["y"] + last["height"] <= 800  # without scrolling
    page.close()


def test_there_is_a_page_for_every_gpu_class_of_the_catalogue_and_every_size_class_of_the_guide(built):
    out, pages = built
    names = {str(p.relative_to(out)) for p in pages}
    classes = {h.gpu_class for h in load_hardware().values() if h.memory_gib}
    assert {f"hardware/{c}.html" for c in classes} <= names
    assert {f"sizes/{s}.html" for s in sizing.GUIDE_SAYS} <= names
    h100 = (out / "hardware/h100.html").read_text()
    assert "What the models predict" in h100 and "No run on this class yet" in h100 and "predicted" in h100
    plan_page = (out / "sizes/32b.html").read_text()
    assert "<svg" in plan_page and "* marks the Pareto" in plan_page and "predicted" in plan_page


def test_the_claims_page_shows_every_claim_of_the_ledger_with_its_status(committed_results, served, browser):
    cited = regenerate.headline(schema.load_results(committed_results))
    expected = claims.ledger(cited)
    page = browser.new_page()
    page.goto(served + "claims.html")
    rows = page.locator("#ledger tbody tr")
    assert [rows.nth(i).get_attribute("data-claim") for i in range(rows.count())] == [c.key for c in expected]
    for index, claim in enumerate(expected):
        assert claim.status in rows.nth(index).inner_text()
    page.close()


def test_each_sizing_cell_links_to_its_run_or_says_it_is_predicted(built, served, browser):
    out, _ = built
    page = browser.new_page()
    page.goto(served + "sizing.html")
    measured = page.locator("#sizing td.measured a")
    assert measured.count() >= 1  # the committed CPU runs
    for i in range(measured.count()):
        href = measured.nth(i).get_attribute("href")
        assert re.fullmatch(r"runs/[\w-]+/\w+-\w+\.html", href) and (out / href).is_file()
        page_of_run = out / href
        assert (page_of_run.parent / (page_of_run.stem + ".json")).is_file()  # the result file beside its page
    predicted = page.locator("#sizing td.predicted")
    assert predicted.count() >= 1
    for i in range(predicted.count()):
        assert "predicted" in predicted.nth(i).inner_text() or "no prediction" in predicted.nth(i).inner_text()
    page.close()


def test_the_side_by_side_page_compares_two_runs_and_the_series_keep_their_numbers(served, browser):
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(served + "compare.html")
    assert page.locator("#side tbody tr").count() >= 1
    options = page.locator("#left option")
    page.select_option("#left", index=options.count() - 1)
    page.uncheck("#shared")
    assert page.locator("#side tbody tr").count() >= 1 and not errors
    page.goto(served + "series.html")
    charts = page.locator("svg.chart")
    assert charts.count() >= 4
    first = charts.first.locator("circle title").first.text_content()
    assert re.search(r"\d", first) and "commit" in first  # the value and its provenance, on hover
    page.close()


def test_the_readme_shows_the_front_page_and_says_how_to_build_the_site():
    readme = (REPO / "README.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    for name in ("site-front.png", "site-front-phone.png"):  # a laptop's first screen and a phone's
        assert f"docs/{name}" in images and (REPO / "docs" / name).is_file()
    assert "nox -s site" in readme and "http.server" in readme


def test_the_site_links_a_result_file_named_in_a_tables_text_but_not_inside_a_script():
    body = '<p>see cpu/a-grpo.json</p><script>{"id": "cpu/a-grpo.json"}</script><a href="x">cpu/a-grpo.json</a>'
    linked = link_result_files(body, "../", ["cpu/a-grpo.json"])
    assert '<p>see <a href="../runs/cpu/a-grpo.html">cpu/a-grpo.json</a></p>' in linked
    assert '<script>{"id": "cpu/a-grpo.json"}</script>' in linked and linked.endswith('<a href="x">cpu/a-grpo.json</a>')


def test_a_series_chart_keeps_each_point_s_value_noise_and_run_and_a_bar_chart_marks_the_prediction():
    points = [
        Point("cpu 135m", "2026-12-01T10:00", 9.0, 8.5, 9.5, "runs/cpu/a.html", "commit abc1234"),
        Point("cpu 135m", "2026-12-01T12:00", 12.0),
        Point("h200 32b", "2026-12-01T11:00", 3.0, href="runs/h200/b.html"),
    ]
    drawn = svg.series_chart("GRPO step, baseline", "s/step", points)
    titles = re.findall(r"<title>(.*?)</title>", drawn, re.DOTALL)
    assert titles[0] == "cpu 135m\n2026-12-01T10:00: 9 s/step (from 8.5 to 9.5)\ncommit abc1234"
    assert len(titles) == 3 and drawn.count('class="noise"') == 1  # noise only where it was recorded
    assert drawn.count("<a href=") == 2 and drawn.count("<polyline") == 2  # a line per series
    bars = svg.bar_chart("peak", "GiB", [("baseline", 2.9, 3.1, ""), ("lora", 1.7, None, "")])
    assert bars.count('class="predicted"') == 1 and "measured 2.9 GiB, predicted 3.1 GiB" in bars


def test_the_site_replaces_an_earlier_site_but_never_a_folder_of_other_files(committed_results, tmp_path):
    elsewhere = tmp_path / "docs"
    elsewhere.mkdir()
    (elsewhere / "notes.md").write_text("kept")
    with pytest.raises(ValueError, match="not empty and not a site"):
        builder.build_site(committed_results, elsewhere)
    assert [p.name for p in elsewhere.iterdir()] == ["notes.md"]
    out = tmp_path / "site"
    builder.build_site(committed_results, out)
    (out / "stale.html").write_text("from an older build")
    builder.build_site(committed_results, out)  # an earlier site is rebuilt whole
    assert not (out / "stale.html").exists() and (out / "index.html").is_file()


def test_the_series_page_has_contents_no_single_run_chart_and_a_line_per_machine(committed_results, built):
    out, _ = built
    assert '<ol class="contents">' in (out / "series.html").read_text()
    results = schema.load_results(committed_results)
    charts = plotted.series(regenerate.headline(results, every_run=True))
    machines = {frames.provenance(r)[0] for r in results}
    assert charts and all(len({p.x for p in c.points}) > 1 for c in charts)
    assert all(any(p.series.endswith(", " + m) for m in machines) for c in charts for p in c.points)


def test_a_step_beyond_both_points_noise_is_flagged_with_the_commits_around_it():
    def point(x, value, commit):
        return Point(
            "cpu 135m, AMD EPYC", x, value, value * 0.95, value * 1.05, "", f"f.json\nAMD EPYC, commit {commit}"
        )

    jump = plotted.Chart(
        "GRPO step, baseline", "s/step", [point("2026-12-01", 10.0, "aaa"), point("2026-12-02", 30.0, "bbb")]
    )
    assert "10 to 30 s/step, beyond the noise of both (commits aaa then bbb)" in sitemap._steps(jump)
    noise = plotted.Chart(
        "GRPO step, baseline", "s/step", [point("2026-12-01", 10.0, "a"), point("2026-12-02", 10.2, "b")]
    )
    assert sitemap._steps(noise) == ""


def test_side_by_side_keeps_its_pair_in_the_address_and_compares_predicted_classes(served, browser):
    page = browser.new_page()
    page.goto(served + "compare.html")
    assert page.locator("#left").input_value() != page.locator("#right").input_value()  # never a run with itself
    page.goto(served + "compare.html#left=predicted%3Ah100&right=predicted%3Ah200")
    page.reload()
    assert page.locator("#left").input_value() == "predicted:h100"
    rows = page.locator("#side tbody tr")
    assert rows.count() >= 3 and "(predicted)" in rows.first.inner_text()
    page.select_option("#right", "predicted:b200")
    assert "right=predicted%3Ab200" in page.url  # the pair travels with the address
    page.select_option("#left", index=0)  # a measured CPU class beside a predicted one: nothing in common
    assert "nothing in common" in page.locator("#side tbody").inner_text()
    page.close()
