"""The scripts for a lent GPU machine: valid shell, an interpreter for every contender the h200 profile
searches, a clear stop where their wheels were not prepared, a plan within 9 minutes, and each script's
whole flow rehearsed on this CPU, so that a slip never costs GPU minutes."""

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.catalog.profiles import load
from benchmarks.results import schema
from benchmarks.run.machine import preflight, provenance

SCRIPTS = sorted((REPO / "benchmarks" / "device").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_script_is_valid_shell(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0


def test_the_context_script_gives_every_contender_of_the_h200_profile_its_interpreter():
    text = (REPO / "benchmarks" / "device" / "context-h200.sh").read_text()
    made = set(re.findall(r"^interpreter (\S+) ", text, re.M))
    passed = set(re.findall(r'--python "([^=]+)=', text))
    assert made == passed == set(load("h200").context.contenders)


def test_the_context_script_stops_naming_the_missing_preparation(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "benchmarks" / "device", copy / "benchmarks" / "device")
    done = subprocess.run(
        ["bash", str(copy / "benchmarks" / "device" / "context-h200.sh")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no .context-site: run" in done.stdout and "--prepare" in done.stdout


def test_the_h200_script_plans_its_parts_within_nine_minutes():
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device" / "h200.sh"), "--plan"], capture_output=True, text=True
    )
    budgets = dict(re.findall(r"^(\S+)\s+(\d+) s$", done.stdout, re.M))
    planned = int(re.search(r"^planned\s+(\d+) s of 540$", done.stdout, re.M).group(1))
    assert done.returncode == 0 and set(budgets) == {"check", "grpo-3b", "grpo-32b", "decode", "grpo-70b"}
    assert planned == sum(map(int, budgets.values())) <= 540


def rehearse(script, tmp_path):
    """A device script's flow on this CPU (--rehearse: the profiles' tiny shapes), its files under $OUT."""
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device" / script), "--rehearse"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {path.name.split("-", 1)[1]: path for path in (tmp_path / "h200").iterdir()}, done.stdout


def test_the_h200_script_rehearses_its_whole_flow_on_this_cpu(tmp_path):
    pytest.importorskip("trl")
    written, output = rehearse("h200.sh", tmp_path)
    assert "check: done" in output and "grpo-70b: done" in output
    assert len(written) <= 7  # the most the device returns: one more and another is dropped unseen
    check = next(path for name, path in written.items() if name == "check.txt").read_text()
    assert "git:" in check and "device: skipped: no CUDA device" in check
    runs = [schema.read_result(path, path.name) for path in sorted((tmp_path / "h200").glob("*.json"))]
    assert [r.kind for r in runs] == ["grpo", "grpo", "decode", "grpo"] and all(r.complete and r.quick for r in runs)
    statuses = [c.status for r in runs if r.kind == "grpo" for c in r.record.configurations]
    assert statuses == ["ok", "ok", "skipped"]  # the 70B row's QLoRA needs CUDA, and says so
    decode = next(r.record for r in runs if r.kind == "decode")
    assert {p.engine for p in decode.sweep} == {"transformers-graphs"} and all(p.status == "ok" for p in decode.sweep)


def test_the_context_script_rehearses_its_search_on_this_cpu(tmp_path):
    pytest.importorskip("trl")
    written, _ = rehearse("context-h200.sh", tmp_path)
    [path] = [path for name, path in written.items() if name.endswith("context.json")]
    run = schema.read_result(path, path.name).record
    assert run.complete and run.quick and run.search.warmup_probe
    by_name = {c.name: c for c in run.contenders}
    assert list(by_name) == ["trl-1.14.2", "unsloth-2026.10.9"]  # the claim's pair alone, by default
    assert by_name["trl-1.14.2"].status == "measured" and by_name["trl-1.14.2"].warmup_s > 0


def test_the_command_line_and_the_workers_start_without_what_a_gpu_machine_does_not_carry():
    """The GPU image has no jsonschema, fastjsonschema or Playwright, and the scripts carry none: the command
    line (bench, estimate) and every worker must start without them; only the schema reward and the browser
    test need them."""
    absent = ("jsonschema", "fastjsonschema", "playwright")
    code = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in absent)
    code += "from benchmarks import cli\ncli.command_line().parse_args(['bench', '--quick'])\n"
    code += "import benchmarks.run.grpo.worker, benchmarks.run.decode.sweep, benchmarks.run.decode.engines, rewards\n"
    code += "import benchmarks.run.max_context.contender_runs\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_machine_check_lists_every_package_the_harness_imports():
    """What the harness and the reward library import (outside the standard library), by distribution, against
    what the check reports: a package a GPU image lacks is named in its first seconds, not by a failed part."""
    distributions = metadata.packages_distributions()
    imported = set()
    for path in [*(REPO / "benchmarks").rglob("*.py"), *(REPO / "rewards").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            imported |= {name.split(".")[0] for name in names}
    third_party = imported - set(sys.stdlib_module_names) - {"benchmarks", "rewards"}
    wanted = {distributions.get(name, [name])[0].lower() for name in third_party}
    assert wanted <= {name.lower() for name in preflight.PACKAGES}, wanted - set(preflight.PACKAGES)


def test_each_h200_part_s_own_limit_ends_inside_the_script_s_budget_for_it():
    """A configuration cut by its own limit is recorded as `timeout` with the phase it reached; one cut by the
    script's `timeout` keeps nothing of what it had in progress. The parent's imports and set-up come first."""
    script = (REPO / "benchmarks" / "device" / "h200.sh").read_text()
    budgets = {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", script.split("BUDGET_S=", 1)[1].split("\n")[0])}
    chosen = dict(re.findall(r'\[([\w-]+)\]="(\S+) --only grpo"', script))
    assert set(chosen) == {"grpo-3b", "grpo-32b", "grpo-70b"}
    for part, profile in chosen.items():
        assert load(profile).grpo.configuration_timeout_s + PARENT_SETUP_S <= budgets[part], part


PARENT_SETUP_S = 20  # the parent's imports, calibration and the shape's model directory before the worker starts


def test_a_check_that_cannot_import_the_trainer_skips_every_grpo_part_and_still_decodes(tmp_path):
    broken = tmp_path / "site" / "trl"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('trl: a wheel that did not travel')\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": str(tmp_path / "site")}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env["H200_PARTS"] = "check grpo-3b decode"
    env["H200_BUDGETS"] = "decode=6"  # it starts; its measurement is the whole-flow rehearsal's
    script = str(REPO / "benchmarks" / "device" / "h200.sh")
    done = subprocess.run(["bash", script, "--rehearse"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "the parts that need it are skipped" in done.stdout, done.stdout[-2000:]
    assert "== grpo-3b: skipped: the trainer does not import here" in done.stdout
    assert done.stdout.index("== grpo-3b: skipped") < done.stdout.index("== decode (budget 6 s) ==")  # after it
    assert "decode: cut at its 6 s budget" in done.stdout  # ran, past the check's gate
    check = next((tmp_path / "out" / "h200").glob("*-check.txt")).read_text()
    assert "trainer: failed" in check and "a wheel that did not travel" in check and "stop: trainer failed" in check


@pytest.mark.parametrize("name, memory, status", [("NVIDIA H200", 140.4, 0), ("NVIDIA H100 80GB HBM3", 79.65, 4)])
def test_the_check_refuses_a_machine_of_another_kind_before_anything_else(name, memory, status, monkeypatch, tmp_path):
    from test_devices import FakeNVML, gpu

    from benchmarks.run.machine import nvml_gpus

    monkeypatch.setattr(nvml_gpus, "load_nvml", lambda: FakeNVML(gpu(name, memory)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(preflight, "findings", lambda: iter([("trainer", "GRPOTrainer")]))  # the rest: elsewhere
    monkeypatch.setattr(sys, "argv", ["preflight", str(tmp_path / "check.txt"), "--kind", "h200"])
    assert preflight.main() == status
    lines = (tmp_path / "check.txt").read_text().splitlines()
    assert lines[0].startswith(f"kind: {'failed: ' if status else ''}1 x {name}")
    if status:  # an H100 lent for an H200 script: nothing else checked, nothing is filed as an H200's
        assert "this script needs class h200 (device kind nvidia-h200)" in lines[0] and len(lines) == 1
    else:
        assert lines[1] == "trainer: GRPOTrainer"


def travelled(tmp_path: Path, changed: str | None = None) -> Path:
    """The tracked tree as the device tool copies it (no .git), with a commit record written from it; then
    ``changed`` edited, as a commit made after the record would leave it."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    copy = tmp_path / "tree"
    for name in listed.splitlines():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    blobs = {name: provenance.blob_hash(copy / name) for name in listed.splitlines()}
    record = {"id": "0123456789abcdef0123456789abcdef01234567", "written": "2026-12-02T00:00:00+00:00", "blobs": blobs}
    (copy / provenance.PROVENANCE.name).write_text(json.dumps(record))
    if changed:
        (copy / changed).write_text((copy / changed).read_text() + "\n# changed after the record\n")
    return copy


@pytest.mark.parametrize("changed", [None, "profiles/h200.toml"])
def test_the_h200_run_starts_only_on_the_tree_its_commit_record_names(tmp_path, changed):
    copy = travelled(tmp_path, changed)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(copy / "benchmarks/device/h200.sh")], capture_output=True, text=True, env=env)
    if changed:
        assert done.returncode == 3 and "not the commit its record names" in done.stdout
        assert "1 tracked file(s) differ" in done.stdout
    else:  # past the commit's check; then the wheels it carries, not prepared in this copy
        assert "commit: 0123456789abcdef" in done.stdout and "not the commit" not in done.stdout


def test_a_grpo_part_forced_past_its_budget_leaves_a_timeout_record_naming_its_phase(tmp_path):
    pytest.importorskip("trl")
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # the part keeps a 60 s budget, but its configurations must end 1 s after it starts: no row can, however fast
    env |= {"H200_BUDGETS": "grpo-3b=60", "H200_DEADLINE_MARGIN_S": "59", "H200_PARTS": "grpo-3b"}
    script = str(REPO / "benchmarks" / "device" / "h200.sh")
    done = subprocess.run(["bash", script, "--rehearse"], capture_output=True, text=True, env=env, timeout=900)
    assert "grpo-3b: done" in done.stdout, done.stdout[-3000:]  # ended by itself, inside the script's budget
    first = schema.read_result(min((tmp_path / "h200").glob("*-grpo.json")), "grpo-3b").record
    [cut] = first.configurations
    assert first.complete and cut.status == "timeout" and cut.phase, (cut.status, cut.reason)


def test_the_check_names_a_carried_wheel_s_requirement_the_image_does_not_meet():
    """The carried wheels install without their dependencies: an image's older pyarrow is named in the check."""
    installed = {"datasets": "5.2.0", "pyarrow": "17.0.0", "dill": "0.4.1"}
    requires = {"datasets": ["pyarrow>=21.0.0", "dill<0.4.2,>=0.3.0", "fsspec>=2023.1.0", "pytest; extra == 'tests'"]}

    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    unmet = preflight.unmet_requirements(("datasets", "trl"), version, lambda name: requires.get(name) or version(name))
    assert unmet == ["datasets needs pyarrow>=21.0.0: has 17.0.0", "datasets needs fsspec>=2023.1.0: not installed"]
    assert preflight.requirements_line(unmet).startswith("failed: datasets needs pyarrow>=21.0.0: has 17.0.0")
    assert preflight.requirements_line([]).startswith("met (")
