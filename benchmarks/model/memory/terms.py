"""The memory model's parts: its constants (each with where it comes from), the workload a rank processes,
the estimate it fills, and the bytes of the pieces every term is counted from (LoRA's parameters, an NF4
base, a layer's activations, the logits path, a vLLM engine's needs)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from benchmarks.catalog.profiles import Levers
from benchmarks.catalog.shapes import Shape
from benchmarks.model.memory.decode_bytes import kv_bytes_per_token
from benchmarks.model.memory.vllm_engine import UNIFIED_START_GROWTH, engine_overheads

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
# A DeepSpeed rank on a CPU (gloo) peaks above its model states and micro-batch by about its whole
# gradient in the trainable parameters' dtype, though its gradient partition is all it keeps (live
# tensors after the step are exactly the model states): the gradients backward makes before they are
# reduced, and the heap glibc keeps after freeing them, are the candidates; the cause is not
# established. Fitted on the 0.5B class's ZeRO-2/3 run (1.29 and 1.65 of it measured: 1 is the round
# floor of both), scored on the 135M class's (model.md). Not applied on CUDA, where nothing was measured.
CPU_DEEPSPEED_TRANSIENT_GRADIENTS = 1.0


@dataclass(frozen=True)
class Workload:
    """What one rank processes: the loss's micro-batch (``completions``: per_device_train_batch_size), the rollout
    that generates several micro-batches at once (``generated``: TRL's per_device_train_batch_size x
    steps_per_generation, which defaults to gradient_accumulation_steps) and the rollouts an optimizer step
    takes (``rollouts``: gradient_accumulation_steps / steps_per_generation; under 1 where one serves several)."""

    completions: int
    prompt_tokens: int
    completion_tokens: int  # the longest a completion may be (max_completion_length)
    generated: int = 0  # 0: one micro-batch
    mean_completion: float = 0.0  # the completions' mean length; 0: every one at ``completion_tokens``
    rollouts: float = 1.0
    # a micro-batch's sequences concatenated without padding (verl's remove_padding, NeMo RL's sequence packing): its
    # tokens are their own lengths', not its longest's times their count (TRL pads)
    packed: bool = False

    def __post_init__(self) -> None:
        for name in ("completions", "completion_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("prompt_tokens", "generated"):  # 0: no prompt (a per-position measure); one micro-batch
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if not 0 <= self.mean_completion <= self.completion_tokens:
            raise ValueError(
                f"mean completion {self.mean_completion:g} must be between 0 and the longest, {self.completion_tokens}"
            )

    @classmethod
    def from_levers(
        cls,
        levers: Levers,
        prompt_tokens: int,
        completion_tokens: int | None = None,
        mean_completion: float = 0.0,
        packed: bool = False,
    ) -> Workload:
        """The workload the levers define, TRL's way (``packed``: a framework that packs its micro-batches)."""
        length = levers.max_completion_length if completion_tokens is None else completion_tokens
        generated = levers.per_device_train_batch_size * levers.generation_steps
        rollouts = levers.gradient_accumulation_steps / levers.generation_steps
        return cls(
            levers.per_device_train_batch_size, prompt_tokens, length, generated, mean_completion, rollouts, packed
        )

    @property
    def mean_completion_tokens(self) -> float:
        return self.mean_completion or self.completion_tokens

    @property
    def positions(self) -> int:
        return self.completions * (self.prompt_tokens + self.completion_tokens)

    @property
    def rollout_sequences(self) -> int:
        """The sequences one rollout generates."""
        return self.generated or self.completions

    @property
    def step_sequences(self) -> float:
        """The sequences one optimizer step trains on."""
        return self.rollout_sequences * self.rollouts


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
    """What a vLLM engine holds to run a rollout at once: its weights in its own precision, the KV cache of the
    whole rollout, and its own overheads; and the least it starts with: the KV of one sequence at its
    max_model_len in place of the rollout's (vLLM's check_enough_kv_cache_memory refuses less, "To serve at least
    one request with the models's max seq len"; with more, it schedules the rollout's sequences in turn)."""

    weights: int
    kv_cache: int
    overhead: int  # inside the share: outside torch and the profile run's activation peak (vllm_memory)
    precision: str
    kv_one_sequence: int = 0
    graphs: int = 0  # CUDA graphs, captured on top of the share
    overhead_words: str = ""
    start_growth: int = 0  # in ``overhead``: the host's growth while it starts (unified memory), freed once started

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    @property
    def to_start(self) -> int:
        return self.weights + self.kv_one_sequence + self.overhead


def engine_need(shape: Shape, dtype: str, levers: Levers, work: Workload, unified: bool = False) -> EngineNeed:
    """The engine as vLLM sizes it on CUDA. TRL 1.16 starts it with bitsandbytes 4-bit when the policy
    is 4-bit (QLoRA), else in the model's dtype; its KV cache must hold the rollout's sequences at
    ``vllm_max_model_length`` (unset: the workload's prompt + completion). On ``unified`` memory its overheads also
    hold the host's growth during its start, which vLLM charges to it there (``UNIFIED_START_GROWTH``)."""
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
    one = kv_bytes_per_token(shape, b) * length / tp
    own = engine_overheads(shape, b, levers)
    growth = UNIFIED_START_GROWTH if unified else 0
    words = own.words() + (
        f"; the host's growth at its start {growth / GIB:.1f} GiB (unified memory)" if growth else ""
    )
    return EngineNeed(int(weights / tp), kv, own.in_share + growth, precision, int(one), own.graphs, words, growth)


def quantised_params(shape: Shape) -> int:
    """The parameters bitsandbytes quantizes to 4 bits under QLoRA: every linear's (``qlora_weight_bytes``)."""
    kept = shape.vocab_size * shape.hidden_size
    if shape.moe:
        kept += shape.num_hidden_layers * shape.num_experts * shape.expert_params()
    return shape.param_count() - kept


def qlora_weight_bytes(shape: Shape, b: int) -> float:
    """A 4-bit base: bitsandbytes quantizes linears; the embedding, and a MoE's experts (3-D tensors in
    transformers 5, not linears), stay 16-bit."""
    quantised = quantised_params(shape)
    return quantised * NF4_BYTES_PER_PARAM + (shape.param_count() - quantised) * b


def trainable_params(shape: Shape, levers: Levers) -> int:
    """Parameters the optimizer steps: the adapters under (Q)LoRA, else every one."""
    return lora_params(shape, levers.lora_r) if levers.peft else shape.param_count()


def trainable_element_bytes(levers: Levers, dtype: str) -> int:
    """Bytes per trainable element (its gradient and its AdamW states too): PEFT keeps adapters in fp32 over
    a 16-bit base."""
    return 4 if levers.peft else DTYPE_BYTES[dtype]


@functools.cache  # a pure function of a frozen shape, asked for thousands of times a plan
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
