"""Many machines through an existing scheduler: submitit runs one task per machine of a configuration,
as one Slurm job of that many nodes (a task per node, the GPUs each machine's ranks need), or with its
local executor as processes of this host, each a "machine" over loopback. Each task runs the
configuration's launcher for its machine (``accelerate launch --num_machines --machine_rank
--main_process_ip``, c10d rendezvous) and returns that machine's record; in server mode one more
task is the vLLM server's machine (TRL's multi-node recipe: ``trl vllm-serve`` on a node of its own).

``GRPO_BENCH_EXECUTOR=slurm`` submits to Slurm (``sbatch`` where this runs: its ``SLURM_CONF``, its
partition from ``GRPO_BENCH_SLURM_PARTITION``); unset, the local executor runs the machines here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXECUTORS = ("local", "slurm")


def run_tasks(task: Callable[[], Any], machines: int, gpus_per_machine: int, timeout_s: float, folder: Path) -> list:
    """``task`` once per machine, all at once (they rendezvous), through submitit; their results in
    machine order. A task that failed raises submitit's error, naming the machine and its log."""
    import submitit  # the distributed extra's: a run on one machine never needs it

    kind = os.environ.get("GRPO_BENCH_EXECUTOR", "local")
    if kind not in EXECUTORS:
        raise ValueError(f"GRPO_BENCH_EXECUTOR={kind!r} is not one of {', '.join(EXECUTORS)}")
    minutes = max(1, int(timeout_s // 60) + 5)  # the configuration's own limit stops it first
    if kind == "slurm":
        executor = submitit.SlurmExecutor(folder=folder)
        partition = os.environ.get("GRPO_BENCH_SLURM_PARTITION")
        executor.update_parameters(
            nodes=machines,
            ntasks_per_node=1,
            time=minutes,
            **({"gpus_per_node": gpus_per_machine} if gpus_per_machine else {}),
            **({"partition": partition} if partition else {}),
        )
    else:
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(tasks_per_node=machines, timeout_min=minutes)
    return executor.submit(task).results()


def place_here() -> tuple[int, list[str]]:
    """(this task's machine rank, every machine's address in rank order), from submitit's view; the
    local executor's machines are this host, over loopback."""
    import submitit

    environment = submitit.JobEnvironment()
    if environment.cluster == "local":
        return environment.global_rank, ["127.0.0.1"] * environment.num_tasks
    return environment.global_rank, list(environment.hostnames)
