"""A run that ends early: stopped by SIGTERM it exits within seconds, its file marked and nothing left
running; a GRPO file cut in a configuration keeps the configurations it finished, and the tables cite them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.catalog.profiles import load, load_hardware, load_shapes
from benchmarks.report import frames, validation
from benchmarks.report.markdown import regenerate
from benchmarks.results import schema
from benchmarks.run.grpo import outcome, timed_steps

psutil = pytest.importorskip("psutil")


def test_sigterm_ends_a_running_bench_within_seconds_with_its_file_marked(tmp_path):
    command = [sys.executable, "-m", "benchmarks", "bench", "--profile", "cpu", "--quick", "--only", "grpo"]
    bench = subprocess.Popen(
        [*command, "--out", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = ""
    for line in bench.stdout:  # until the first configuration's worker is running
        seen += line
        if line.startswith("[1/"):
            break
    time.sleep(3)
    running = psutil.Process(bench.pid).children(recursive=True)
    assert running, f"no worker under the bench after it started its first configuration:\n{seen}"
    started = time.monotonic()
    bench.send_signal(signal.SIGTERM)
    rest = bench.communicate(timeout=30)[0]
    took = time.monotonic() - started
    assert took < 10, f"took {took:.1f} s to end after SIGTERM"
    assert bench.returncode == 128 + signal.SIGTERM and "Traceback" not in rest
    assert "signal SIGTERM: kept" in rest and "complete: false" in rest
    [path] = (tmp_path / "cpu").glob("*-grpo.json")
    run = schema.read_result(path, path.name).record
    assert not run.complete and "SIGTERM" in run.ended_early
    assert not [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def finished_configuration(job, budget, log, timeout_s=None):
    """A configuration as a worker on this CPU would record it: one measured step with its phase peaks."""
    step = schema.Step(
        step=0,
        warmup=False,
        wall_s=2.0,
        phase_s={"rollout": 1.0, "forward_backward": 1.0},
        completion_tokens=64,
        completion_tokens_per_s=32.0,
        peak_rss_bytes={"rollout": 900 << 20, "forward_backward": 1200 << 20},
    )
    return schema.WorkerRecord(status="ok", steps=[step], summary=outcome.summarise([step], schema.HOST_RSS))


def test_a_grpo_file_cut_in_its_third_configuration_keeps_two_citable_ones(monkeypatch, tmp_path):
    calls = []

    def cut_in_the_third(job, budget, log, timeout_s=None):
        calls.append(job)
        if len(calls) == 3:
            raise schema.Stopped("signal SIGTERM")
        return finished_configuration(job, budget, log)

    monkeypatch.setattr(timed_steps, "materialise_recorded", lambda name, dtype, weights, built: tmp_path)
    monkeypatch.setattr(timed_steps, "run_configuration", cut_in_the_third)
    with pytest.raises(schema.Stopped):
        timed_steps.run_grpo(load("cpu"), False, tmp_path / "runs")

    results = schema.load_results(tmp_path / "runs")
    [result] = results
    assert not result.complete and len(result.record.configurations) == 2
    cited = regenerate.headline(results)
    assert cited == [result], "a cut GRPO run is cited for what it finished"
    rows = frames.configurations(cited)
    assert list(rows.status) == ["ok", "ok"]
    assert {c.configuration for c in validation.validate(cited, load_shapes(), load_hardware())} == set(rows.name)
    assert "cited for what they finished (configurations, decode points)" in regenerate._counted(cited, results)


def test_a_run_that_ended_early_with_nothing_finished_is_never_cited(grpo_run, tmp_path):
    path = Path(tmp_path / "cpu" / "20261201T000000Z-grpo.json")
    schema.write(path, grpo_run(complete=False, ended_early="signal SIGTERM"))
    results = schema.load_results(tmp_path)
    assert regenerate.headline(results) == [] and regenerate.headline(results, every_run=True) == []


def test_a_result_file_of_a_newer_schema_is_refused_naming_it(grpo_run, tmp_path):
    path = tmp_path / "cpu" / "x-grpo.json"
    record = grpo_run()
    record.schema_version = schema.SCHEMA_VERSION + 1
    schema.write(path, record)
    with pytest.raises(schema.SchemaError, match=rf"x-grpo.json: schema_version {schema.SCHEMA_VERSION + 1} is newer"):
        schema.load_results(tmp_path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-tokens", "-5"], "argument --prompt-tokens: must be positive, got -5"),
        (["--prompt-tokens", "0"], "argument --prompt-tokens: must be positive, got 0"),
        (["--levers", "max_completion_length=0"], "max_completion_length: 0 is not positive"),
    ],
)
def test_estimate_refuses_lengths_that_are_not_positive(argv, message):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "estimate", "--shape", "tiny", "--hardware", "h200", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 2 and message in done.stderr
