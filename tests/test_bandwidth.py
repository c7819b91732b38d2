"""The bandwidth probe, and the bytes a decode step moves."""

import json

import pytest

from benchmarks import REPO
from benchmarks.catalog.profiles import load_shapes
from benchmarks.model.memory.decode_bytes import decode_step_bytes, experts_read, kv_bytes_per_token, rollout_seconds
from benchmarks.run.decode import engines
from benchmarks.run.machine.bandwidth_probe import ceiling, probe

REPO_RUNS = REPO / "results" / "runs"


def test_the_probe_reports_median_and_spread_per_kernel_with_bytes_counted():
    torch = pytest.importorskip("torch")
    del torch
    result = probe(array_bytes=64 << 20, repeats=3)
    for kernel, arrays in (("copy", 2), ("read", 1), ("triad", 3)):
        rates = result[kernel]
        assert 0 < rates["min_gb_s"] <= rates["median_gb_s"] <= rates["max_gb_s"]
        assert rates["bytes_per_pass"] == arrays * (64 << 20)  # every byte read and written, once
    assert ceiling(result)["median_gb_s"] == max(result[k]["median_gb_s"] for k in ("copy", "read", "triad"))


def test_a_decode_step_streams_every_weight_and_the_whole_cache():
    shape = load_shapes()["0.5b"]
    step = decode_step_bytes(shape, dtype_bytes=4, batch=8, context=1000)
    assert step.weights == shape.param_count() * 4  # tied: the table is the LM head, read in full
    assert kv_bytes_per_token(shape, 4) == 2 * 24 * 2 * 64 * 4  # K and V, per layer, per KV head
    assert step.kv_read == 8 * 1000 * 24576 and step.kv_write == 8 * 24576
    assert step.total == step.weights + step.kv_read + step.kv_write


def test_an_untied_input_embedding_is_looked_up_not_streamed():
    shape = load_shapes()["7b"]
    step = decode_step_bytes(shape, dtype_bytes=2, batch=1, context=0)
    assert step.weights == (shape.param_count() - shape.vocab_size * shape.hidden_size) * 2


def test_rollout_time_sums_every_step_at_its_own_cache_length():
    shape = load_shapes()["3b"]
    by_step = sum(decode_step_bytes(shape, 2, 16, 128 + s).total for s in range(300))
    assert rollout_seconds(shape, 2, 16, 128, 300, gb_per_s=180) == pytest.approx(by_step / 180e9)
    # bandwidth-bound: twice the bandwidth, half the time
    assert rollout_seconds(shape, 2, 16, 128, 300, 360) == pytest.approx(
        rollout_seconds(shape, 2, 16, 128, 300, 180) / 2
    )


def test_projections_cover_every_class_with_spark_at_both_ends_of_its_budget():
    from benchmarks.catalog import profiles
    from benchmarks.model.memory.decode_bytes import projections

    profile = profiles.load("cpu")
    rows = projections(profile, ceiling_gb_s=20.0)
    spark = {(r["shape"], r["basis"]) for r in rows if r["hardware"] == "spark"}
    for shape in profile.decode.projection_shapes:
        assert {(shape, "sustained budget 180"), (shape, "sustained budget 192"), (shape, "spec")} <= spark
    measured = [r for r in rows if r["basis"].startswith("measured")]
    assert measured and {r["hardware"] for r in measured} == {"cpu"} and all(r["gb_per_s"] == 20.0 for r in measured)
    assert all(r["predicted"] for r in rows)  # projections, never measurements
    at_180 = {r["shape"]: r["rollout_s"] for r in rows if r["hardware"] == "spark" and r["basis"].endswith("180")}
    assert at_180["0.5b"] < at_180["7b"] < at_180["72b"]


def test_weight_bound_decode_never_beats_the_measured_ceiling(capsys):
    """Batch 1, short context: nearly all bytes are weights. Achieved GB/s above the probe's
    best would mean the byte count is wrong (a weight counted twice, a wrong dtype size)."""
    import dataclasses
    import json

    pytest.importorskip("transformers")
    from benchmarks.run.model_dirs import materialise

    shape = load_shapes()["0.5b"]  # 1.98 GB of fp32 weights: far past this machine's 300 MiB L3
    job = {
        "engine": "transformers",
        "model_dir": str(materialise(shape, "float32")),
        "shape": dataclasses.asdict(shape),
        "dtype": "float32",
        "points": [[1, 16]],
        "new_tokens": 4,
        "repeats": 2,
    }
    best = ceiling(probe(array_bytes=1 << 30, repeats=5))
    engines.measure(job, shape, engines.transformers_engine(job))
    row = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert row["bytes_per_step"] == pytest.approx(shape.param_count() * 4, rel=0.01)  # weight-dominated
    assert 0 < row["achieved_gb_s"] <= best["max_gb_s"]  # the ceiling's median plus its spread


def test_the_decode_report_follows_its_result_file(tmp_path):
    pytest.importorskip("matplotlib")
    import json

    from benchmarks.catalog import profiles
    from benchmarks.model.memory.decode_bytes import projections
    from benchmarks.report.markdown.figures import write_decode_report
    from benchmarks.results import schema

    rate = {"median_gb_s": 20.0, "min_gb_s": 19.0, "max_gb_s": 21.0, "bytes_per_pass": 1}
    row = schema.DecodePoint(
        engine="vllm",
        batch=1,
        context=128,
        status="ok",
        ttft_s=0.5,
        decode_tokens_per_s=11.0,
        achieved_gb_s=18.0,
        efficiency_vs_ceiling=0.9,
    )
    skipped = schema.DecodePoint(engine="vllm", batch=8, context=4096, status="skipped", reason="too slow here")
    profile = profiles.load("cpu")
    record = schema.DecodeFile(
        schema_version=schema.SCHEMA_VERSION,
        kind="decode",
        started="now",
        complete=True,
        machine=schema.Machine(cpu="a CPU", cores=2),
        commit=schema.Commit(id="abcdef1234"),
        profile=schema.decode(schema.ProfileRecord, profile.as_dict(), "profile"),
        ceiling=schema.Ceiling(
            device="cpu",
            array_bytes=1,
            repeats=1,
            **{kernel: schema.KernelRate(**rate) for kernel in ("copy", "read", "triad")},
        ),
        device_ceiling=schema.BestKernel(kernel="triad", **rate),
        sweep=[row, skipped],
        projection_rollout=schema.RolloutShape(
            sequences=64, prompt_tokens=256, completion_tokens=1024, dtype_bytes=2, what="decode only"
        ),
        projections=[schema.Projection(**p) for p in projections(profile, 20.0)],
    )
    result = schema.encode(record)
    path = tmp_path / "run-decode.json"
    path.write_text(json.dumps(result))
    table, image = write_decode_report(path)
    text = table.read_text()
    text = "\n".join(" ".join(line.split()) for line in text.splitlines())  # pandas pads the cells
    assert "| vllm | 1 | 128 | 0.50 | 11.0 | 18.00 | 90% |" in text and "skipped: too slow here" in text
    assert "sustained budget 180" in text and "sustained budget 192" in text and "| 72b |" in text
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_that_is_not_a_decode_result_is_named_in_the_error(tmp_path):
    from benchmarks.report.markdown.figures import write_decode_report

    path = tmp_path / "old-decode.json"
    path.write_text('{"kind": "decode", "ceiling": {}}')
    with pytest.raises(ValueError, match=r"old-decode.json: missing key 'schema_version'"):
        write_decode_report(path)
    path.write_text('{"kind": "decode", "schema_version": 2, "started": "x", "profile": {"hardware": "cpu"}, "ceil')
    with pytest.raises(ValueError, match=r"old-decode.json: not JSON"):  # truncated
        write_decode_report(path)


def test_a_moe_decode_step_reads_its_attention_and_only_the_experts_its_batch_routes_to():
    shape = load_shapes()["qwen3-30b-a3b"]
    assert round(shape.param_count() / 1e9, 1) == 30.5 and round(shape.active_param_count() / 1e9, 1) == 3.4
    one = decode_step_bytes(shape, dtype_bytes=2, batch=1, context=0)
    input_table = shape.vocab_size * shape.hidden_size
    assert one.weights == pytest.approx((shape.active_param_count() - input_table) * 2, rel=1e-6)  # 8 experts
    assert experts_read(shape, 1) == pytest.approx(8) and 120 < experts_read(shape, 64) < 128
    many = decode_step_bytes(shape, dtype_bytes=2, batch=64, context=0)
    assert one.weights < many.weights < (shape.param_count() - input_table) * 2  # never more than resident
    dense = load_shapes()["32b"]
    assert experts_read(shape, 64) > 100 and decode_step_bytes(dense, 2, 1, 0).weights > many.weights


def test_an_fp8_kv_cache_halves_the_cache_bytes_and_leaves_the_weights():
    shape = load_shapes()["8b"]
    bf16, fp8_kv = decode_step_bytes(shape, 2, 8, 4096), decode_step_bytes(shape, 2, 8, 4096, kv_dtype_bytes=1)
    assert fp8_kv.weights == bf16.weights and fp8_kv.kv_read * 2 == bf16.kv_read
    assert rollout_seconds(shape, 2, 8, 256, 512, 180, kv_dtype_bytes=1) < rollout_seconds(shape, 2, 8, 256, 512, 180)


def test_the_graphs_engine_makes_one_static_cache_per_point_and_resets_it_before_each_call(monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    from benchmarks.run.model_dirs import materialise

    made, resets = [], []

    class CountedCache(transformers.StaticCache):
        def __init__(self, *args, **kwargs):
            made.append(kwargs["max_cache_len"])
            super().__init__(*args, **kwargs)

        def reset(self):
            resets.append(self)
            super().reset()

    monkeypatch.setattr(transformers, "StaticCache", CountedCache)
    shape = load_shapes()["tiny"]
    job = {"engine": "transformers-graphs", "dtype": "float32", "model_dir": str(materialise(shape)), "new_tokens": 4}
    job |= {"repeats": 2, "points": [(1, 16), (2, 16)]}
    engines.measure(job, shape, engines.transformers_engine(job))
    assert made == [16 + 4 + 1, 16 + 4 + 1]  # one a point, at its longest call, never one a call
    calls = 1 + 2 * 2  # the warm-up, then a one-token call and a full one per repeat
    assert len(resets) == 2 * calls and len(set(map(id, resets))) == 2
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [len(row["generate_s_each"]) for row in rows] == [2, 2] and all(len(r["ttft_s_each"]) == 2 for r in rows)


@pytest.mark.parametrize("hardware", ["h200", "spark", "cpu"])
def test_the_decode_figure_draws_its_own_class_s_spec_and_band_only(hardware, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from benchmarks import REPO
    from benchmarks.report.markdown.figures import decode_figure
    from benchmarks.results import schema

    run = schema.read_result(REPO / "results/runs/cpu/20261201T175648Z-decode.json", "decode").record
    run.profile.hardware = hardware
    drawn = []
    for name in ("axhline", "axhspan"):
        original = getattr(Axes, name)
        monkeypatch.setattr(
            Axes, name, lambda self, *a, _o=original, **k: drawn.append(k.get("label", "")) or _o(self, *a, **k)
        )
    decode_figure(run, tmp_path / "decode.png")
    spec = [label for label in drawn if "spec" in label or "budget" in label]
    expected = {"h200": ["NVIDIA H200: spec 4800 GB/s"], "cpu": []}
    expected["spark"] = [
        "NVIDIA DGX Spark (GB10, unified memory): sustained budget 180-192 GB/s",
        "NVIDIA DGX Spark (GB10, unified memory): spec 273 GB/s",
    ]
    assert spec == expected[hardware]


def test_a_graphs_row_never_compiled_or_run_without_graphs_says_it_ran_eager(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from benchmarks.results import schema

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU: the row claims CUDA graphs

    def generate(prompts, tokens):
        pass

    job = {"engine": "transformers-graphs", "dtype": "float32", "new_tokens": 2, "repeats": 1, "points": [(1, 8)]}
    rows = {}
    for compiled, skips in ((False, 0), (True, 0), (True, 2)):
        generate.compiled = lambda compiled=compiled: compiled
        counted = iter((5, 5 + skips))  # inductor's cudagraph_skips counter, before and after the warm-up
        generate.graph_skips = lambda counted=counted: next(counted)
        engines.measure(job, load_shapes()["tiny"], generate)
        rows[compiled, skips] = json.loads(capsys.readouterr().out.splitlines()[-1])["execution"]
    assert rows[True, 0] == engines.execution("transformers-graphs", True) and "CUDA graphs" in rows[True, 0]
    assert rows[False, 0] == engines.NOT_COMPILED  # checked, not assumed
    assert rows[True, 2] == engines.GRAPHS_SKIPPED  # compiled, yet run without graphs: observed
    for eager in (rows[False, 0], rows[True, 2]):
        assert schema.DecodePoint(engine="transformers-graphs", status="ok", execution=eager).launch_bound


def impossible_rows(shape):
    """As the H200 rehearsal's batch-1 row: its 9-token calls (0.112 s) faster than its 1-token calls (0.184 s);
    and a row whose decode moved more bytes a second than the H200's datasheet allows."""
    from benchmarks.run.decode.engines import step_bytes

    base = {"engine": "transformers", "context": 128, "new_tokens": 8, "repeats": 3, "execution": "eager"}
    rows = []
    for batch, first, full in ((1, 0.184, 0.112), (64, 0.010, 0.0105)):
        decode_s = max(full - first, 1e-9)
        per_step = step_bytes(shape, "bfloat16", batch, 128, 8)
        rows.append({
            **base, "batch": batch, "ttft_s": first, "decode_s": decode_s, "ttft_s_each": [first] * 3,
            "generate_s_each": [full] * 3, "decode_tokens_per_s": batch * 8 / decode_s, "bytes_per_step": per_step,
            "achieved_gb_s": per_step * 8 / decode_s / 1e9,
        })  # fmt: skip
    return rows


def test_a_decode_row_beyond_physics_is_invalid_in_its_file_and_absent_from_every_table(tmp_path):
    from benchmarks.catalog.profiles import load_hardware
    from benchmarks.report.markdown import claims, regenerate
    from benchmarks.results import schema
    from benchmarks.run.decode import sweep

    shape = load_shapes()["8b"]
    rate = schema.BestKernel(kernel="copy", median_gb_s=4000.0, min_gb_s=3900.0, max_gb_s=4100.0, bytes_per_pass=1)
    made = [sweep._row(row, rate, load_hardware()["h200"], shape) for row in impossible_rows(shape)]
    assert [row.status for row in made] == ["invalid", "invalid"]
    assert made[0].reason.startswith("decode time not positive: the 9-token calls' median (0.112 s)")
    assert "above the datasheet's 4800 GB/s: beyond physics" in made[1].reason
    runs = tmp_path / "runs"
    source = REPO_RUNS / "cpu/20261201T175648Z-decode.json"
    data = json.loads(source.read_text())
    data["profile"]["hardware"] = "h200"
    data["sweep"] += [schema.encode(row) for row in made]
    (runs / "h200").mkdir(parents=True)
    (runs / "h200" / source.name).write_text(json.dumps(data))
    record = schema.read_result(runs / "h200" / source.name, "decode").record
    assert [p.status for p in record.sweep][-2:] == ["invalid", "invalid"]  # kept in the file, with the reason
    written = regenerate.write_tables(runs, tmp_path / "tables", ledger=tmp_path / "claims.md")
    shown = "".join(path.read_text() for path in written if path.suffix == ".md")
    valid = [p for p in record.sweep if p.status == "ok"]
    assert all(f"{p.achieved_gb_s:.1f}" in shown for p in valid)  # the file's valid rows are tabled
    assert f"{made[1].decode_tokens_per_s:.1f}" not in shown
    assert f"{made[1].achieved_gb_s:.1f}" not in shown and f"{made[1].achieved_gb_s:.0f}" not in shown
    assert all(f"{row.achieved_gb_s:.0f} GB/s" not in claim.measured for claim in claims.ledger(
        regenerate.headline(schema.load_results(runs))) for row in made)  # fmt: skip


def test_an_engine_pinned_to_its_gpu_and_stuck_past_its_limit_is_stopped_with_an_error_row(monkeypatch, tmp_path):
    import subprocess
    import sys
    import time

    from benchmarks.catalog.profiles import load_hardware
    from benchmarks.run.decode import sweep

    child = tmp_path / "child.pid"  # as vLLM's engine core: a process of the worker's own
    stuck = (
        "import os, subprocess, time; p = subprocess.Popen(['sleep', '60']); "
        f"open({str(child)!r}, 'w').write(str(p.pid) + ' ' + os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(60)"
    )
    monkeypatch.setattr(sweep, "WORKER", [sys.executable, "-c", stuck])
    started = time.monotonic()
    pinned = {"CUDA_VISIBLE_DEVICES": "GPU-00000001-fake"}  # the GPU the part's file names
    hardware, shape = load_hardware()["cpu"], load_shapes()["tiny"]
    rows = list(sweep._engine_rows({"engine": "vllm"}, None, hardware, shape, 2.0, pinned))
    assert time.monotonic() - started < 20
    assert [(r.status, r.reason) for r in rows] == [
        ("error", "stopped at the engine's limit of 2 s (engine_limit_s) after 0 point(s)")
    ]
    pid, seen = child.read_text().split()
    assert seen == "GPU-00000001-fake"  # the engine ran pinned to the part's GPU
    time.sleep(0.2)
    state = subprocess.run(["ps", "-o", "stat=", "-p", pid], capture_output=True, text=True).stdout.strip()
    assert state in ("", "Z"), state  # gone (or a zombie awaiting its reaper), not sleeping on


def test_a_grpo_step_faster_than_its_gpus_peak_is_invalid_and_a_cpu_step_is_never_judged_by_a_peak():
    from benchmarks.results import schema
    from benchmarks.run.ceilings import step_fault

    shape = load_shapes()["7b"]  # 7.6B parameters: 4 x 7.6e9 FLOPs a completion token at least
    summary = schema.Summary(
        measured_steps=1, step_s_median=0.01, step_s_min=0.01, step_s_max=0.01,
        completion_tokens_per_s_median=50_000.0, phase_s_median={}, peak_bytes=1, peak_bytes_by_phase={},
        peak_measure="", peak_rss_bytes=1, peak_rss_bytes_by_phase={}, peak_repeat_spread=0.0,
        optimizer_state_bytes=0, grad_bytes=0, trainable_params=0, reference_model_bytes=0,
    )  # fmt: skip
    fault = step_fault(summary, shape, 989.0, 1)  # ~1,500 TFLOP/s of least arithmetic on one H100
    assert fault and fault.endswith("above 1 x the device's peak 989: beyond physics")
    assert step_fault(summary, shape, 989.0, 2) is None  # two GPUs' peaks allow it
    assert step_fault(summary, shape, None, 1) is None  # a CPU: no datasheet peak to hold it to
