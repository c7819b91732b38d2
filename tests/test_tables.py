"""Tables and comparisons follow the result files: a synthetic results directory, changed one
file at a time, and the analytic model's command."""

import dataclasses
import json

import pytest

from benchmarks import REPO
from benchmarks.catalog import profiles
from benchmarks.catalog.profiles import Levers, load_shapes
from benchmarks.cli import main
from benchmarks.model.memory.predict import GIB
from benchmarks.report import frames
from benchmarks.report.markdown import regenerate, side_by_side
from benchmarks.results import schema


def grpo_file(
    directory,
    hardware,
    shape,
    started="2026-12-01T10:00:00+00:00",
    status="ok",
    peak_gib=100.0,
    name="a",
    quick=False,
    defined=1,  # configurations the run's profile defines: more than it holds makes it an --only subset
):
    """A GRPO result file of one LoRA configuration, built from the schema's own records."""
    levers = dataclasses.asdict(dataclasses.replace(Levers(), model="lora", gradient_checkpointing=True))
    by_phase = {"rollout": int(0.5 * peak_gib * GIB), "forward_backward": int(peak_gib * GIB)}
    step = schema.Step(step=0, warmup=False, wall_s=3.0, phase_s={"rollout": 1.0, "forward_backward": 2.0})
    step.peak_rss_bytes = by_phase
    on_gpu = hardware != "cpu"  # a GPU row is headlined by device memory, as the harness records it there
    step.peak_device_bytes = by_phase if on_gpu else None
    summary = schema.Summary(
        measured_steps=1,
        step_s_median=3.0,
        step_s_min=3.0,
        step_s_max=3.0,
        completion_tokens_per_s_median=10.0,
        phase_s_median=step.phase_s,
        peak_bytes=by_phase["forward_backward"],
        peak_bytes_by_phase=by_phase,
        peak_measure="device memory held by the worker's processes (NVML usedGpuMemory)" if on_gpu else schema.HOST_RSS,
        peak_rss_bytes=by_phase["forward_backward"],
        peak_rss_bytes_by_phase=by_phase,
        peak_repeat_spread=0.0,
        optimizer_state_bytes=0,
        grad_bytes=0,
        trainable_params=1,
        reference_model_bytes=0,
    )
    configuration = schema.Configuration(name="model=lora", levers=levers, status=status, steps=[step], summary=summary)
    grpo = {
        "prompt_words": 128,
        "dtype": "bfloat16",
        "levers": levers,
        "matrix": {"lora_r": [8 * (i + 1) for i in range(defined)]},
        "extra": [],
    }
    record = schema.GrpoFile(
        schema_version=schema.SCHEMA_VERSION,
        kind="grpo",
        started=started,
        quick=quick,
        complete=True,
        profile={"hardware": hardware, "grpo": grpo},
        shape=schema.ShapeRecord(name=shape, param_count=1),
        configurations=[configuration],
    )
    data = schema.encode(record)
    path = directory / hardware / f"{started[:10].replace('-', '')}T000000Z-{name}-grpo.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def flat(text):
    """A markdown table as pandas writes it, with its cells' padding gone: ``| a | b |``."""
    return "\n".join(" ".join(line.split()) for line in str(text).splitlines())


def sizing_row(directory, shape):
    table = flat(regenerate.sizing_table(schema.load_results(directory)))
    header = table.splitlines()[0]
    row = next(line for line in table.splitlines() if line.startswith(f"| {shape} "))
    return header, dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))


def test_a_measured_cell_names_its_file_and_goes_back_to_predicted_when_the_file_goes(tmp_path):
    path = grpo_file(tmp_path, "h200", "32b")
    _, row = sizing_row(tmp_path, "32b")
    cell = row["H200-class (140.4 GiB)"]
    assert "measured" in cell and path.name in cell and "2026-12-01" in cell and "100.0 GiB" in cell
    assert "predicted" in row["B200-class (179.06 GiB)"]  # no file for it

    path.unlink()
    grpo_file(tmp_path, "cpu", "0.5b")  # something else, so the directory is not empty
    _, row = sizing_row(tmp_path, "32b")
    assert "predicted" in row["H200-class (140.4 GiB)"] and "measured" not in row["H200-class (140.4 GiB)"]


def test_a_decode_sweep_cut_at_its_budget_is_cited_for_its_points_and_said_to_be_cut(tmp_path, committed_results):
    results = tmp_path / "runs"
    decode = max((committed_results / "cpu").glob("*-decode.json"))
    path = results / "cpu" / decode.name
    path.parent.mkdir(parents=True)
    data = json.loads(decode.read_text())
    path.write_text(json.dumps({**data, "complete": False, "ended_early": "stopped at the part's budget"}))
    cited = regenerate.headline(schema.load_results(results))
    assert [r.path for r in cited] == [f"cpu/{decode.name}"]
    assert f"cpu/{decode.name} (ended early: its points so far)" in regenerate.build(cited)["decode"]
    ok = [dict(p, status="error") for p in data["sweep"]]  # not one point measured: nothing to cite
    path.write_text(json.dumps({**data, "sweep": ok, "complete": False, "ended_early": "stopped"}))
    assert regenerate.headline(schema.load_results(results)) == []


def test_a_grpo_run_that_ended_early_is_cited_only_for_the_configurations_it_finished(tmp_path):
    results = tmp_path / "runs"
    path = grpo_file(results, "h200", "32b", started="2026-12-05T10:00:00+00:00")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "complete": False, "ended_early": "signal SIGTERM at ..."}))
    built = regenerate.build(regenerate.headline(schema.load_results(results)))
    row = next(line for line in flat(built["sizing"]).splitlines() if line.startswith("| 32b "))
    assert "measured" in row and path.name in row  # its finished configuration
    written = regenerate.write_tables(results, tmp_path / "tables")
    sizing = next(p for p in written if p.name == "sizing.md").read_text()
    assert f"cited for what they finished (configurations, decode points), ended early: h200/{path.name}" in sizing
    path.write_text(json.dumps({**data, "configurations": [], "complete": False, "ended_early": "signal SIGTERM"}))
    sizing = next(p for p in regenerate.write_tables(results, tmp_path / "tables") if p.name == "sizing.md").read_text()
    assert "Last verified: never" in sizing and f"left out, ended early: h200/{path.name}" in sizing
    path.write_text(json.dumps({**data, "complete": False, "ended_early": "signal SIGTERM at ..."}))
    grpo_file(results, "cpu", "0.5b")  # a whole one, to compare against
    with pytest.raises(
        ValueError, match=r"h200: neither a result file nor a hardware class with results \(classes: cpu\)"
    ):
        side_by_side.resolve_sides(["h200", "cpu"], results)  # h200's only file is not comparable
    sides = side_by_side.resolve_sides([str(path), "cpu"], results)  # named as a file, it says what it is
    assert sides[0].label.endswith("(incomplete: ended early)")


def test_a_schema_1_file_is_whole_only_when_it_reached_its_last_field():
    assert schema.is_complete({"kind": "grpo", "configurations": [], "targets": []}, "grpo")
    assert not schema.is_complete({"kind": "grpo", "configurations": []}, "grpo")  # killed mid-run
    assert not schema.is_complete({"kind": "context", "contenders": []}, "context")
    assert schema.is_complete({"kind": "decode", "ceiling": {}, "projections": []}, "decode")  # ceiling-only runs
    assert schema.is_complete({"grpo_bench": {"kind": "rewards"}, "benchmarks": []}, "rewards")
    assert not schema.is_complete({"grpo_bench": {"kind": "rewards", "complete": False}}, "rewards")


def test_a_cuda_run_is_headlined_by_device_memory_not_host_rss(tmp_path):
    path = grpo_file(tmp_path, "h200", "32b", peak_gib=3.0)  # host RSS: 3 GiB
    data = json.loads(path.read_text())
    summary = data["configurations"][0]["summary"]
    summary.update(peak_bytes=int(90 * GIB), peak_measure="device memory held by the worker's processes (NVML)")
    summary["peak_bytes_by_phase"] = {"rollout": int(60 * GIB), "forward_backward": int(90 * GIB)}
    path.write_text(json.dumps(data))
    _, row = sizing_row(tmp_path, "32b")
    assert "90.0 GiB device" in row["H200-class (140.4 GiB)"]
    from benchmarks.report.validation import measured_phases

    configuration = schema.read_result(path, path.name).record.configurations[0]
    assert measured_phases(configuration) == {"rollout": int(60 * GIB), "training": int(90 * GIB)}


def test_a_run_that_ran_out_of_memory_is_a_measured_does_not_fit(tmp_path):
    grpo_file(tmp_path, "h200", "72b", status="oom")
    _, row = sizing_row(tmp_path, "72b")
    assert row["H200-class (140.4 GiB)"].startswith("does not fit") and "measured" in row["H200-class (140.4 GiB)"]


def test_a_new_gpu_class_gets_a_column(tmp_path):
    grpo_file(tmp_path, "h200", "32b")
    header, _ = sizing_row(tmp_path, "32b")
    assert "H100-class" not in header and "24GB-class" in header and "B200-class" in header
    grpo_file(tmp_path, "h100", "7b")
    header, row = sizing_row(tmp_path, "7b")
    column = "H100-class (79.65 GiB; sized and timed on the NVIDIA H100 SXM)"  # its cards: SXM, PCIe, NVL, H20, GH200
    assert column in header and "measured" in row[column]


def test_the_newest_file_of_a_class_and_size_class_wins(tmp_path):
    grpo_file(tmp_path, "h200", "32b", started="2026-12-01T10:00:00+00:00", peak_gib=100.0)
    grpo_file(tmp_path, "h200", "32b", started="2026-12-02T10:00:00+00:00", peak_gib=120.0, name="b")
    _, row = sizing_row(tmp_path, "32b")
    assert "120.0 GiB" in row["H200-class (140.4 GiB)"] and "2026-12-02" in row["H200-class (140.4 GiB)"]


def test_every_table_is_written_with_the_newest_date_and_a_document_is_rewritten_between_markers(tmp_path):
    results = tmp_path / "runs"
    grpo_file(results, "h200", "32b", started="2026-12-03T10:00:00+00:00")
    written = regenerate.write_tables(results, tmp_path / "tables")
    assert {p.name for p in written} == {f"{name}.md" for name in regenerate.TABLES}
    assert all("Last verified: 2026-12-03" in p.read_text() for p in written)

    doc = tmp_path / "guide.md"
    doc.write_text(
        "Last verified: 2026-07-13\n\n# Sizing\n<!-- grpo-bench:sizing -->\nold table\n<!-- /grpo-bench:sizing -->\n"
        "prose kept\nLast verified: 2026-07-13\n"
    )
    built = regenerate.build(regenerate.headline(schema.load_results(results)))
    assert regenerate.rewrite_document(doc, built, "2026-12-03") == ["sizing"]
    text = doc.read_text()
    assert "old table" not in text and built["sizing"] in text and "prose kept" in text
    assert text.count("Last verified: 2026-12-03") == 2 and "2026-07-13" not in text

    doc.write_text("<!-- grpo-bench:sizes -->\n<!-- /grpo-bench:sizes -->\n")
    with pytest.raises(ValueError, match=r"guide.md: unknown table marker grpo-bench:sizes"):
        regenerate.rewrite_document(doc, built, "2026-12-03")


def test_tables_cite_the_newest_whole_run_of_each_series_and_every_run_only_when_asked(tmp_path):
    results = tmp_path / "runs"
    old = grpo_file(results, "h200", "32b", started="2026-12-01T10:00:00+00:00", peak_gib=100.0)
    new = grpo_file(results, "h200", "32b", started="2026-12-02T10:00:00+00:00", peak_gib=120.0, name="b")
    subset = grpo_file(results, "h200", "32b", started="2026-12-03T10:00:00+00:00", name="c", defined=3)
    other = grpo_file(results, "h200", "0.5b", started="2026-12-01T11:00:00+00:00", name="d")  # another series
    loaded = schema.load_results(results)
    assert [r.path.split("/")[1] for r in regenerate.headline(loaded)] == [other.name, new.name]
    assert len(regenerate.headline(loaded, every_run=True)) == 4  # superseded and --only subsets too
    sizing = regenerate.write_tables(results, tmp_path / "t")[0].read_text()
    assert "2 of 4 result files; 2 superseded or partial (shown with --all)" in sizing
    assert new.name in sizing and old.name not in sizing and subset.name not in sizing
    everything = regenerate.write_tables(results, tmp_path / "all", every_run=True)[0].read_text()
    assert "4 of 4 result files" in everything


def test_tables_from_a_results_directory_that_is_missing_or_empty_fail_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "tables"
    out.mkdir()
    (out / "sizing.md").write_text("committed\n")
    assert main(["tables", "--results", str(tmp_path / "results" / "run"), "--out", str(out)]) == 1
    assert "no such results directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["tables", "--results", str(tmp_path / "empty"), "--out", str(out)]) == 1
    assert "no result file" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["sizing.md"] and (out / "sizing.md").read_text() == "committed\n"


def test_the_committed_tables_and_ledger_are_what_the_committed_results_make(committed_results, tmp_path):
    written = regenerate.write_tables(committed_results, tmp_path, ledger=tmp_path / "claims.md")
    assert tmp_path / "claims.md" in written
    for path in written:
        committed = REPO / "results" / ("claims.md" if path.name == "claims.md" else f"tables/{path.name}")
        assert path.read_text() == committed.read_text(), f"{committed} differs: run `nox -s tables`"


def test_the_committed_comparison_is_what_the_committed_results_make(committed_results, tmp_path):
    written = side_by_side.write_comparison(side_by_side.resolve_sides([], committed_results), tmp_path)
    committed = REPO / "results" / "compare" / "previous-vs-newest"
    assert {p.name for p in written} == {p.name for p in committed.iterdir()}, "run `nox -s compare`"
    made = (tmp_path / "compare.md").read_text()
    assert made == (committed / "compare.md").read_text(), f"{committed} differs: run `nox -s compare`"


@pytest.mark.parametrize(("document", "blocks"), [("README.md", ["steps"]), ("docs/running.md", ["runs"])])
def test_the_documents_excerpts_are_what_the_committed_results_make(committed_results, tmp_path, document, blocks):
    results = schema.load_results(committed_results)
    cited = regenerate.headline(results)
    copy = tmp_path / "document.md"
    copy.write_text((REPO / document).read_text())
    assert (
        regenerate.rewrite_document(copy, regenerate.build(cited, results), regenerate.last_verified(cited)) == blocks
    )
    assert copy.read_text() == (REPO / document).read_text(), f"{document}'s tables differ: run `nox -s tables`"


def test_compare_matches_configurations_by_lever_values_across_versions(tmp_path):
    results = tmp_path / "runs"
    older = grpo_file(results, "h100", "32b", peak_gib=50.0)
    newer = grpo_file(results, "h200", "32b", peak_gib=100.0)
    data = json.loads(newer.read_text())
    record = data["configurations"][0]
    # a newer version: the name lists two more varied levers, and a lever the older file lacks
    record["name"] = "model=lora gradient_checkpointing=True vllm_mode=colocate"
    record["levers"]["vllm_max_model_length"] = 1032
    newer.write_text(json.dumps(data))
    data = json.loads(older.read_text())
    del data["configurations"][0]["levers"]["vllm_max_model_length"]
    older.write_text(json.dumps(data))
    lines = side_by_side.grpo_rows(side_by_side.resolve_sides(["h100", "h200"], results))
    assert lines[0].startswith("GRPO configurations in every side (1;")
    assert "| model=lora | 3.00, 50.00 | 3.00, 100.00 | 1.00x, 2.00x |" in flat("\n".join(lines))


def test_compare_refuses_a_quick_run_beside_a_full_one(tmp_path):
    results = tmp_path / "runs"
    full = grpo_file(results, "h100", "32b")
    quick = grpo_file(results, "h200", "32b", quick=True)
    with pytest.raises(ValueError, match=r"grpo: a --quick run and a full run are not like for like: .*-a-grpo"):
        side_by_side.resolve_sides([str(full), str(quick)], results)


def test_a_bad_result_file_is_named(tmp_path):
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "x-grpo.json").write_text('{"kind": "grpo"}')
    with pytest.raises(ValueError, match=r"h200/x-grpo.json: missing key 'schema_version'"):
        schema.load_results(tmp_path)
    (tmp_path / "h200" / "x-grpo.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"h200/x-grpo.json: not JSON"):
        schema.load_results(tmp_path)


def test_the_model_table_reports_the_error_of_every_configuration_that_ran(tmp_path):
    grpo_file(tmp_path, "h200", "32b", peak_gib=100.0)
    text, medians = regenerate.model_table(schema.load_results(tmp_path))
    assert "model=lora" in text and list(medians) == ["held out"] and f"{medians['held out']:.1%}" in text


def test_compare_puts_matching_configurations_side_by_side_with_ratios_and_draws_figures(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "runs"
    grpo_file(results, "h200", "32b", peak_gib=100.0)
    grpo_file(results, "h100", "32b", peak_gib=50.0)
    sides = side_by_side.resolve_sides(["h100", "h200"], results)
    written = side_by_side.write_comparison(sides, tmp_path / "out")
    text = written[0].read_text()
    assert "| model=lora | 3.00, 50.00 | 3.00, 100.00 | 1.00x, 2.00x |" in flat(text)
    pngs = [p for p in written if p.suffix == ".png"]
    assert {p.name for p in pngs} >= {"memory-breakdown-h100.png", "memory-by-phase-h200.png"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)
    with pytest.raises(ValueError, match="a100: neither a result file nor a hardware class"):
        side_by_side.resolve_sides(["a100", "h200"], results)


def test_estimate_never_fits_an_engine_that_cannot_hold_its_weights(capsys):
    # 14B with LoRA and checkpointing fits an 80 GB card by its training peak, but TRL's default share, given
    # (0.3 x 79.65 GiB = 23.9 GiB), cannot hold the bf16 engine's 27.5 GiB of weights
    levers = "model=lora,gradient_checkpointing=true,use_vllm=true"
    asked = ["estimate", "--shape", "14b", "--hardware", "h100", "--levers", levers, "--levers"]
    assert main([*asked, "vllm_gpu_memory_utilization=0.3"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit (predicted): engine cannot start" in out and "bfloat16 weights (27.5 GiB)" in out
    assert "vllm_gpu_memory_utilization >= 0.36 would start it" in out
    assert main([*asked, "vllm_gpu_memory_utilization=0.4"]) == 0
    assert "engine cannot start" not in capsys.readouterr().out


def test_a_qlora_engine_is_sized_in_4_bit_as_trl_starts_it():
    from benchmarks.model.memory.predict import Workload, engine_need

    shape, work = load_shapes()["70b"], Workload(8, 256, 1024)
    bf16 = engine_need(shape, "bfloat16", Levers(use_vllm=True, model="lora"), work)
    nf4 = engine_need(shape, "bfloat16", Levers(use_vllm=True, model="qlora"), work)
    assert bf16.weights / GIB > 130 and nf4.weights / GIB < 40 and "4-bit" in nf4.precision
    unset = engine_need(shape, "bfloat16", Levers(use_vllm=True), work)
    longer = engine_need(shape, "bfloat16", Levers(use_vllm=True, vllm_max_model_length=131072), work)
    assert longer.kv_cache == unset.kv_cache * 131072 // (256 + 1024)  # KV for the engine's whole context


def test_estimate_prints_the_breakdown_and_whether_it_fits(capsys):
    assert main(["estimate", "--shape", "0.5b", "--hardware", "rtx4090", "--levers", "optim=adamw_8bit"]) == 0
    out = capsys.readouterr().out
    assert "optimizer_state" in out and "\nfits (predicted): peak " in out and " of 23.99 GiB per GPU" in out
    assert main(["estimate", "--shape", "72b", "--hardware", "rtx4090"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["estimate", "--shape", "0.5b", "--hardware", "rtx4090", "--levers", "optimizer=sgd"])
    assert "unknown key optimizer" in capsys.readouterr().err


def test_the_context_table_and_the_model_table_follow_a_context_file(tmp_path):
    probe = schema.Probe(
        completion_tokens=64,
        status="ok",
        fits=True,
        peak_bytes=4 * GIB,
        peak_measure=schema.HOST_RSS,
        predicted_peak_bytes=3 * GIB,
        wall_s=1.0,
    )
    entry = schema.ContenderRun(
        name="trl-1.16",
        role="",
        stack="trl",
        logits_path="trl-tiled",
        status="measured",
        max_completion_tokens=240,
        first_failing_tokens=256,
        predicted_max_completion_tokens=704,
        probes=[probe],
    )
    skipped = schema.ContenderRun(
        name="trl-1.16-liger", role="", stack="trl", logits_path="trl-tiled", status="skipped", reason="needs CUDA"
    )
    baseline = dataclasses.replace(entry, name="trl-1.14.2", max_completion_tokens=80, probes=[])
    unsloth = dataclasses.replace(entry, name="unsloth-2026.10.9", stack="unsloth", probes=[])
    levers = dataclasses.asdict(Levers(model="lora", per_device_train_batch_size=8))
    search = schema.Search(
        shape="0.5b",
        dtype="bfloat16",
        budget_gib=5.0,
        prompt_words=16,
        start_tokens=64,
        max_tokens=8192,
        resolution=0.125,
        granule=16,
        contenders=[],
        levers=levers,
        searched="completion length",
        budget_enforced_by="peak RSS of the worker tree",
        completions_per_step=8,
    )
    record = schema.ContextFile(
        schema_version=schema.SCHEMA_VERSION,
        kind="context",
        started="2026-12-04T00:00:00+00:00",
        complete=True,
        profile={"hardware": "cpu"},
        shape=schema.ShapeRecord(name="0.5b", param_count=1),
        search=search,
        contenders=[baseline, entry, unsloth, skipped],
    )
    data = schema.encode(record)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "x-context.json").write_text(json.dumps(data))
    results = schema.load_results(tmp_path)
    text = regenerate.context_table(results)
    text = flat(text)
    assert "| trl-1.16 | measured | 240 | 256 | 704 |" in text and "skipped: needs CUDA" in text
    assert (
        "| unsloth-2026.10.9 | measured | 240 | 256 | 704 | 3.00x (predicted 1.00x) | 1.00x (predicted 1.00x) |" in text
    )
    assert "reached 3.0x the context of unchunked TRL 1.14.2" in text and "not reproduced" in text
    assert "budget 5 GiB" in text
    assert "| cpu/x-context.json | trl-1.16 | 1 | " in flat("\n".join(regenerate._context_probe_errors(results)))


def test_the_committed_many_ranks_run_shows_per_rank_model_states_falling_as_zero_says(committed_results):
    found = frames.ranks(schema.load_results(committed_results))
    assert not found.empty, "no committed distributed result"
    newest = found[found.file == found.file.max()]
    totals = {(row.configuration, row.rank_number): row.states.total for row in newest.itertuples()}
    alone = totals[("num_processes=1 distributed_type=no", 0)]
    for (name, rank), total in totals.items():
        if "zero" in name:
            assert total < 0.7 * alone, (name, rank)  # 16 B/param alone; 10 B/param of each rank at 2 ranks
    zero3 = newest[newest.configuration.str.contains("zero3")]
    assert (zero3.held_parameter_fraction == 0.5).all() and (zero3.zero_stage == 3).all()


def test_the_model_table_scores_every_run_its_constants_were_not_fitted_on_apart_as_held_out(committed_results):
    from benchmarks.report.validation import FITTED_FILES, validate

    results = schema.load_results(committed_results)
    superseded_fit = "cpu/20261201T175857Z-grpo.json"  # a fitted run with a newer run of its series
    assert superseded_fit in FITTED_FILES and superseded_fit not in {r.path for r in regenerate.headline(results)}
    cited = regenerate.with_fitted_runs(regenerate.headline(results), results)
    found = frames.checks(validate(cited, load_shapes(), profiles.load_hardware()))
    held_out = found[found.held_out]
    grpo_files = {r.path for r in cited if r.kind in ("grpo", "distributed")}
    assert set(found[~found.held_out].file) == set(FITTED_FILES)
    assert set(held_out.file) == grpo_files - set(FITTED_FILES) and held_out.file.str.contains("distributed").any()
    text, medians = regenerate.model_table(cited)
    assert "fitted configurations: " in text and "held out configurations: " in text
    assert medians["fitted"] == float(found[(found.phase == "training") & ~found.held_out].error.abs().median())
