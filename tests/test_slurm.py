"""The Slurm path against a real one-machine Slurm: Debian's slurmctld and slurmd with munge, started
here in a temporary directory and stopped after (docs/many-gpus.md). Needs root and the packages
(`apt-get install slurmctld slurmd slurm-client munge`, ~15 s), which `nox -s tests` installs where it can;
skipped with the reason without them."""

import os
import shutil
import socket
import subprocess
import time

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")
pytest.importorskip("submitit")

from benchmarks.catalog.profiles import Levers, load_shapes  # noqa: E402
from benchmarks.run.grpo import multinode  # noqa: E402
from benchmarks.run.grpo.job import Job  # noqa: E402
from benchmarks.run.model_dirs import materialise  # noqa: E402

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "sbatch")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def slurm(tmp_path_factory, monkeypatch):
    """A one-node Slurm cluster of this machine; yields its SLURM_CONF."""
    missing = [name for name in DAEMONS if not shutil.which(name)]
    if missing:
        pytest.skip(
            f"no Slurm here ({', '.join(missing)} not found): apt-get install slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        pytest.skip("slurmd and munged run as root in this fixture; not root here")
    root = tmp_path_factory.mktemp("slurm")
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    subprocess.run(["mungekey", "--create", f"--keyfile={munge / 'munge.key'}"], check=True, capture_output=True)
    host = socket.gethostname().split(".")[0]
    megabytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 2048
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=grpobench
SlurmctldHost={host}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge / "munge.sock"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={os.cpu_count()} RealMemory={megabytes} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    munged = [
        "munged", "--foreground", "--force", f"--key-file={munge / 'munge.key'}", f"--socket={munge / 'munge.sock'}",
        f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}",
    ]  # fmt: skip
    started = [subprocess.Popen(munged, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    time.sleep(1)
    for daemon in ("slurmctld", "slurmd"):
        command = [daemon, "-D", "-f", str(conf)]
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 30
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                pytest.fail(f"Slurm did not come up: {(root / 'slurmctld.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield conf
    finally:
        for process in reversed(started):
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def test_a_profile_s_configurations_go_to_slurm_as_one_job_array_per_resource_shape(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_EXECUTOR", "slurm")
    monkeypatch.setenv("GRPO_BENCH_SLURM_FOLDER", str(tmp_path / "shared"))
    model_dir = materialise(load_shapes()["tiny"], "float32", root=tmp_path / "models")

    def job(kind: str) -> Job:
        levers = Levers(
            num_generations=4, per_device_train_batch_size=4, max_completion_length=8, num_processes=2,
            distributed_type=kind,
        )  # fmt: skip
        return Job(
            levers=levers, model_dir=str(model_dir), dtype="float32", warmup_steps=0, measured_steps=1, prompt_words=8
        )

    logs = tmp_path / "logs"
    logs.mkdir()
    submitted = multinode.submit_to_slurm({1: job("zero2"), 2: job("zero3")}, None, logs, 300, gpus=False)
    arrays = {str(submitted[n].job_id).split("_")[0] for n in (1, 2)}
    assert len(arrays) == 1 and all("_" in str(submitted[n].job_id) for n in (1, 2))  # one array, two elements
    for number, stage in ((1, 2), (2, 3)):
        record = multinode.slurm_record(submitted[number])
        assert record.status == "ok", record.reason
        assert record.distribution.world_size == 2 and record.distribution.zero_stage == stage
        assert [(rank.rank, rank.machine_rank) for rank in record.ranks] == [(0, 0), (1, 0)]
    assert list((tmp_path / "shared").glob("*/*_submission.sh"))  # sbatch's script, in the shared folder
