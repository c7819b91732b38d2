"""The job a GRPO worker is given: one configuration of a ``grpo`` or ``distributed`` part, or one probe of the
context search. The harness builds it (``Job``), places it (the server's address and devices, the channel) and
writes it beside the run as JSON; the worker reads it back as the same record (``Job.read``), its levers still
``Levers``. A key the record does not know, or a lever ``Levers`` does not declare, is an error naming it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import MISSING, asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.catalog.levers import Levers

STACKS = ("trl", "unsloth")  # how the policy is built: transformers + PEFT under TRL, or Unsloth's loader


@dataclass(frozen=True, kw_only=True)
class Job:
    levers: Levers
    model_dir: str  # the materialised shape (benchmarks.run.model_dirs.materialise)
    dtype: str  # torch's name: float32, bfloat16, float16
    prompt_words: int
    warmup_steps: int
    measured_steps: int
    weights: str = "saved"  # "on-device": no weights on disk, random ones made on the device
    stack: str = "trl"  # one of STACKS
    extra_config: dict[str, Any] = field(default_factory=dict)  # a contender's own GRPOConfig keys
    memory_budget_bytes: int | None = None  # CUDA: each rank caps torch's allocator at it
    malloc_mmap_threshold: int = 0  # CPU: glibc's thresholds fixed before torch loads (0: glibc's own)
    allocator_conf: str | None = None  # CUDA: PYTORCH_CUDA_ALLOC_CONF, set before torch reads it
    # Set as the harness places the job: the rollout server (server mode) and the parent's socket.
    server_host: str | None = None
    server_port: int | None = None
    server_starts_here: bool = False  # rank 0 starts `trl vllm-serve` beside the ranks (else a machine of its own)
    server_devices: tuple[str, ...] = ()  # the server's GPUs (UUIDs), never the trainer's
    channel: str = ""  # the Unix socket every rank reports on

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise ValueError(f"job: stack {self.stack!r} is not one of {', '.join(STACKS)}")

    @property
    def server_mode(self) -> bool:
        return self.levers.use_vllm and self.levers.vllm_mode == "server"

    def with_levers(self, **changes: Any) -> Job:
        return replace(self, levers=self.levers.changed(**changes))

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> Job:
        """The job written at ``path``; a key it lacks or one it does not know is named with the file."""
        data = json.loads(path.read_text())
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is MISSING and f.default_factory is MISSING}
        lever_names = {f.name for f in dataclasses.fields(Levers)}
        unknown = sorted(set(data) - {f.name for f in fields})
        unknown += sorted(f"levers.{k}" for k in set(data.get("levers", {})) - lever_names)
        if missing := sorted(required - set(data)):
            raise ValueError(f"{path}: missing key(s) {', '.join(missing)} in a worker's job")
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)} in a worker's job")
        levers = Levers(**data.pop("levers"))
        return cls(levers=levers, **{**data, "server_devices": tuple(data.get("server_devices", ()))})
