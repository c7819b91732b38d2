"""The rank channel: what a launch's ranks say to the parent (hello, phases, steps, how they ended), each
phase boundary passed on to the memory sampler as it comes."""

from __future__ import annotations

import json
import selectors
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.results import schema
from benchmarks.run.grpo.sampler import MemorySampler


class Channel:
    """The Unix socket every rank of a configuration reports on: one JSON event per line, each
    carrying its rank (a socket, not a pipe: launchers close the file descriptors they do not know)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(64)

    def events(self, launcher: subprocess.Popen) -> Iterator[dict]:
        """Every event of every rank until the launcher has ended and every rank has hung up."""
        selector = selectors.DefaultSelector()
        selector.register(self.server, selectors.EVENT_READ)
        pending: dict[socket.socket, bytes] = {}
        try:
            while True:
                ready = selector.select(timeout=0.2)
                for key, _ in ready:
                    if key.fileobj is self.server:
                        connection, _ = self.server.accept()
                        selector.register(connection, selectors.EVENT_READ)
                        pending[connection] = b""
                        continue
                    connection = key.fileobj
                    data = connection.recv(1 << 16)
                    if not data:
                        selector.unregister(connection)
                        connection.close()
                        del pending[connection]
                        continue
                    *lines, pending[connection] = (pending[connection] + data).split(b"\n")
                    for line in lines:
                        yield json.loads(line)
                if not ready and not pending and launcher.poll() is not None:
                    return
        finally:
            for connection in pending:
                connection.close()
            selector.close()
            self.server.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listen(channel: Channel, launcher: subprocess.Popen, sampler: MemorySampler, log_path: Path) -> RankReports:
    """What the ranks say on the channel until they have all hung up, each phase boundary passed on to
    the sampler as it comes."""
    heard = RankReports()
    for event in channel.events(launcher):
        rank, kind = event.pop("rank", 0), event.pop("event")
        now = sampler.where.get(rank, (None, "setup"))
        if kind == "hello":
            heard.hellos.append(rank)
            sampler.add_rank(rank, event["pid"])
        elif kind == "phase":
            sampler.move_to(rank, (now[0], event["phase"]))
            heard.where[rank] = sampler.where[rank]
        elif kind == "step_begin":
            sampler.move_to(rank, (event["step"], now[1]))
            heard.where[rank] = sampler.where[rank]
        elif kind == "step":
            heard.steps.setdefault(rank, []).append(schema.decode(schema.Step, event, f"{log_path.name}: step"))
        elif kind == "versions":
            heard.versions = event["versions"]
        elif kind == "device":
            heard.on_cuda[rank] = event
        elif kind == "distribution":
            heard.distribution[rank] = event
        else:
            heard.endings.append((rank, {"event": kind, **event}))
    return heard


@dataclass
class RankReports:
    """What the ranks of one launch said on the channel."""

    hellos: list[int] = field(default_factory=list)
    steps: dict[int, list[schema.Step]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    on_cuda: dict[int, dict] = field(default_factory=dict)
    distribution: dict[int, dict] = field(default_factory=dict)
    endings: list[tuple[int, dict]] = field(default_factory=list)
    where: dict[int, tuple[int | None, str]] = field(default_factory=dict)  # each rank's last (step, phase)
