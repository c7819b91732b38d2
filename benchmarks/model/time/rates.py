"""The time model's rates (``work_rates.Rates``): a GPU class's from its catalogued peaks at constants fitted on
published figures (``GpuConstants``, ``benchmarks.model.time.calibration``), the machine at hand's from its calibration
times coefficients fitted on its own runs (``Coefficients``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from benchmarks.catalog.profiles import Hardware
from benchmarks.model.memory.terms import GIB
from benchmarks.model.time.work_rates import CALIBRATION_FLOPS, Rates, Work

# GPU classes: peaks times these efficiencies, each an assumption with its source until published calibration
# figures (``GpuConstants``) or a run on the class replace it.
TRAINING_MFU = 0.40  # dense training MFU on H100 BF16, 40-46% for 7B-70B (MosaicML llm-foundry throughput tables)
DECODE_MBU = 0.70  # decode at 60-85% of peak bandwidth in good inference stacks (Databricks' MBU)
EAGER_LAYER_PASS_S = 20 * 7.5e-6  # eager: ~20 kernels a layer at 5-10 us a launch (launch-bound eager decode)
EAGER_ADAPTER_PASS_S = 4 * 7.5e-6  # a LoRA adapter: dropout, two matmuls, a scaled add
# vLLM replays CUDA graphs; its scheduler and sampler still take a few milliseconds a decode step (assumed,
# not measured by this suite yet: a GPU run's decode rows replace it)
ENGINE_STEP_S = 2e-3


@dataclass(frozen=True)
class GpuConstants:
    """What turns a GPU class's catalogued peaks into the time model's rates: the share of peak FLOP/s training
    reaches, the share of spec bandwidth decode reaches, and a vLLM decode step's own seconds; assumed, or fitted
    on the published calibration figures named (``benchmarks.model.time.calibration``)."""

    training_mfu: float = TRAINING_MFU
    decode_mbu: float = DECODE_MBU
    engine_step_s: float = ENGINE_STEP_S
    expert_mfu: float = TRAINING_MFU  # a MoE's routed experts in training (assumed as the dense share until fitted)
    fitted_on: tuple[str, ...] = ()

    def words(self) -> str:
        """The basis of every GPU figure, for the tables and the answers."""
        if not self.fitted_on:
            return GPU_ASSUMPTIONS
        said = lambda share: "assumed" if share == TRAINING_MFU else "fitted"  # noqa: E731
        return (
            f"fitted on {len(self.fitted_on)} published calibration figures (results/tables/published.md): "
            f"{self.decode_mbu:.0%} of spec bandwidth and {self.engine_step_s * 1e3:.3g} ms a vLLM decode step; "
            f"training at {self.training_mfu:.0%} of peak bf16 FLOP/s ({said(self.training_mfu)}), a mixture of "
            f"experts' routed experts at {self.expert_mfu:.0%} ({said(self.expert_mfu)}); {COLLECTIVE_S * 1e6:g} us "
            "a tensor-parallel all-reduce and links at their spec (assumed)"
        )


# A tensor-parallel all-reduce of a decode step's few kilobytes is bound by latency, not bytes: NCCL's and vLLM's
# custom all-reduce take some microseconds within an NVLink machine (assumed, as the others, until fitted)
COLLECTIVE_S = 10e-6
GPU_ASSUMPTIONS = (
    f"assumed: {TRAINING_MFU:.0%} of peak bf16 FLOP/s (MosaicML llm-foundry MFU), {DECODE_MBU:.0%} of spec "
    f"bandwidth (Databricks MBU), {ENGINE_STEP_S * 1e3:g} ms a vLLM decode step, {COLLECTIVE_S * 1e6:g} us a "
    "tensor-parallel all-reduce, links at their spec"
)
ASSUMED = GpuConstants()


def gpu_rates(
    hardware: Hardware, constants: GpuConstants, decode_gb_s: float | None = None, reward_s: float = 0.0
) -> Rates:
    """A GPU class's rates from its catalogued peaks at ``constants``; ``decode_gb_s`` replaces its bandwidth (DGX
    Spark's 180-192 GB/s budget)."""
    if not (hardware.peak_bf16_tflops and hardware.spec_bandwidth_gb_s and hardware.host_link_gb_s):
        raise ValueError(f"{hardware.name}: no peak FLOP/s, bandwidth or host link in profiles/hardware.toml")
    c = constants
    gb_s = decode_gb_s or c.decode_mbu * hardware.spec_bandwidth_gb_s
    basis = f"{decode_gb_s:g} GB/s" if decode_gb_s else c.words()
    return Rates(
        flop_s=c.training_mfu * hardware.peak_bf16_tflops * 1e12,
        expert_flop_s=c.expert_mfu * hardware.peak_bf16_tflops * 1e12,
        bytes_s=gb_s * 1e9,
        layer_pass_s=EAGER_LAYER_PASS_S,
        adapter_pass_s=EAGER_ADAPTER_PASS_S,
        engine_step_s=c.engine_step_s,
        link_bytes_s=(hardware.gpu_link_gb_s or hardware.host_link_gb_s) * 1e9,
        network_bytes_s=(hardware.node_link_gb_s or hardware.host_link_gb_s) * 1e9,
        collective_s=COLLECTIVE_S,
        host_bytes_s=hardware.host_link_gb_s * 1e9,
        quantised_param_s=0.0,  # bitsandbytes' fused CUDA kernels: within the bytes
        faulted_bytes_s=float("inf"),  # a CPU's heap only
        reward_s=reward_s,
        device_bytes=hardware.memory_gib * GIB,
        source=f"{hardware.name}: {basis}",
    )


# The machine at hand: each rate is a calibration figure times a fitted coefficient.
@dataclass(frozen=True)
class Coefficients:
    """Fitted on one run: how the phases' work relates to the calibration's fixed work. Each is the
    seconds of its work per unit of the calibration's (1 / efficiency for FLOPs and bytes)."""

    flops: float  # per second of the calibration's matmuls
    bytes: float  # per second of streaming at the probe's bandwidth
    layer_passes: float  # per pass, in calibration Python workloads
    adapter_passes: float  # per pass, in calibration Python workloads
    engine_steps: float  # per vLLM step, in calibration Python workloads
    link_bytes: float  # per second of streaming at the probe's bandwidth
    quantised_params: float  # per parameter, in the calibration's matmul FLOPs
    faulted_bytes: float  # per second of streaming at the probe's bandwidth
    fitted_on: str = ""


FITTED = (
    "flops",
    "bytes",
    "layer_passes",
    "adapter_passes",
    "engine_steps",
    "link_bytes",
    "quantised_params",
    "faulted_bytes",
)


def calibration_units(work: Work, torch_s: float, python_s: float, gb_s: float, sharing: int = 1) -> np.ndarray:
    """``work`` as seconds of the calibration's own kinds of work, in ``FITTED`` order; ``sharing``: ranks that
    split the machine's cores (the calibration's matmuls ran on all of them)."""
    matmul_s = torch_s * sharing / CALIBRATION_FLOPS
    decode_flops = sum(steps * flops for steps, flops, _ in work.roofline)  # added, as ``measured_rates`` adds them
    decode_bytes = sum(steps * nbytes for steps, _, nbytes in work.roofline)
    return np.array(
        [
            (work.flops + work.expert_flops + decode_flops) * matmul_s,
            (work.bytes + decode_bytes) / (gb_s * 1e9),
            work.layer_passes * python_s,
            work.adapter_passes * python_s,
            work.engine_steps * python_s,
            (work.link_bytes + work.network_bytes) / (gb_s * 1e9),
            work.quantised_params * matmul_s,
            work.faulted_bytes / (gb_s * 1e9),
        ]
    )


def measured_rates(
    coefficients: Coefficients, torch_s: float, python_s: float, gb_s: float, sharing: int = 1, reward_s: float = 0.0
) -> Rates:
    """The rates of one rank on a machine with this calibration, ``sharing`` its cores with as many ranks."""
    c = coefficients
    matmul_s = torch_s * sharing / CALIBRATION_FLOPS
    return Rates(
        flop_s=1 / (c.flops * matmul_s),
        expert_flop_s=1 / (c.flops * matmul_s),  # a CPU's matmuls alike, experts or not
        bytes_s=gb_s * 1e9 / c.bytes,
        overlapped=False,
        layer_pass_s=c.layer_passes * python_s,
        adapter_pass_s=c.adapter_passes * python_s,
        engine_step_s=c.engine_steps * python_s,
        link_bytes_s=gb_s * 1e9 / c.link_bytes if c.link_bytes else float("inf"),
        network_bytes_s=gb_s * 1e9 / c.link_bytes if c.link_bytes else float("inf"),
        host_bytes_s=gb_s * 1e9,
        quantised_param_s=c.quantised_params * matmul_s,
        faulted_bytes_s=gb_s * 1e9 / c.faulted_bytes if c.faulted_bytes else float("inf"),
        reward_s=reward_s,
        source=f"this machine's calibration x coefficients fitted on {c.fitted_on}",
    )


def fit(rows: list[tuple[np.ndarray, float]], fitted_on: str) -> Coefficients:
    """Non-negative coefficients minimising the relative error over ``rows`` (each a phase's work in
    calibration units and its measured seconds): every subset of coefficients solved by least squares,
    the best whose solution is non-negative. A coefficient no row exercises stays 0."""
    units = np.array([u for u, _ in rows])
    seconds = np.array([s for _, s in rows])
    weighted = units / seconds[:, None]  # relative error: each row scaled by its measured seconds
    used = [i for i in range(units.shape[1]) if units[:, i].any()]
    best, best_residual = np.zeros(units.shape[1]), float("inf")
    for size in range(1, len(used) + 1):
        for subset in itertools.combinations(used, size):
            solution, *_ = np.linalg.lstsq(weighted[:, subset], np.ones(len(rows)), rcond=None)
            if (solution < 0).any():
                continue
            full = np.zeros(units.shape[1])
            full[list(subset)] = solution
            residual = float(np.sum((weighted @ full - 1) ** 2))
            if residual < best_residual:
                best, best_residual = full, residual
    return Coefficients(*best, fitted_on=fitted_on)
