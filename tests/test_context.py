"""The max-context search: the search itself on a known threshold, the analytic model's
prediction for each loss path, the verdict, and real probes on the tiny shape."""

import dataclasses
import subprocess
import sys

import pytest

from benchmarks import REPO
from benchmarks.catalog import profiles
from benchmarks.catalog.profiles import load, load_hardware, load_shapes
from benchmarks.cli import main
from benchmarks.commands.output import RESULTS
from benchmarks.model.memory.predict import GIB, Workload, estimate
from benchmarks.results import schema
from benchmarks.run.max_context import bisection, contender_runs


def searched(name, settings, model_dir, logs, saves=None):
    """One contender's search on this CPU by this interpreter, as ``run_context`` runs it."""
    entry = contender_runs.new_entry(name, cuda=False)
    save = (lambda: saves.append(len(entry.probes))) if saves is not None else (lambda: None)
    contender_runs.run_contender(entry, sys.executable, settings, model_dir, load_hardware()["cpu"], False, logs, save)
    return entry


def counted(threshold):
    probed = []

    def fits(length):
        probed.append(length)
        return length <= threshold

    return fits, probed


@pytest.mark.parametrize("threshold", [16, 100, 777, 1000, 5000])
def test_search_brackets_the_threshold_within_the_resolution(threshold):
    fits, probed = counted(threshold)
    passed, failed = contender_runs.search(fits, start=64, ceiling=8192, resolution=0.125, granule=16)
    assert passed <= threshold < failed
    assert failed - passed <= max(16, passed * 0.125)
    assert passed in probed and failed in probed and all(length % 16 == 0 for length in probed)
    assert len(probed) == len(set(probed))  # no length probed twice


def test_search_doubles_then_bisects():
    fits, probed = counted(300)
    contender_runs.search(fits, start=64, ceiling=8192, resolution=0.125, granule=16)
    assert probed[:4] == [64, 128, 256, 512]
    assert all(256 < length < 512 for length in probed[4:])


def test_search_reports_a_fitting_ceiling_and_nothing_fitting():
    assert contender_runs.search(counted(10**6)[0], start=64, ceiling=1024, resolution=0.125, granule=16) == (
        1024,
        None,
    )
    fits, probed = counted(0)
    assert contender_runs.search(fits, start=64, ceiling=1024, resolution=0.125, granule=16) == (None, 16)
    assert probed == [64, 32, 16]


def linear_probe(threshold, base=10**9, per_token=10**6):
    """A stack whose peak grows linearly: it fits exactly up to ``threshold`` tokens."""
    probed = []

    def probe(length):
        probed.append(length)
        peak = base + per_token * length
        return length <= threshold, peak if length <= threshold else None

    return probe, probed, base + per_token * threshold


@pytest.mark.parametrize("threshold", [100, 777, 1000, 5000])
@pytest.mark.parametrize("model_error", [0.0, 0.05, -0.05, 0.4, -0.4, 2.0])
def test_the_guided_search_finds_the_full_search_s_bracket(threshold, model_error):
    probe, probed, budget = linear_probe(threshold)

    def modelled(length):  # the fixed part off by 10%, the growth by model_error
        return 0.9 * 10**9 + (1 + model_error) * 10**6 * length

    passed, failed = bisection.guided_search(probe, modelled, budget, 64, 8192, 0.125, 16)
    assert passed <= threshold < failed and failed - passed <= max(16, passed * 0.125)
    assert len(probed) == len(set(probed)) and all(length % 16 == 0 for length in probed)
    full = contender_runs.search(counted(threshold)[0], start=64, ceiling=8192, resolution=0.125, granule=16)
    assert abs(passed - full[0]) <= max(16, full[0] * 0.125)  # the full search's maximum, within one step
    full_probes = counted(threshold)
    contender_runs.search(full_probes[0], start=64, ceiling=8192, resolution=0.125, granule=16)
    assert len(probed) <= len(full_probes[1])
    if abs(model_error) <= 0.05:  # a model right within the resolution: the first probe and three more
        assert len(probed) <= 4


def test_the_guided_search_halves_where_nothing_fits_and_stops_at_a_fitting_ceiling():
    probe, probed, budget = linear_probe(0)
    assert bisection.guided_search(probe, lambda n: n, budget, 64, 1024, 0.125, 16) == (None, 16)
    assert probed == [64, 32, 16]
    probe, probed, budget = linear_probe(10**6)
    assert bisection.guided_search(probe, lambda n: 0, budget, 64, 1024, 0.125, 16) == (1024, None)
    assert probed == [64, 1024]


def committed_stack(contender):
    """A contender of the committed full search (cpu, 0.5B bf16, 5 GiB) as a probe: what it measured
    at the lengths it probed, linear between fitting ones; a length between its maximum and its first
    failing length counts as failing."""
    fitting = sorted((p.completion_tokens, p.peak_bytes) for p in contender.probes if p.fits)

    def peak(length):
        for (a, peak_a), (b, peak_b) in zip(fitting, fitting[1:], strict=False):
            if a <= length <= b:
                return peak_a + (peak_b - peak_a) * (length - a) / (b - a)
        return fitting[0][1]

    probed = []

    def probe(length):
        probed.append(length)
        fits = length <= contender.max_completion_tokens
        return fits, int(peak(length)) if fits else None

    return probe, probed


@pytest.mark.parametrize(
    "file, profile, most_probes",
    [
        ("cpu/20261130T095535Z-context.json", "cpu-full", 10),
        ("cpu/20261130T215752Z-context.json", "cpu", 10),
        ("cpu/20261130T223109Z-context.json", "cpu", 4),
        ("cpu/20261130T225626Z-context.json", "cpu", 4),
        ("cpu/20261130T230900Z-context.json", "cpu", 4),
        ("cpu/20261130T235826Z-context.json", "cpu", 4),
        ("cpu/20261201T002247Z-context.json", "cpu", 4),
        ("cpu/20261201T004721Z-context.json", "cpu", 4),
        ("cpu/20261201T010344Z-context.json", "cpu", 4),
    ],
)
def test_on_the_committed_searches_the_guided_search_finds_the_same_maxima(file, profile, most_probes):
    """Replayed on what each committed search measured, the guided search brackets the same
    maxima. With glibc's own malloc thresholds (the first two) the RSS peak is flat at short lengths, where
    the rollout and the freed tensors glibc keeps set it, then jumps, and the search saves no probe; with
    the thresholds fixed (the others: a doubling search and six guided ones, whose probes are sparser) the
    RSS follows live tensors and 4 probes a contender do."""
    committed = schema.read_result(RESULTS / file, "context").record
    kept = ("shape", "dtype", "budget_gib", "prompt_words", "start_tokens", "max_tokens", "resolution", "granule")
    settings = dataclasses.replace(load(profile).context, **{key: getattr(committed.search, key) for key in kept})
    assert profiles.Levers.recorded(committed.search.levers) == settings.levers
    shape, hardware = load_shapes()[settings.shape], load_hardware()["cpu"]
    measured = [c for c in committed.contenders if c.status == "measured"]
    assert len(measured) == 3
    for contender in measured:
        probe, probed = committed_stack(contender)
        levers = contender_runs.contender_levers(contender.name, settings)

        def modelled(length, levers=levers, path=contender.logits_path):
            work = Workload.from_levers(levers, settings.prompt_words, length)
            return estimate(shape, settings.dtype, levers, work, hardware, path).peak

        budget = int(settings.budget_gib * GIB)
        args = (settings.start_tokens, settings.max_tokens, settings.resolution, settings.granule)
        passed, failed = bisection.guided_search(probe, modelled, budget, *args)
        best = contender.max_completion_tokens
        assert passed <= best < failed and failed <= max(passed + 16, passed * 1.125), contender.name
        assert len(probed) == len(set(probed)) and len(probed) <= most_probes, (contender.name, probed)


def test_the_analytic_model_orders_the_loss_paths_as_their_logits_terms():
    """On a GPU (the h200 profile's search). On a CPU TRL's tiled path folds its tiles in torch, eight fp32
    tiles a position, prompt included, and ranks with the materialised logits (as measured there)."""
    settings = load("h200").context
    shape, hardware = load_shapes()[settings.shape], load_hardware()["h200"]
    longest = {
        path: contender_runs.predicted_max(shape, settings, settings.levers, hardware, path)
        for path in ("materialised", "trl-tiled", "row-chunked")
    }
    # at the search's granule of 64 tokens the two chunked paths may tie; at one length their peaks do not
    assert longest["materialised"] < longest["trl-tiled"] <= longest["row-chunked"]
    peaks = [
        contender_runs.budgeted_peak(shape, settings, settings.levers, hardware, path, longest["trl-tiled"])
        for path in ("materialised", "trl-tiled", "row-chunked")
    ]
    assert peaks[0] > peaks[1] > peaks[2]
    share = contender_runs.logits_share(settings, hardware, longest["materialised"], "materialised")
    assert share.logits_bytes == share.terms["logits"] > 0.3 * share.rest_bytes


def entry(name, best, at_ceiling=False, predicted=None):
    stack = "unsloth" if name.startswith("unsloth") else "trl"
    return schema.ContenderRun(
        name=name,
        role="",
        stack=stack,
        logits_path="trl-tiled",
        status="measured",
        max_completion_tokens=best,
        at_ceiling=at_ceiling,
        predicted_max_completion_tokens=predicted or best,
    )


def test_ratios_and_verdict_quote_the_claim_and_follow_the_numbers():
    contenders = [entry("trl-1.14.2", 100), entry("trl-1.16", 400), entry("unsloth-2026.10.9", 800, predicted=600)]
    table = contender_runs.ratios(contenders)
    assert table["unsloth-2026.10.9"]["measured_vs_trl-1.14.2"] == 8.0
    assert table["unsloth-2026.10.9"]["predicted_vs_trl-1.14.2"] == 6.0
    assert table["unsloth-2026.10.9"]["measured_vs_trl-1.16"] == 2.0
    said = contender_runs.verdict(contenders, table, cuda=False)
    assert "7x" in said.seed_claim and "12x" in said.unsloth_claim
    assert "holds here" in said.text and "CPU backend" in said.text

    contenders[2] = entry("unsloth-2026.10.9", 300)
    said = contender_runs.verdict(contenders, contender_runs.ratios(contenders), cuda=False)
    assert "3.0x" in said.text and "not reproduced" in said.text

    contenders[2] = entry("unsloth-2026.10.9", 900, at_ceiling=True)
    assert "lower bound" in contender_runs.verdict(contenders, contender_runs.ratios(contenders), cuda=True).text


def test_a_contender_that_needs_cuda_is_skipped_with_the_reason(tmp_path):
    settings = load("cpu").context
    result = searched("trl-1.16-liger", settings, tmp_path, tmp_path)
    assert result.status == "skipped" and "Triton" in result.reason and result.probes == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--contenders", "trl-1.16,nope"], "unknown nope"),
        (["--python", "nope=/usr/bin/python3"], "--python 'nope=/usr/bin/python3'"),
        (["--budget-gib", "-1"], "must be positive"),
        (["--shape", "13b"], "--shape '13b'"),
    ],
)
def test_the_command_names_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["context", *argv])
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("trl")
    from benchmarks.run.model_dirs import materialise

    return materialise(load_shapes()["tiny"], "float32", root=tmp_path_factory.mktemp("models"))


def tiny_settings(budget_gib, **changes):
    settings = load("cpu").context
    levers = dataclasses.replace(settings.levers, num_generations=2, per_device_train_batch_size=2, model="full")
    return dataclasses.replace(settings, shape="tiny", dtype="float32", budget_gib=budget_gib, levers=levers, **changes)


def test_probes_run_real_steps_and_stop_at_the_ceiling(tiny, tmp_path):
    settings = tiny_settings(8.0, start_tokens=16, max_tokens=32)
    result = searched("trl-1.16", settings, tiny, tmp_path)
    assert result.status == "measured", result.reason
    assert [p.completion_tokens for p in result.probes] == [16, 32]
    assert all(p.fits and p.peak_bytes > 0 and p.step_s > 0 for p in result.probes)
    assert result.max_completion_tokens == 32 and result.at_ceiling
    assert result.versions["trl"].startswith("1.16")


def test_a_budget_below_the_runtime_fits_nothing_and_every_probe_says_where(tiny, tmp_path):
    settings = tiny_settings(0.15, start_tokens=32, max_tokens=64)
    result = searched("trl-1.16", settings, tiny, tmp_path)
    assert result.max_completion_tokens is None and result.first_failing_tokens == 16
    assert [p.status for p in result.probes] == ["oom", "oom"]
    assert all(p.phase and "budget" in p.reason for p in result.probes)


def test_a_search_is_checked_against_the_newest_earlier_search_of_the_same_settings(committed_results):
    settings = load("cpu-full").context
    earlier = contender_runs.earlier_search(committed_results, "cpu", settings)
    assert earlier.file == "cpu/20261130T095535Z-context.json"
    assert {name: c["max_completion_tokens"] for name, c in earlier.contenders.items()} == {
        "trl-1.14.2": 160,
        "trl-1.16": 256,
        "unsloth-2026.10.9": 512,
    }
    assert (
        contender_runs.earlier_search(committed_results, "cpu", dataclasses.replace(settings, budget_gib=6.0)) is None
    )
    assert contender_runs.earlier_search(committed_results, "h200", settings) is None

    def run(name, best, probes):
        probe = schema.Probe(
            completion_tokens=best,
            status="ok",
            fits=True,
            peak_bytes=1,
            peak_measure="",
            predicted_peak_bytes=1,
            wall_s=1,
        )
        return schema.ContenderRun(
            name=name, role="", stack="trl", logits_path="", status="measured", probes=[probe] * probes,
            max_completion_tokens=best,
        )  # fmt: skip

    took, probes, agree = contender_runs.search_targets(
        [run("trl-1.14.2", 176, 3), run("trl-1.16", 256, 5)], earlier, settings, 600.0
    )
    assert took.met and probes.measured == 5 and probes.met is False
    assert agree.measured == pytest.approx(0.8) and agree.met and earlier.file in agree.claim  # 16 of 20 tokens
    *_, apart = contender_runs.search_targets([run("trl-1.14.2", 208, 3)], earlier, settings, 600.0)
    assert apart.measured == pytest.approx(2.4) and apart.met is False
    *_, unmeasured = contender_runs.search_targets([run("trl-1.16", 256, 3)], None, settings, 600.0)
    assert unmeasured.met is None and "none here" in unmeasured.claim


RETAINED = """
import ctypes, ctypes.util, sys
from benchmarks.run.grpo.worker import fix_malloc_thresholds
if sys.argv[1] == "fixed":
    fix_malloc_thresholds(131072)
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
libc.free(libc.malloc(1 << 20))  # glibc's own: the first freed large block raises its mmap threshold
blocks = [libc.malloc(1 << 20) for _ in range(200)]
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
for block in blocks[:-1]:  # all but the last: the heap cannot be trimmed past it
    libc.free(block)
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
print(rss // (1 << 20))
"""


def test_fixed_malloc_thresholds_give_freed_tensors_back_where_glibc_s_own_keep_them():
    def rss_mib(mode):
        done = subprocess.run([sys.executable, "-c", RETAINED, mode], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    kept, fixed = rss_mib("glibc"), rss_mib("fixed")
    assert kept - fixed > 150  # 199 freed MiB kept in glibc's heap, given back with the thresholds fixed
