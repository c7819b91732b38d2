"""The one set of defaults every answer shares (``estimate``, ``plan``, sizing.md, the claims ledger, the site):
the guide's workload and residency, how a colocated engine's share is set, the lever sets from the lightest
up, and the unit of work that cost is counted in."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from benchmarks.catalog.levers import GUIDE_LEVERS, GUIDE_PROMPT_TOKENS, Levers, differences
from benchmarks.catalog.profiles import Hardware
from benchmarks.catalog.shapes import Shape
from benchmarks.model.estimate import Workload, engine_sized_to_rollout

# The guide's residency: policy, reference model (the KL term) and a colocated vLLM engine; one prompt's 8
# generations of 1024 tokens after a 256-token prompt a GPU, bf16.
GUIDE_DTYPE = "bfloat16"
GUIDE_WORKLOAD = Workload.from_levers(GUIDE_LEVERS, GUIDE_PROMPT_TOKENS)
GUIDE_BASE = replace(GUIDE_LEVERS, use_vllm=True, beta=0.04)
# Lever sets from the least machinery to the most: sizing.md's cell is the first that fits.
LADDER = (
    ("full, AdamW", {}),
    ("full, AdamW, checkpointing", {"gradient_checkpointing": True}),
    ("full, 8-bit AdamW, checkpointing", {"gradient_checkpointing": True, "optim": "adamw_8bit"}),
    (
        "full, 8-bit AdamW, checkpointing, vLLM sleep",
        {"gradient_checkpointing": True, "optim": "adamw_8bit", "vllm_enable_sleep_mode": True},
    ),
    ("LoRA, checkpointing", {"model": "lora", "gradient_checkpointing": True}),
    (
        "LoRA, checkpointing, vLLM sleep",
        {"model": "lora", "gradient_checkpointing": True, "vllm_enable_sleep_mode": True},
    ),
    (
        "QLoRA, checkpointing, vLLM sleep",
        {"model": "qlora", "gradient_checkpointing": True, "vllm_enable_sleep_mode": True},
    ),
)


def ladder(hardware: Hardware) -> list[tuple[str, dict]]:
    """The lever sets of LADDER that ``hardware`` can run: on a CPU neither QLoRA's 4-bit bitsandbytes nor vLLM
    sleep mode, both CUDA only."""
    if hardware.gpu_class != "cpu":
        return list(LADDER)
    return [(label, c) for label, c in LADDER if c.get("model") != "qlora" and not c.get("vllm_enable_sleep_mode")]


def engine_share(
    shape: Shape, dtype: str, levers: Levers, hardware: Hardware, prompt_tokens: int, fixed: bool = False
) -> Levers:
    """A colocated engine on a GPU gets the share its rollout needs (``engine_sized_to_rollout``) unless the
    user ``fixed`` ``vllm_gpu_memory_utilization``; the same rule in every answer."""
    colocated = levers.use_vllm and levers.vllm_mode == "colocate" and hardware.gpu_class != "cpu"
    if fixed or not colocated or not hardware.memory_gib:
        return levers
    return engine_sized_to_rollout(shape, dtype, levers, Workload.from_levers(levers, prompt_tokens), hardware)


@dataclass(frozen=True)
class Job:
    """The work a plan is priced for: ``steps`` optimizer steps of ``global_batch`` completions of
    ``completion_tokens`` each. A setup whose ranks together generate more or fewer completions a step is
    priced by the completion tokens it produces, so that 1 GPU and 64 are compared on the same work."""

    steps: int = 1000
    global_batch: int = GUIDE_LEVERS.per_device_train_batch_size  # the guide's step: one prompt's 8 completions
    completion_tokens: int = GUIDE_LEVERS.max_completion_length

    def __post_init__(self) -> None:
        for field in fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"{field.name} must be positive, got {getattr(self, field.name)}")

    @property
    def tokens(self) -> int:
        """Completion tokens the whole job generates."""
        return self.steps * self.global_batch * self.completion_tokens

    def line(self) -> str:
        return (
            f"{self.steps:,} steps of {self.global_batch} completions x {self.completion_tokens} tokens "
            f"({self.tokens / 1e6:,.4g} million completion tokens)"
        )


GUIDE_JOB = Job()  # GPU-hours "per 1,000 steps" everywhere: of this work


def differing(levers: Levers, base: Levers) -> str:
    """The levers that differ from ``base``, as ``k=v`` (TOML's spelling), or "the defaults"."""
    return ", ".join(f"{name}={spelled(value)}" for name, value in differences(levers, base)) or "the defaults"


def spelled(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


OPTIMIZER_WORDS = {"adamw_torch": "AdamW", "adamw_8bit": "8-bit AdamW"}
METHOD_WORDS = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}


def in_words(levers: Levers, server_gpus: int = 0) -> str:
    """A configuration as a person names it: method, optimizer, checkpointing, the engine, the launcher, and
    the micro-batch where it is split."""
    parts = [METHOD_WORDS[levers.model], OPTIMIZER_WORDS.get(levers.optim, levers.optim)]
    parts += ["checkpointing"] * levers.gradient_checkpointing
    if levers.use_vllm and levers.vllm_mode == "server":
        parts.append(f"vLLM server on {server_gpus or levers.vllm_server_tensor_parallel_size} GPU(s)")
    elif levers.use_vllm:
        tp = f" over {levers.vllm_tensor_parallel_size} GPUs" if levers.vllm_tensor_parallel_size > 1 else ""
        parts.append("vLLM colocated" + tp + (" + sleep" if levers.vllm_enable_sleep_mode else ""))
    else:
        parts.append("transformers generate")
    if levers.distributed_type != "no":
        parts.append({"ddp": "DDP", "fsdp2": "FSDP2"}.get(levers.distributed_type, levers.distributed_type.upper()))
    if levers.gradient_accumulation_steps > 1:
        parts.append(f"micro-batch {levers.per_device_train_batch_size} x {levers.gradient_accumulation_steps}")
    return ", ".join(parts).replace("ZERO", "ZeRO-")
