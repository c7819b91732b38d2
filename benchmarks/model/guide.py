"""The one set of defaults every answer shares (``estimate``, ``plan``, sizing.md, the claims ledger, the site):
the guide's workload and residency, how a colocated engine's share is set, the lever sets from the lightest
up, and the unit of work that cost is counted in."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.catalog.levers import GUIDE_LEVERS, GUIDE_PROMPT_TOKENS, Levers, differences
from benchmarks.catalog.profiles import Hardware
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.placement import engine_sized_to_rollout
from benchmarks.model.memory.predict import Workload

# The guide's residency: policy, reference model (the KL term) and a colocated vLLM engine; one prompt's 8
# generations of 1024 tokens after a 256-token prompt a GPU, bf16.
GUIDE_DTYPE = "bfloat16"
GUIDE_WORKLOAD = Workload.from_levers(GUIDE_LEVERS, GUIDE_PROMPT_TOKENS)
GUIDE_BASE = GUIDE_LEVERS.changed(use_vllm=True, beta=0.04)
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
class Recipe:
    """The user's step, the unit every answer prices: ``prompts`` a step of ``generations`` completions each (the
    global batch, over every data-parallel rank together), the prompt's tokens, the completions' longest and mean
    (0: every one runs to the longest), and the job's steps. A setup's seconds a step are one optimizer step of
    this batch over its GPUs; its wall time ``steps`` of them."""

    prompts: int = 1
    generations: int = GUIDE_LEVERS.num_generations
    prompt_tokens: int = GUIDE_PROMPT_TOKENS
    completion_tokens: int = GUIDE_LEVERS.max_completion_length
    mean_completion: float = 0.0
    steps: int = 1000
    packed: bool = False  # the framework packs each micro-batch's sequences (verl, NeMo RL); TRL pads them

    def __post_init__(self) -> None:
        for name in ("prompts", "generations", "prompt_tokens", "completion_tokens", "steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.mean_completion <= self.completion_tokens:
            raise ValueError(
                f"the mean completion, {self.mean_completion:g}, must lie between 0 and the longest, "
                f"{self.completion_tokens}"
            )

    @classmethod
    def of_batch(cls, global_batch: int, generations: int, **given: float) -> Recipe:
        """The recipe of ``global_batch`` completions a step, whole groups of ``generations``."""
        if global_batch <= 0 or global_batch % generations:
            raise ValueError(
                f"a global batch of {global_batch} completions is not whole groups of num_generations {generations}"
            )
        return cls(global_batch // generations, generations, **given)

    @property
    def global_batch(self) -> int:
        return self.prompts * self.generations

    @property
    def mean_tokens(self) -> float:
        return self.mean_completion or self.completion_tokens

    @property
    def tokens(self) -> float:
        """Completion tokens the whole job generates."""
        return self.steps * self.global_batch * self.mean_tokens

    def per_rank(self, ranks: int) -> int | None:
        """The completions each of ``ranks`` data-parallel ranks trains on a step; None where the batch does not
        split evenly (a rank would idle or TRL would refuse it)."""
        share, rest = divmod(self.global_batch, ranks)
        return share if share and not rest else None

    def levers(self, base: Levers) -> Levers:
        """``base`` with this recipe's generations and longest completion."""
        return base.changed(num_generations=self.generations, max_completion_length=self.completion_tokens)

    def workload(self, levers: Levers) -> Workload:
        return Workload.from_levers(
            levers, self.prompt_tokens, mean_completion=self.mean_completion, packed=self.packed
        )

    def line(self) -> str:
        mean = f" (mean {self.mean_completion:g})" if self.mean_completion else ""
        return (
            f"{self.steps:,} steps of {self.prompts} prompt(s) x {self.generations} completions = {self.global_batch} "
            f"a step, {self.prompt_tokens}-token prompts, completions of up to {self.completion_tokens} tokens{mean} "
            f"({self.tokens / 1e6:,.4g} million completion tokens)"
        )


GUIDE_RECIPE = Recipe()  # the guide's step (one prompt's 8 completions), 1,000 of them: "per 1,000 steps" everywhere


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
