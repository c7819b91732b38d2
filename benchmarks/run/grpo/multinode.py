"""One configuration over many machines: a task per machine (started here, or submitted to Slurm), a
server on a machine of its own where the levers ask for one, the machines' records merged into one."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.results import schema
from benchmarks.run.grpo import cluster, launch
from benchmarks.run.grpo.channel import free_port
from benchmarks.run.grpo.configuration import die_with_parent, run_configuration, skipped
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.outcome import merged_steps, summarise
from benchmarks.run.grpo.worker import SERVER_NEEDS_CUDA, server_command


def run_machines(
    job: Job, budget_bytes: int | None, log_path: Path, timeout_s: float, gpus: bool
) -> schema.WorkerRecord:
    """A configuration over ``num_machines`` machines: one launcher per machine through submitit, as one
    job (``cluster.run_tasks``), rendezvous on the first machine; in server mode one more machine runs
    ``trl vllm-serve`` alone, as TRL's multi-node recipe does. The trainer machines' records merged."""
    if job.server_mode and not gpus:
        return skipped(SERVER_NEEDS_CUDA)
    task, machines, per_machine, where = machines_job(job, budget_bytes, log_path, timeout_s, gpus)
    return merge_machines([r for r in cluster.run_tasks(task, machines, per_machine, timeout_s, where) if r])


def machines_job(
    job: Job, budget_bytes: int | None, log_path: Path, timeout_s: float, gpus: bool
) -> tuple[Callable[[], Any], int, int, Path]:
    """What submitit runs for one configuration: the task every machine runs, how many machines (the
    vLLM server's one included), the GPUs each asks for (a GPU per rank, or per server GPU), and the
    folder its machines share."""
    levers = job.levers
    server = levers.vllm_server_tensor_parallel_size * levers.vllm_server_data_parallel_size
    where = cluster.folder(log_path.with_suffix(".submitit"))
    where.mkdir(parents=True, exist_ok=True)  # the machines' logs go here, whichever job array runs them
    log = where / log_path.name
    task = functools.partial(machine_task, job, budget_bytes, str(log), timeout_s, free_port())
    machines = levers.num_machines + (1 if job.server_mode else 0)
    per_machine = max(levers.num_processes, server if job.server_mode else 0) if gpus else 0
    return task, machines, per_machine, where


def submit_to_slurm(
    jobs: dict[int, Job], budget_bytes: int | None, logs: Path, timeout_s: float, gpus: bool
) -> dict[int, Any]:
    """Every configuration (number -> job, as ``run_grpo`` makes them) as a Slurm job,
    those needing the same machines and GPUs as one job array; their submitit jobs by number."""
    groups: dict[tuple[int, int], list[tuple[int, Callable[[], Any], Path]]] = {}
    for number, job in jobs.items():
        task, machines, per_machine, where = machines_job(job, budget_bytes, logs / f"{number}.log", timeout_s, gpus)
        groups.setdefault((machines, per_machine), []).append((number, task, where))
    submitted = {}
    for (machines, per_machine), members in groups.items():
        array = cluster.submit_array([task for _, task, _ in members], machines, per_machine, timeout_s, members[0][2])
        submitted |= {number: job for (number, _, _), job in zip(members, array, strict=True)}
    return submitted


def slurm_record(job: Any) -> schema.WorkerRecord:
    """A submitted configuration's record once its Slurm job ends; a job that failed is an error with
    what Slurm and the task said, never a hole in the result file."""
    try:
        return merge_machines([record for record in job.results() if record is not None])
    except Exception as error:  # submitit's FailedJobError / UncompletedJobError: the job's own words
        return schema.WorkerRecord(status="error", reason=f"Slurm job {job.job_id}: {str(error)[-1500:]}")


def machine_task(
    job: Job, budget_bytes: int | None, log_path: str, timeout_s: float, port: int
) -> schema.WorkerRecord | None:
    """One machine's part of a configuration, run by submitit on that machine: its ranks' launcher,
    or, on the machine after the trainers' in server mode, the vLLM server until the trainers are done."""
    machine_rank, hosts = cluster.place_here()
    levers = job.levers
    done = Path(f"{log_path}.trainers-done")  # submitit's folder is shared by the job's machines
    if job.server_mode:
        job = replace(job, server_host=hosts[levers.num_machines], server_port=port + 1)
        if machine_rank == levers.num_machines:
            serve_until(job, done, Path(f"{log_path}.server"), timeout_s)
            return None
    place = launch.Rendezvous(machine_rank=machine_rank, main_process_ip=hosts[0], main_process_port=port)
    record = run_configuration(
        job, budget_bytes, Path(f"{log_path}.machine{machine_rank}"), timeout_s=timeout_s, place=place
    )
    if machine_rank == 0:
        done.touch()
    return record


def serve_until(job: Job, done: Path, log_path: Path, timeout_s: float) -> None:
    """``trl vllm-serve`` on every GPU of this machine until ``done`` appears (or the time limit)."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            server_command(job, sys.executable, host="0.0.0.0"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    deadline = time.monotonic() + timeout_s
    while not done.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(2)
    os.killpg(server.pid, signal.SIGTERM)
    server.wait()


def merge_machines(records: list[schema.WorkerRecord]) -> schema.WorkerRecord:
    """The machines' records as one configuration's: its status the first that is not ok (naming the
    machine), its steps the maximum over every rank, its ranks every machine's."""
    first = records[0]
    for machine_rank, record in enumerate(records):
        for rank in record.ranks:
            rank.machine_rank = machine_rank
    steps = merged_steps([r.steps for r in records])
    merged = replace(first, steps=steps, ranks=[rank for r in records for rank in r.ranks])
    measure = first.summary.peak_measure if first.summary else schema.HOST_RSS
    merged.summary = summarise(steps, measure)
    bad = [(i, r) for i, r in enumerate(records) if r.status != "ok"]
    if bad:
        machine_rank, record = bad[0]
        merged.status, merged.phase, merged.error, merged.log_tail = (
            record.status,
            record.phase,
            record.error,
            record.log_tail,
        )
        merged.reason = f"machine {machine_rank}: {record.reason}"
    if first.distribution is not None:
        fractions = [r.distribution.held_parameter_fraction for r in records if r.distribution]
        held = max((f for f in fractions if f is not None), default=None)
        merged.distribution = replace(first.distribution, held_parameter_fraction=held)
    harnesses = [r.harness for r in records if r.harness]
    if harnesses:
        merged.harness = replace(
            harnesses[0],
            wall_s=max(h.wall_s for h in harnesses),
            overhead_fraction=max(h.overhead_fraction for h in harnesses),
            launcher_peak_rss_bytes=max(h.launcher_peak_rss_bytes for h in harnesses),
        )
    return merged
