"""Many machines through an existing scheduler: submitit runs one task per machine of a configuration,
as one Slurm job of that many nodes (a task per node, the GPUs each machine's ranks need), or with its
local executor as processes of this host, each a "machine" over loopback. Each task runs the
configuration's launcher for its machine (``accelerate launch --num_machines --machine_rank
--main_process_ip``, c10d rendezvous) and returns that machine's record; in server mode one more
task is the vLLM server's machine (TRL's multi-node recipe: ``trl vllm-serve`` on a node of its own).

``GRPO_BENCH_EXECUTOR=slurm`` submits to Slurm (``sbatch`` where this runs: its ``SLURM_CONF``, its
partition from ``GRPO_BENCH_SLURM_PARTITION``): then every configuration of a profile is a job, those
needing the same machines and GPUs one job array; unset, the local executor runs the machines here,
one configuration after another.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXECUTORS = ("local", "slurm")


def kind() -> str:
    """The executor asked for (``GRPO_BENCH_EXECUTOR``): local (default) or slurm."""
    chosen = os.environ.get("GRPO_BENCH_EXECUTOR", "local")
    if chosen not in EXECUTORS:
        raise ValueError(f"GRPO_BENCH_EXECUTOR={chosen!r} is not one of {', '.join(EXECUTORS)}")
    return chosen


def folder(local: Path) -> Path:
    """Where a configuration's submitit pickles and machine logs go: a folder every node of a Slurm job
    sees (``GRPO_BENCH_SLURM_FOLDER``, default ~/.cache/grpo-bench/submitit: home is shared on the
    clusters this targets), else ``local``."""
    if kind() != "slurm":
        return local
    shared = Path(os.environ.get("GRPO_BENCH_SLURM_FOLDER", Path.home() / ".cache" / "grpo-bench" / "submitit"))
    return shared / f"{local.parent.name}-{local.name}"


def _executor(machines: int, gpus_per_machine: int, timeout_s: float, where: Path) -> Any:
    import submitit  # the distributed extra's: a run on one machine never needs it

    minutes = max(1, int(timeout_s // 60) + 5)  # the configuration's own limit stops it first
    if kind() == "slurm":
        executor = submitit.SlurmExecutor(folder=where)
        partition = os.environ.get("GRPO_BENCH_SLURM_PARTITION")
        executor.update_parameters(
            nodes=machines,
            ntasks_per_node=1,
            time=minutes,
            exclusive=True,  # no other job's memory on a measured machine
            **({"gpus_per_node": gpus_per_machine} if gpus_per_machine else {}),
            **({"partition": partition} if partition else {}),
        )
        return executor
    executor = submitit.LocalExecutor(folder=where)
    executor.update_parameters(tasks_per_node=machines, timeout_min=minutes)
    return executor


def run_tasks(task: Callable[[], Any], machines: int, gpus_per_machine: int, timeout_s: float, where: Path) -> list:
    """``task`` once per machine, all at once (they rendezvous), as one job; their results in machine
    order. A task that failed raises submitit's error, naming the machine and its log."""
    return _executor(machines, gpus_per_machine, timeout_s, where).submit(task).results()


def submit_array(
    tasks: list[Callable[[], Any]], machines: int, gpus_per_machine: int, timeout_s: float, where: Path
) -> list:
    """Slurm: ``tasks`` (configurations needing the same machines and GPUs) as one job array, each
    element a job of ``machines`` nodes running a task per node; its submitit jobs, in order."""
    return _executor(machines, gpus_per_machine, timeout_s, where).submit_array(tasks)


def place_here() -> tuple[int, list[str]]:
    """(this task's machine rank, every machine's address in rank order), from submitit's view; the
    local executor's machines are this host, over loopback."""
    import submitit

    environment = submitit.JobEnvironment()
    if environment.cluster == "local":
        return environment.global_rank, ["127.0.0.1"] * environment.num_tasks
    return environment.global_rank, list(environment.hostnames)
