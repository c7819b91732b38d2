"""What a worker's rank tells the parent: its phases, timed exclusively (a phase's time excludes those
nested in it), each change reported on the channel with, on CUDA, the allocator's peaks in the phase."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, TextIO


class Phases:
    """Exclusive wall time per phase, with every change reported to the parent."""

    def __init__(self, channel: TextIO, cuda: bool) -> None:
        self.channel = channel
        self.cuda = cuda
        self.stack: list[str] = []
        self.seconds: dict[str, float] = defaultdict(float)
        self.cuda_peaks: dict[str, dict[str, int]] = defaultdict(
            lambda: {"allocated": 0, "reserved": 0, "device_used_at_end": 0}
        )
        self.since = time.perf_counter()
        self.failed: tuple[str, dict[str, int] | None] | None = None

    @property
    def current(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def _switch(self, to: str | None) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()  # the GPU work queued in this phase is this phase's, in time and memory
        now = time.perf_counter()
        if self.current is not None:
            self.seconds[self.current] += now - self.since
            if self.cuda:
                free, total = torch.cuda.mem_get_info()  # the device as the driver sees it, vLLM's memory included
                peaks = self.cuda_peaks[self.current]
                peaks["allocated"] = max(peaks["allocated"], torch.cuda.max_memory_allocated())
                peaks["reserved"] = max(peaks["reserved"], torch.cuda.max_memory_reserved())
                peaks["device_used_at_end"] = max(peaks["device_used_at_end"], total - free)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.since = now
        send(self.channel, event="phase", phase=to or "idle")

    def enter(self, name: str) -> None:
        self._switch(name)
        self.stack.append(name)

    def leave(self) -> None:
        self._switch(self.stack[-2] if len(self.stack) > 1 else None)  # charge the phase being left
        self.stack.pop()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        except BaseException:
            self.note_failure()
            raise
        finally:
            self.leave()

    def note_failure(self) -> None:
        """The innermost phase an error left, and on CUDA torch's allocator in it, read before leaving the
        phase resets the statistics (``failed``: phase, peaks)."""
        if self.failed is None and self.current is not None:
            peaks = None
            if self.cuda:
                import torch

                peaks = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
            self.failed = (self.current, peaks)

    def take(self) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
        """The totals since the last take, and reset them."""
        seconds, peaks = dict(self.seconds), {k: dict(v) for k, v in self.cuda_peaks.items()}
        self.seconds.clear()
        self.cuda_peaks.clear()
        return seconds, peaks


def send(channel: TextIO, **record: Any) -> None:
    """One event to the parent: a JSON line on the channel, carrying this rank."""
    channel.write(json.dumps({**record, "rank": RANK}) + "\n")
    channel.flush()


RANK = int(os.environ.get("RANK", "0"))  # set by accelerate's launcher for every rank; one process: 0
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
