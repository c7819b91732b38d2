"""The levers, each declared once (``lever``): its default, where it goes (TRL's ``GRPOConfig``, model
loading, the launcher, the server, the trainer), one line of help and its allowed values; and the checks
of a configuration's levers, alone and together."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any


class ProfileError(ValueError):
    pass


MODELS = ("full", "lora", "qlora")
PEFT_MODELS = ("lora", "qlora")  # the model levers that train adapters over a frozen base
STEP_REWARDS = ("synthetic", "format-exact", "schema", "execution")  # worker.step_rewards
VLLM_MODES = ("colocate", "server")
DISTRIBUTED_TYPES = ("no", "ddp", "zero1", "zero2", "zero3", "fsdp2")
OFFLOAD_DEVICES = ("none", "cpu")
# TRL passes `optim` to transformers: the values of transformers.training_args.OptimizerNames
# (transformers 5.17; tests/test_profiles.py checks this list against the installed enum).
OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor", "adamw_anyprecision",
    "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "sgd", "adagrad", "adamw_bnb_8bit", "adamw_8bit",
    "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit",
    "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "lomo", "adalomo", "grokadamw",
    "schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd", "apollo_adamw", "apollo_adamw_layerwise",
    "stable_adamw",
)  # fmt: skip
# Where a lever goes: a field of TRL's GRPOConfig (passed as is), how the policy is loaded, the launcher's
# config (accelerate, DeepSpeed), `trl vllm-serve`'s arguments, or GRPOTrainer's reward_funcs.
GRPO_CONFIG, MODEL_LOADING, LAUNCHER, SERVER, TRAINER = "GRPOConfig", "model loading", "launcher", "server", "trainer"
LEVER_KINDS = (GRPO_CONFIG, MODEL_LOADING, LAUNCHER, SERVER, TRAINER)


def lever(default: Any, kind: str, help: str, allowed: Any = None, meaning: str = "") -> Any:
    """A lever declared once: its default, where it goes (``kind``), one line of help, and the values it
    may take (a tuple, or a test with ``meaning`` saying what it wants; None: any of its type)."""
    return dataclasses.field(
        default=default, metadata={"kind": kind, "help": help, "allowed": allowed, "meaning": meaning}
    )


def positive(v: Any) -> bool:
    return v > 0


@dataclass(frozen=True)
class Levers:
    """One GRPO configuration, each lever declared once (``lever``): TRL ``GRPOConfig`` field names (copy a
    row straight into a trainer), how the policy is loaded, how many ranks and machines, the server's shape
    and the reward the step runs."""

    optim: str = lever(
        "adamw_torch",
        GRPO_CONFIG,
        "adamw_8bit: bitsandbytes 8-bit states, ~2 B/param instead of 8",
        OPTIMIZERS,
        "one of TRL's optimizers (transformers OptimizerNames)",
    )
    gradient_checkpointing: bool = lever(False, GRPO_CONFIG, "True: recompute activations in backward")
    use_vllm: bool = lever(False, GRPO_CONFIG, "False: rollouts with transformers generate")
    vllm_mode: str = lever(
        "colocate",
        GRPO_CONFIG,
        "colocate: the engine shares the device; server: `trl vllm-serve`",
        VLLM_MODES,
        "one of colocate, server",
    )
    vllm_enable_sleep_mode: bool = lever(
        False, GRPO_CONFIG, "True: engine weights and KV cache released between rollouts (CUDA)"
    )
    vllm_gpu_memory_utilization: float = lever(
        0.3,
        GRPO_CONFIG,
        "the engine's share of device memory (of RAM on CPU)",
        lambda v: 0 < v <= 1,
        "a fraction in (0, 1]",
    )
    vllm_max_model_length: int | None = lever(
        None,
        GRPO_CONFIG,
        "the engine's context (unset: the workload's prompt + completion + 8)",
        lambda v: v is None or v > 0,
        "positive",
    )
    beta: float = lever(
        0.0, GRPO_CONFIG, "> 0 without PEFT: a reference copy of the weights", lambda v: v >= 0, "at least 0"
    )
    num_generations: int = lever(
        4,
        GRPO_CONFIG,
        "completions per prompt",
        lambda v: v >= 2,
        "at least 2 (GRPO's advantages compare completions of one prompt)",
    )
    per_device_train_batch_size: int = lever(
        4, GRPO_CONFIG, "completions in one forward and backward on this device", positive, "positive"
    )
    gradient_accumulation_steps: int = lever(1, GRPO_CONFIG, "micro-batches per optimizer step", positive, "positive")
    steps_per_generation: int | None = lever(
        None,
        GRPO_CONFIG,
        "micro-batches one rollout generates (unset: gradient_accumulation_steps, TRL's default: one a step)",
        lambda v: v is None or v > 0,
        "unset or positive",
    )
    max_completion_length: int = lever(32, GRPO_CONFIG, "every completion is exactly this long", positive, "positive")
    learning_rate: float = lever(1e-6, GRPO_CONFIG, "the optimizer's learning rate", positive, "positive")
    model: str = lever(
        "full",
        MODEL_LOADING,
        "full fine-tuning, lora (adapters over the base) or qlora (4-bit base, CUDA)",
        MODELS,
        "one of full, lora, qlora",
    )
    lora_r: int = lever(16, MODEL_LOADING, "LoRA's rank, on every linear", positive, "positive")
    num_processes: int = lever(1, LAUNCHER, "ranks per machine (accelerate's num_processes)", positive, "positive")
    num_machines: int = lever(1, LAUNCHER, "machines (accelerate's num_machines)", positive, "positive")
    distributed_type: str = lever(
        "no",
        LAUNCHER,
        "no (one process), ddp, zero1/2/3 (DeepSpeed), fsdp2 (PyTorch's fully_shard)",
        DISTRIBUTED_TYPES,
        "one of " + ", ".join(DISTRIBUTED_TYPES),
    )
    offload_optimizer_device: str = lever(
        "none",
        LAUNCHER,
        "cpu: ZeRO keeps optimizer states and the fp32 master in host memory",
        OFFLOAD_DEVICES,
        "one of none, cpu",
    )
    offload_param_device: str = lever(
        "none", LAUNCHER, "cpu: ZeRO-3 keeps parameter partitions in host memory", OFFLOAD_DEVICES, "one of none, cpu"
    )
    ds3_gather_for_generation: bool = lever(
        True, GRPO_CONFIG, "ZeRO-3, False: generate from the partitioned weights (less memory, slower)"
    )
    vllm_tensor_parallel_size: int = lever(
        1, GRPO_CONFIG, "colocate: the engine split over this many of the trainer's ranks", positive, "positive"
    )
    vllm_server_tensor_parallel_size: int = lever(
        1, SERVER, "`trl vllm-serve --tensor_parallel_size`", positive, "positive"
    )
    vllm_server_data_parallel_size: int = lever(
        1, SERVER, "`trl vllm-serve --data_parallel_size`", positive, "positive"
    )
    reward: str = lever(
        "synthetic",
        TRAINER,
        "the step's reward: synthetic (a cheap hash), format-exact, schema, execution (sandboxed unit tests)",
        STEP_REWARDS,
        "one of " + ", ".join(STEP_REWARDS),
    )

    @classmethod
    def recorded(cls, table: dict[str, Any]) -> Levers:
        """The levers a result file recorded; a lever added since takes its default, and a key the suite no
        longer knows is left out."""
        return cls(**{key: value for key, value in table.items() if key in LEVER_NAMES})

    @property
    def peft(self) -> bool:
        """Adapters trained over a frozen base (LoRA, QLoRA), not every weight."""
        return self.model in PEFT_MODELS

    @property
    def generation_steps(self) -> int:
        """The micro-batches one rollout generates: steps_per_generation, TRL's default where unset."""
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_machines

    def changed(self, **changes: Any) -> Levers:
        """These levers with ``changes``: what ``dataclasses.replace`` makes, an unknown name refused alike, at a
        sixth of its cost (a plan's search makes some 50,000): ``Levers`` checks nothing as it is built, so its
        fields are copied as they stand."""
        unknown = changes.keys() - LEVER_NAMES
        if unknown:
            raise TypeError(f"Levers has no lever {', '.join(sorted(unknown))}")
        copy = object.__new__(Levers)
        object.__setattr__(copy, "__dict__", {**self.__dict__, **changes})
        return copy

    def of_kind(self, kind: str) -> dict[str, Any]:
        """The levers that go to ``kind`` (``GRPO_CONFIG``: the trainer's config), by name."""
        return {name: getattr(self, name) for name in levers_of_kind(kind)}


LEVER_NAMES = frozenset(field.name for field in dataclasses.fields(Levers))

# The guide's workload: one prompt's 8 generations of 1024 tokens after a 256-token prompt, each completion in
# one micro-batch; what the sizing table and `estimate` assume unless told otherwise.
GUIDE_LEVERS = Levers(num_generations=8, per_device_train_batch_size=8, max_completion_length=1024)
GUIDE_PROMPT_TOKENS = 256


def differences(levers: Levers, base: Levers) -> list[tuple[str, Any]]:
    """(name, value) of every lever of ``levers`` that differs from ``base``, in declaration order."""
    return [
        (f.name, getattr(levers, f.name))
        for f in dataclasses.fields(Levers)
        if getattr(levers, f.name) != getattr(base, f.name)
    ]


def levers_of_kind(kind: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Levers) if f.metadata["kind"] == kind)


# Each lever's allowed values, checked on load wherever a lever is given (profiles, estimate --levers).
LEVER_VALUES: dict[str, tuple[Any, str]] = {
    f.name: (f.metadata["allowed"], f.metadata["meaning"])
    for f in dataclasses.fields(Levers)
    if f.metadata["allowed"] is not None
}


def check_lever(name: str, value: Any, file: str, key: str) -> None:
    """A ProfileError naming ``file``, ``key`` and the allowed values if ``value`` is not one of them."""
    allowed, meaning = LEVER_VALUES.get(name, (None, ""))
    if allowed is None or (allowed(value) if callable(allowed) else value in allowed):
        return
    text = f"{file}: {key}: {value!r} is not {meaning}"
    if not callable(allowed):
        close = difflib.get_close_matches(str(value), allowed, n=3)
        text += (f" (did you mean {' or '.join(close)}?)" if close else "") + f"; allowed: {', '.join(allowed)}"
    raise ProfileError(text)


def check_levers(levers: Levers, file: str, key: str) -> None:
    """Every lever of a whole configuration, and what TRL, accelerate and DeepSpeed require of them together."""
    for name, value in dataclasses.asdict(levers).items():
        check_lever(name, value, file, f"{key}.{name}")
    problem = combination_problem(levers)
    if problem:
        raise ProfileError(f"{file}: {key}: {problem}")


def combination_problem(levers: Levers) -> str | None:
    """Why these levers cannot run together, or None."""
    world, kind = levers.world_size, levers.distributed_type
    generation_batch = levers.per_device_train_batch_size * world * levers.generation_steps
    if generation_batch % levers.num_generations:
        return (
            f"the generation batch, per_device_train_batch_size {levers.per_device_train_batch_size} x {world} "
            f"rank(s) x steps_per_generation {levers.generation_steps} = {generation_batch}, is not "
            f"a multiple of num_generations {levers.num_generations} (TRL's generation batch holds whole groups)"
        )
    if kind == "no" and world > 1:
        return (
            f"num_processes x num_machines = {world} ranks with distributed_type 'no': "
            "name how they share the model (ddp, zero1, zero2, zero3, fsdp2)"
        )
    if levers.offload_optimizer_device != "none" and kind not in ("zero1", "zero2", "zero3"):
        return (
            f"offload_optimizer_device {levers.offload_optimizer_device!r} is DeepSpeed ZeRO's; "
            f"distributed_type is {kind!r}"
        )
    if levers.offload_param_device != "none" and kind != "zero3":
        return (
            f"offload_param_device {levers.offload_param_device!r} needs ZeRO-3 (only it partitions parameters); "
            f"distributed_type is {kind!r}"
        )
    if levers.vllm_tensor_parallel_size > 1:
        if not (levers.use_vllm and levers.vllm_mode == "colocate"):
            return (
                "vllm_tensor_parallel_size > 1 splits the colocated engine: it needs use_vllm with vllm_mode 'colocate'"
            )
        if world % levers.vllm_tensor_parallel_size:
            return (
                f"vllm_tensor_parallel_size {levers.vllm_tensor_parallel_size} does not divide the world size {world} "
                "(TRL builds its tensor-parallel groups from the trainer's ranks)"
            )
    server_gpus = levers.vllm_server_tensor_parallel_size * levers.vllm_server_data_parallel_size
    if server_gpus > 1 and not (levers.use_vllm and levers.vllm_mode == "server"):
        return (
            "vllm_server_tensor_parallel_size / vllm_server_data_parallel_size size `trl vllm-serve`: "
            "they need use_vllm with vllm_mode 'server'"
        )
    return None
