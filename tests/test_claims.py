"""The claims ledger follows the result files: a claim is measured only by a file of the class it is about,
holds or not by what that file measured, and names the file, machine, commit and date behind it."""

import json
import shutil

from test_tables import grpo_file

from benchmarks import REPO
from benchmarks.catalog import published
from benchmarks.report.markdown import claims, regenerate
from benchmarks.results import schema


def ledger(directory):
    return {claim.key: claim for claim in claims.ledger(regenerate.headline(schema.load_results(directory)))}


def test_every_claim_has_a_status_and_rests_on_the_model_until_its_class_is_measured(tmp_path):
    found = ledger(_copied(tmp_path, "cpu/20261201T175857Z-grpo.json"))
    assert list(found) == ["small", "32b", "70b", "three-levers", "spark-bandwidth", "context-7x", "rewards"]
    assert all(claim.status in claims.STATUSES for claim in found.values())
    for key in ("small", "32b", "70b", "three-levers"):
        assert found[key].status == claims.PREDICTED and not found[key].evidence, key
        assert "GiB" in found[key].model, key
    assert found["spark-bandwidth"].status == claims.UNMEASURED
    assert found["context-7x"].status == claims.UNMEASURED  # no context search among these files


def test_a_grpo_run_on_the_claimed_class_measures_its_anchor(tmp_path):
    runs = tmp_path / "runs"
    path = grpo_file(runs, "h200", "32b", peak_gib=100.0)
    claim = ledger(runs)["32b"]
    assert claim.status == claims.HOLDS and "fits with" in claim.measured
    # a row of fewer, shorter completions than the guide's says so beside its figure
    assert "not the guide's 8 x 1024, which stays predicted" in claim.measured
    assert [e.file for e in claim.evidence] == [f"h200/{path.name}"]
    grpo_file(runs, "h200", "32b", started="2026-12-02T10:00:00+00:00", status="oom", name="b")
    assert ledger(runs)["32b"].status == claims.FAILS  # the newest file of the cell decides


def test_the_three_lever_rule_is_checked_on_every_subset_of_the_levers():
    peaks = claims.three_lever_fits("1.5b")
    assert len(peaks) == 8
    everything = tuple(claims.THREE_LEVERS)
    assert all(peaks[everything] <= peak for peak in peaks.values())  # each lever only lowers the peak


def test_the_context_claim_holds_only_where_a_cuda_search_reaches_it(tmp_path):
    runs = _copied(tmp_path, "cpu/20261201T014312Z-context.json")
    claim = ledger(runs)["context-7x"]
    # on a CPU Unsloth's efficient GRPO loss does not run: the search measures, but does not test the claim
    assert claim.status == claims.UNMEASURED and claim.measured.startswith("5.0x")
    assert "they do not test the claim" in claim.measured
    assert claim.evidence[0].machine == "AMD EPYC" and claim.evidence[0].commit.startswith("7ac199f")
    on_cuda = runs / "cpu/20261201T014312Z-context.json"
    _rewrite(on_cuda, lambda d: d["search"].update(budget_enforced_by="torch.cuda.set_per_process_memory_fraction"))
    assert ledger(runs)["context-7x"].status == claims.FAILS
    _rewrite(on_cuda, lambda d: d["verdict"].update(measured_ratio_vs_unchunked=6.5))
    assert ledger(runs)["context-7x"].status == claims.HOLDS  # within 10% of 7x

    def unsloth_at_ceiling(data):
        next(c for c in data["contenders"] if c["stack"] == "unsloth").update(at_ceiling=True)

    _rewrite(on_cuda, unsloth_at_ceiling)
    claim = ledger(runs)["context-7x"]
    assert claim.status == claims.UNMEASURED and "inconclusive" in claim.measured  # 6.5x is only a lower bound


def entry(kind, value, unit, shape="32b", card="h200", gpus=1):
    """A synthetic published entry of one size and card."""
    mapping = published.Mapping(shape, card, {"model": "lora"}, 256, gpus)
    setup = published.Setup("a framework", "a model", card.upper(), gpus)
    figure = {"figure": published.Figure(value, unit)}
    return published.Entry(
        f"e-{kind}-{value}", "held-out", kind, "figure", "quoted", setup, figure, mapping, source="s"
    )


def test_a_published_figure_of_the_claim_s_size_and_class_moves_its_status_and_stands_beside_it():
    def claim(*entries):
        return {c.key: c for c in claims.ledger([], list(entries))}["32b"]

    assert claim().status == claims.PREDICTED and claim().published == "none of this size class"
    elsewhere = entry("min_gpus", 4, "GPUs", card="h100", gpus=4)  # another class: cited, does not decide
    assert claim(elsewhere).status == claims.PREDICTED
    assert "figure 4 GPUs" in claim(elsewhere).published
    assert claim(entry("min_gpus", 1, "GPUs")).status == claims.PUBLISHED_HOLDS
    assert claim(entry("min_gpus", 2, "GPUs", gpus=2)).status == claims.PUBLISHED_FAILS
    assert claim(entry("memory", 120, "GB")).status == claims.PUBLISHED_HOLDS  # within 140.4 GiB
    assert claim(entry("memory", 150, "GiB")).status == claims.PUBLISHED_FAILS


def test_the_small_row_is_judged_on_the_levers_it_names_with_the_lighter_alternative_beside_it(tmp_path):
    small = ledger(_copied(tmp_path, "cpu/20261201T175857Z-grpo.json"))["small"]
    assert small.title.endswith("with the levers it names")
    assert "full fine-tuning with the levers it names" in small.model and ": does not hold; the lightest" in small.model
    assert "LoRA, checkpointing" in small.model  # the alternative that fits, beside


def test_the_rubric_judge_s_rate_says_it_runs_no_model(tmp_path):
    claim = ledger(_copied(tmp_path, "cpu/20261202T000817Z-rewards.json"))["rewards"]
    assert "rubric_judge_reward 3,570,000/s (a stub judge that runs no model" in claim.measured


def test_the_spark_claim_is_measured_by_a_decode_run_on_a_spark_only(tmp_path):
    runs = _copied(tmp_path, "cpu/20261201T175648Z-decode.json")
    assert ledger(runs)["spark-bandwidth"].status == claims.UNMEASURED
    spark = runs / "cpu/20261201T175648Z-decode.json"

    def on_a_spark(data):  # its profile trains 8 completions a step: the decode rows at batch 8 answer the claim
        data["profile"].update(hardware="spark")
        data["profile"]["grpo"]["levers"]["per_device_train_batch_size"] = 8

    _rewrite(spark, on_a_spark)
    assert ledger(runs)["spark-bandwidth"].status == claims.FAILS  # a few GB/s: far below the budget
    _rewrite(spark, lambda d: [p.update(achieved_gb_s=185.0) for p in d["sweep"] if p["status"] == "ok"])
    claim = ledger(runs)["spark-bandwidth"]
    assert claim.status == claims.HOLDS
    assert claim.measured.startswith("decode 185 GB/s: the median of 2 bandwidth-bound rows at the GRPO batch (8")


def test_the_spark_claim_is_judged_on_the_median_at_the_grpo_batch_not_on_a_best_row(tmp_path):
    runs = _copied(tmp_path, "cpu/20261201T175648Z-decode.json")
    spark = runs / "cpu/20261201T175648Z-decode.json"

    def rows(data):
        data["profile"].update(hardware="spark")
        data["profile"]["grpo"]["levers"]["per_device_train_batch_size"] = 8
        for point in (p for p in data["sweep"] if p["status"] == "ok"):
            point["achieved_gb_s"] = 120.0 if point["batch"] == 8 else 185.0  # the best rows: not the GRPO batch
        launches = next(p for p in data["sweep"] if p["status"] == "ok" and p["batch"] == 8)
        launches.update(execution="eager (transformers generate): bound by kernel launches, not bandwidth")
        launches["achieved_gb_s"] = 185.0  # bound by kernel launches: not a bandwidth figure at all

    _rewrite(spark, rows)
    claim = ledger(runs)["spark-bandwidth"]
    assert claim.status == claims.FAILS and claim.measured.startswith("decode 120 GB/s: the median of 1 ")


def test_the_reward_claim_quotes_the_guides_code_and_the_share_of_a_step(tmp_path):
    runs = _copied(tmp_path, "cpu/20261201T175419Z-rewards.json", "cpu/20261201T175857Z-grpo.json")
    claim = ledger(runs)["rewards"]
    assert claim.status == claims.NO_FIGURE
    assert "test_execution_reward" in claim.measured and "execution reward 0.8% of a step" in claim.measured
    assert claim.evidence[0].commit == "c8745e3 (dirty)"


def _copied(tmp_path, *names):
    runs = tmp_path / "runs"
    for name in names:
        (runs / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "results" / "runs" / name, runs / name)
    return runs


def _rewrite(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
