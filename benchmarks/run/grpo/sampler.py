"""The parent's memory sampler: the RSS of a worker tree (every 20 ms and at every phase boundary; on CUDA
also the device memory its processes hold, vLLM's included: ``benchmarks.run.machine.nvml_gpus``), each sample
attributed to the step and phase its rank last reported, and the budget a tree may not pass."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from benchmarks.run.machine import nvml_gpus

SAMPLE_INTERVAL_S = 0.02


class MemorySampler(threading.Thread):
    """Peak memory per rank and (step, phase), read every 20 ms and at every phase boundary: the host
    RSS of each rank's process and its children, and on CUDA the device memory they hold
    (``nvml_gpus.DeviceMemory``); what belongs to no rank (the launcher) is rank None. Stops the whole
    tree when its RSS passes ``budget_bytes``, or on unified memory when the host's MemAvailable falls
    under the device's floor."""

    def __init__(self, pid: int, budget_bytes: int | None, device: nvml_gpus.DeviceMemory | None = None) -> None:
        super().__init__(daemon=True)
        import psutil  # the worker extra's: `nox -s tables` runs this package without it

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.budget_bytes = budget_bytes
        self.ranks: dict[int, Any] = {}  # rank -> its process, from its hello
        self.where: dict[int | None, tuple[int | None, str]] = {None: (None, "setup")}
        self.peaks: dict[tuple[int | None, int | None, str], int] = {}  # (rank, step, phase) -> host RSS
        self.over_budget: tuple[int | None, str] | None = None  # where the tree was stopped: budget or floor
        self.below_floor = False  # unified memory: the host's MemAvailable fell under the device's floor
        self.samples = 0
        self.cpu_s = 0.0
        self.members: dict[int | None, list] = {None: [self.root]}  # rank -> its processes
        self.forks: set[int] = set()  # children that are their parent's fork: their own pages only
        self.device = device
        self.device_process_peaks: dict[tuple[int | None, int | None, str], int] = {}  # NVML usedGpuMemory
        self.device_used_peaks: dict[tuple[int | None, str], int] = {}  # the devices' use above the baseline
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def add_rank(self, rank: int, pid: int) -> None:
        with self.lock:
            self.ranks[rank] = self.psutil.Process(pid)
            self.where[rank] = self.where.get(rank, (None, "setup"))
        self.list_members()

    def list_members(self) -> None:
        """Which processes are whose: each rank's process and its children; the rest the launcher's.
        A child that runs its parent's command line is a fork not (yet) replaced by another program:
        its pages are its parent's, shared copy-on-write, and only its own (USS) are counted."""
        everyone = [self.root, *self.root.children(recursive=True)]
        owned: dict[int | None, list] = {}
        taken: set[int] = set()
        for rank, process in list(self.ranks.items()):
            try:
                owned[rank] = [process, *process.children(recursive=True)]
            except self.psutil.Error:  # the rank has ended
                owned[rank] = []
            taken |= {member.pid for member in owned[rank]}
        owned[None] = [member for member in everyone if member.pid not in taken]
        forks = set()
        for member in everyone[1:]:
            try:
                if member.cmdline() == member.parent().cmdline():
                    forks.add(member.pid)
            except (self.psutil.Error, AttributeError):  # ended, or its parent has
                continue
        self.members, self.forks = owned, forks

    def rss(self, members: list) -> int:
        total = 0
        for process in members:
            try:
                total += process.memory_full_info().uss if process.pid in self.forks else process.memory_info().rss
            except Exception:  # a child that ended between listing and reading
                continue
        return total

    def sample(self, also: dict[int | None, tuple[int | None, str]] | None = None) -> None:
        """One reading per rank, charged to its current (step, phase) and to ``also``'s if given."""
        members = self.members
        total = 0
        ranks = {rank: {m.pid for m in processes} for rank, processes in members.items() if rank is not None}
        held_by_rank, used = self.device.read(ranks) if self.device else ({}, 0)  # one NVML sweep for every rank
        with self.lock:
            for rank, processes in members.items():
                rss = self.rss(processes)
                total += rss
                held = held_by_rank.get(rank)
                now = self.where.get(rank, (None, "setup"))
                for step, phase in {now, (also or {}).get(rank, now)}:
                    key = (rank, step, phase)
                    self.peaks[key] = max(self.peaks.get(key, 0), rss)
                    if held is not None:
                        self.device_process_peaks[key] = max(self.device_process_peaks.get(key, 0), held)
            if self.device:
                first = self.where.get(min(self.ranks, default=None), (None, "setup"))
                self.device_used_peaks[first] = max(self.device_used_peaks.get(first, 0), used)
            self.samples += 1
        over = self.budget_bytes and total > self.budget_bytes
        self.below_floor = self.below_floor or bool(self.device and self.device.below_floor())
        if (over or self.below_floor) and self.over_budget is None:
            self.over_budget = self.where.get(min(self.ranks, default=None), (None, "setup"))
            os.killpg(self.root.pid, signal.SIGKILL)

    def move_to(self, rank: int, where: tuple[int | None, str]) -> None:
        """A phase boundary of ``rank``: the reading there ends its old phase and starts the new one,
        so that a phase shorter than the sampling interval still has its memory read."""
        started = time.process_time()
        previous = self.where.get(rank, (None, "setup"))
        self.where[rank] = where
        self.sample(also={rank: previous})
        self.cpu_s += time.process_time() - started

    def rank_peaks(self, rank: int) -> tuple[dict[tuple[int | None, str], int], dict[tuple[int | None, str], int]]:
        """(host RSS peaks, device peaks) of one rank by (step, phase)."""

        def this_rank(peaks: dict) -> dict[tuple[int | None, str], int]:
            return {(step, phase): value for (r, step, phase), value in peaks.items() if r == rank}

        return this_rank(self.peaks), this_rank(self.device_process_peaks)

    def run(self) -> None:
        listed = 0.0
        while not self.stopped.is_set():
            started = time.thread_time()
            if time.monotonic() - listed > 0.5:
                try:
                    self.list_members()
                    listed = time.monotonic()
                except Exception:  # the launcher is gone
                    break
            self.sample()
            self.cpu_s += time.thread_time() - started
            self.stopped.wait(SAMPLE_INTERVAL_S)
