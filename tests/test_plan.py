"""`plan`: the fastest setup that fits per card and count, the same work priced for every setup, the Pareto
front, fixed levers held, and why nothing fits where nothing does."""

import itertools
import json
import re
from dataclasses import replace

import pytest

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.cli import main
from benchmarks.commands import summaries
from benchmarks.model import guide, search
from benchmarks.model.memory.predict import GIB
from benchmarks.report.markdown import sizing
from benchmarks.results.records import readable
from benchmarks.run.grpo.channel import RankReports
from benchmarks.run.grpo.outcome import silent_ending

HARDWARE = load_hardware()


def ask(shape: str, **fixed) -> search.Ask:
    return search.Ask(load_shapes()[shape], replace(guide.GUIDE_BASE, **fixed), frozenset(fixed))


def test_the_plan_picks_the_fastest_where_it_differs_from_the_lightest():
    cell = sizing.predicted_cell("32b", HARDWARE["h200"])
    lightest = search.Ask(load_shapes()["32b"]).step(cell.levers, search.fitted_rates(HARDWARE["h200"]))
    assert cell.count == 1 and cell.label == "LoRA, checkpointing, vLLM sleep"
    assert cell.fastest.step.step_s < lightest.step_s and cell.fastest.levers != cell.levers
    assert cell.fastest.peak <= HARDWARE["h200"].memory_gib * GIB
    # the fastest is the fastest of every lever set the plan weighs on one H200
    weighed = search._axes(search.Ask(load_shapes()["32b"]), 1)
    micro_batches = weighed.pop("per_device_train_batch_size")
    rates, shape_ask = search.fitted_rates(HARDWARE["h200"]), search.Ask(load_shapes()["32b"])
    for values in itertools.product(*weighed.values()):
        choice = dict(zip(weighed, values, strict=True))
        for levers, _, _ in search._fitting(shape_ask, choice, micro_batches, 1, HARDWARE["h200"])[1]:
            assert shape_ask.step(levers, rates).step_s >= cell.fastest.step.step_s


@pytest.mark.parametrize("shape,card,count", [("32b", "h100", 1), ("32b", "h100", 8), ("7b", "rtx4090", 2)])
def test_a_heavier_choice_never_fits_a_larger_micro_batch_than_a_lighter_one(shape, card, count):
    # the pruning in `search.fastest` rests on this: it is checked here over every pair the plan weighs
    asked, hardware = search.Ask(load_shapes()[shape]), HARDWARE[card]
    axes = search._axes(asked, count)
    micro_batches = axes.pop("per_device_train_batch_size")
    choices = [dict(zip(axes, v, strict=True)) for v in itertools.product(*axes.values())]
    largest = [search._fitting(asked, c, micro_batches, count, hardware)[0] for c in choices]
    assert 0 in largest and len(set(largest)) > 2  # some fit none, others differ in the micro-batch they fit
    for (one, one_micro), (other, other_micro) in itertools.product(zip(choices, largest), repeat=2):
        if search.heavier(one, other, axes):
            assert one_micro <= other_micro, (one, other)


def test_a_dominated_row_is_off_the_pareto_front():
    setups = search.plan(ask("7b"), {"h100": HARDWARE["h100"], "h200": HARDWARE["h200"]})
    job = guide.GUIDE_RECIPE
    front = search.pareto(setups, job, {})
    assert front and len(front) < len(setups)
    for row in setups:
        beaten = [o for o in setups if o.wall_s(job) < row.wall_s(job) and o.gpu_hours(job) < row.gpu_hours(job)]
        assert (row in front) == (not beaten)
    # priced: only priced cards are weighed, and price moves the front
    priced = search.pareto(setups, job, {"h100": 1.0})
    assert priced and all(s.card == "h100" for s in priced)


def test_a_fixed_lever_is_held_on_every_row():
    setups = search.plan(ask("14b", model="full", optim="adamw_torch"), {"h100": HARDWARE["h100"]})
    assert setups and all(s.levers.model == "full" and s.levers.optim == "adamw_torch" for s in setups)
    free = search.plan(ask("14b"), {"h100": HARDWARE["h100"]})
    assert min(s.gpus for s in free) < min(s.gpus for s in setups)  # freed, a lighter method needs fewer


def test_cost_counts_the_server_s_gpus_and_a_row_is_the_recipe_s_steps():
    recipe = guide.Recipe.of_batch(256, 8)
    asked = replace(ask("7b", vllm_mode="server"), recipe=recipe)
    served = [s for s in search.plan(asked, {"h100": HARDWARE["h100"]}) if s.server_gpus]
    assert served and all(s.gpus == s.levers.world_size + s.server_gpus for s in served)
    one = served[0]
    assert one.gpu_hours(recipe) == pytest.approx(one.gpus * one.wall_s(recipe) / 3600)
    assert one.wall_s(recipe) == pytest.approx(recipe.steps * one.step.step_s)
    levers = one.levers
    assert levers.world_size * levers.per_device_train_batch_size * levers.gradient_accumulation_steps == 256


def test_at_a_fixed_global_batch_more_gpus_shorten_the_step_and_lower_tokens_a_second_per_gpu():
    asked = replace(ask("7b", model="lora"), recipe=guide.Recipe.of_batch(256, 8))
    on = {n: search.fastest(asked, HARDWARE["h100"], "h100", n) for n in (1, 8, 64)}
    assert on[1].step.step_s > on[8].step.step_s > on[64].step.step_s
    per_gpu = {n: setup.tokens_per_s / setup.gpus for n, setup in on.items()}
    assert per_gpu[1] > per_gpu[8] > per_gpu[64]


def test_a_count_the_global_batch_cannot_feed_is_not_offered(capsys):
    setups = search.plan(ask("0.5b"), {"h100": HARDWARE["h100"]})  # the guide's 8 completions a step
    assert setups and {s.levers.world_size for s in setups} <= {1, 2, 4, 8}
    assert main(["plan", "--shape", "0.5b", "--classes", "h100"]) == 0
    assert "not offered: 16, 24, 32, 48, 64 trainer GPUs: the global batch of 8" in capsys.readouterr().out


def step_seconds(out: str) -> str:
    return re.search(r"^  step\s+(\S+) s;", out, re.MULTILINE).group(1)


def test_the_plan_and_estimate_agree_on_every_row_the_plan_prints(capsys):
    command = ["--shape", "7b", "--global-batch", "256"]
    assert main(["plan", *command, "--classes", "h100"]) == 0
    printed = re.findall(r"^\*?\s+(\d+)(?:\+(\d+))?\s+h100\s+.*?\s(\S+) s\s", capsys.readouterr().out, re.MULTILINE)
    asked = replace(ask("7b"), recipe=guide.Recipe.of_batch(256, 8))
    rows = {(s.levers.world_size, s.server_gpus): s for s in search.plan(asked, {"h100": HARDWARE["h100"]})}
    assert len(printed) > 3
    for trainer, server, seconds in printed:
        setup = rows[(int(trainer), int(server or 0))]
        levers = guide.differing(replace(setup.levers, gradient_accumulation_steps=1), guide.GUIDE_BASE)
        assert main(["estimate", *command, "--hardware", "h100", "--gpus", trainer, "--levers", levers]) == 0
        assert step_seconds(capsys.readouterr().out) == seconds, (trainer, server, levers)


def test_a_card_where_nothing_fits_says_why_and_the_command_exits_non_zero(capsys):
    assert main(["plan", "--shape", "72b", "--method", "full", "--classes", "24gb"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits any card or count (predicted)" in out
    assert "nothing fits up to 64 GPUs" in out and "the binding term is" in out


def test_plan_prints_readable_rows_with_units_and_the_fastest(capsys):
    assert main(["plan", "--shape", "32b", "--classes", "h100,h200", "--price", "h100=2.5", "--currency", "EUR"]) == 0
    out = capsys.readouterr().out
    assert "* the Pareto front" in out and "EUR" in out and " GiB " in out and " s " in out
    assert "the fastest: " in out and "levers held: none" in out
    figures = [w for line in out.splitlines() for w in line.split() if w.replace(",", "").replace(".", "").isdigit()]
    assert figures and all(len(w.replace(",", "").replace(".", "").lstrip("0")) <= 4 for w in figures)


def test_a_figure_is_never_printed_with_more_than_four_significant_digits_or_in_scientific_notation():
    for value, text in ((163.97170993899994, "164"), (12345.6, "12,350"), (0.0004567, "0.0004567"), (900.0, "900")):
        assert readable(value) == text


def test_a_worker_killed_by_the_kernel_says_how_and_where():
    heard = RankReports(endings=[(1, {"event": "done"})], where={0: (2, "forward_backward"), 1: (2, "optimizer")})
    phase, reason = silent_ending(heard, 2, -9)
    assert phase == "forward_backward"
    assert reason.startswith("1 of 2 ranks ended with a word; killed by SIGKILL (under memory pressure the kernel")
    assert "rank 0 was in forward_backward of step 2" in reason and "rank 1" not in reason
    assert "the launcher exited 1" in silent_ending(RankReports(), 1, 1)[1]


def significant(token: str) -> int:
    digits = token.replace(",", "")
    whole, _, fraction = digits.partition(".")
    return len((whole + fraction).lstrip("0")) if fraction else len(whole.lstrip("0").rstrip("0"))


NUMBER = re.compile(r"^\d[\d,]*(\.\d+)?$")


@pytest.mark.parametrize("part", ["grpo", "rewards", "decode"])
def test_no_summary_of_a_committed_run_prints_more_than_four_significant_digits(part, capsys, committed_results):
    path = max((committed_results / "cpu").glob(f"*-{part}.json"))  # not a run just made here: its own test below
    getattr(summaries, part)(path)
    out = capsys.readouterr().out
    tokens = [t.strip("(),;:x%") for line in out.splitlines() for t in line.split()]
    numbers = [t for t in tokens if NUMBER.match(t) and not t.isdigit()]  # a plain integer is a count or setting
    assert numbers and all(significant(t) <= 4 for t in numbers), [t for t in numbers if significant(t) > 4]


def test_a_reward_target_s_ratio_prints_four_significant_digits(tmp_path, capsys, committed_results):
    path = max((committed_results / "cpu").glob("*-rewards.json"))
    data = json.loads(path.read_text())
    data["grpo_bench"]["targets"][0]["lowest_ratio"] = 108.3417  # as a fresh run here measured it
    (tmp_path / path.name).write_text(json.dumps(data))
    summaries.rewards(tmp_path / path.name)
    assert "lowest ratio 108.3x" in capsys.readouterr().out


def test_two_gpu_classes_without_runs_compare_on_the_models_predictions_labelled_so(tmp_path, capsys):
    assert main(["compare", "h100", "h200", "--out", str(tmp_path / "c")]) == 0
    text = (tmp_path / "c" / "compare.md").read_text()
    assert "Predicted by the memory and time models: no result file of h100, h200 yet" in text
    assert "H100-class (79.65 GiB; sized and timed on the NVIDIA H100 SXM), predicted" in text and "| 32b " in text
    assert main(["compare", "nonesuch", "h100", "--out", str(tmp_path / "d")]) == 1
    assert "nonesuch: neither a result file nor a hardware class" in capsys.readouterr().err
    assert main(["compare", "cpu", "h100", "--out", str(tmp_path / "e")]) == 1  # a measured class beside one without
    assert "h100: neither a result file nor" in capsys.readouterr().err
