"""Published GPU figures as cited data: checked on load, each entry mapped or said why not, both models scored
against them, and a held-out entry never reaches the fit."""

import dataclasses

import pytest

from benchmarks import REPO
from benchmarks.catalog import published
from benchmarks.catalog.levers import ProfileError
from benchmarks.report import published_scores, tables
from benchmarks.report.time_validation import error_line

SOURCES = published.load()
ENTRIES = published.entries()


def test_at_least_thirty_entries_from_four_projects_on_three_gpu_classes_each_with_a_locator_and_a_role():
    assert len(ENTRIES) >= 30
    assert len({s.project for s in SOURCES}) >= 4
    assert len({e.setup.gpu for e in ENTRIES}) >= 3
    assert all(s.locator.startswith(("https://", "github:")) and s.read for s in SOURCES)
    assert all(e.role in published.ROLES and e.quote for e in ENTRIES)
    sizes = {e.mapping.shape for e in ENTRIES if e.mapping}
    assert {"3b", "32b", "72b"} <= sizes  # from 3B to 70B
    assert {e.kind for e in ENTRIES} >= {"min_gpus", "time"}


def test_nemo_rl_s_performance_summary_is_held_out():
    nemo = [e for s in SOURCES if s.project == "NVIDIA NeMo RL" for e in s.entries]
    assert nemo and all(e.role == "held-out" for e in nemo)


def test_every_stated_figure_is_in_the_quote_it_is_copied_from():
    for e in ENTRIES:
        value = e.stated.value
        spelled = {f"{value:g}", f"{value:,g}", f"{value:,.0f}", str(value)}
        assert any(text in e.quote for text in spelled), (e.id, value)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda t: t.replace('role = "held-out"', 'role = "validation"', 1), "role: 'validation' is not one of"),
        (lambda t: t.replace('unit = "GPUs"', 'unit = "gpus"', 1), "unit: 'gpus' is not a unit of min_gpus"),
        (lambda t: t.replace('card = "h100"', 'card = "h20"', 1), "mapping.card: 'h20' is not in"),
        (lambda t: t.replace("max_completion_length = ", "max_completion_lenght = ", 1), "max_completion_lenght"),
        (lambda t: t.replace('figure = "minimum_gpus"', 'figure = "minimum"', 1), "figure: 'minimum' is not a key"),
        (lambda t: t.replace('locator = "', 'locator_ = "', 1), "missing key locator"),
        (lambda t: t.replace('kind = "min_gpus"', 'kind = "relative"', 1), "mapping: a relative figure is not scored"),
    ],
)
def test_a_bad_entry_is_an_error_naming_the_file_the_entry_and_the_key(tmp_path, change, message):
    copy = tmp_path / "verl.toml"
    copy.write_text(change((published.PUBLISHED / "verl.toml").read_text()))
    with pytest.raises(ProfileError) as error:
        published.load(tmp_path)
    named = copy.relative_to(REPO) if copy.is_relative_to(REPO) else copy  # under nox the tmp folder is in the checkout
    assert str(error.value).startswith(str(named)) and message in str(error.value)
    if "locator" not in message:
        assert ": entry 0 (verl-" in str(error.value)


def test_each_mapped_entry_is_scored_and_each_unmapped_one_says_why():
    for score in published_scores.scores():
        if score.entry.mapping is None:
            assert score.predicted is None and score.reason == score.entry.unmapped
        elif score.predicted is None:
            assert score.entry.kind == "min_gpus" and "no count" in score.reason
        else:
            assert score.predicted > 0 and score.ratio == score.predicted / score.entry.stated.value


def calibrated(entry):
    return dataclasses.replace(entry, role="calibration", id=entry.id + "-as-calibration")


def test_a_held_out_entry_never_reaches_the_fit():
    timed = [e for e in ENTRIES if e.kind == "time" and e.mapping]
    assert published_scores.fit_efficiencies(ENTRIES) is None  # no calibration time entry is committed
    assert published_scores.fit_efficiencies(timed) is None
    made = [calibrated(e) for e in timed[:3]]
    fitted = published_scores.fit_efficiencies(made)
    assert fitted is not None and set(fitted.entries) == {e.id for e in made}
    assert 0 < fitted.training_mfu and 0 < fitted.decode_mbu
    assert published_scores.fit_efficiencies(made + timed) == fitted  # held-out ones change nothing


def test_published_md_regenerates_with_the_targets_met_or_missed_and_both_roles_grouped(tmp_path):
    text = tables.build([])["published"]
    assert text.startswith("## Published GPU figures against the models")
    for claim in ("held-out memory: median within 1.25x", "held-out time: median within 1.5x",
                  "held-out minimum GPUs: matched exactly on at least 80%"):  # fmt: skip
        line = next(line for line in text.splitlines() if claim in line)
        assert any(word in line for word in (": met (", ": MISSED (", ": not measured ("))
    assert "### Fewest GPUs, held-out" in text and "### Not mapped, so not scored" in text
    assert "the rollout would need" in text  # which term is off, and by how much


def test_estimate_on_a_gpu_class_states_its_published_error():
    assert error_line("h100").startswith("error on published figures of this class")
    assert "seconds a step predicted at" in error_line("h100") and "fewest GPUs matched on" in error_line("h100")
    assert "not known on this class" in error_line("h200")
