"""How a configuration's ranks are started: one process, or ``accelerate launch`` from a config
generated from its levers.

The accelerate config starts from the one TRL ships for the distributed type (``trl/accelerate_configs``:
``multi_gpu.yaml``, ``zero1/2/3.yaml``, ``fsdp2.yaml``) with the levers written over it: processes and
machines, CPU or CUDA, precision, and for DeepSpeed a DeepSpeed config of its own (ZeRO stage,
optimizer and parameter offload; TRL's files leave the rest to "auto", which transformers fills
from the ``GRPOConfig``). What a launcher really ran is checked by every rank (``worker.distribution``),
not assumed from these files.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from benchmarks.catalog.levers import Levers

# accelerate's own names for what each lever value asks of it, and the TRL config it starts from.
TRL_CONFIGS = {
    "ddp": "multi_gpu.yaml",
    "zero1": "zero1.yaml",
    "zero2": "zero2.yaml",
    "zero3": "zero3.yaml",
    "fsdp2": "fsdp2.yaml",
}


@dataclass(frozen=True)
class Rendezvous:
    """Where this launcher runs among the configuration's machines (accelerate's multi-machine flags)."""

    machine_rank: int
    main_process_ip: str
    main_process_port: int


def cpu_skip_reason(levers: Levers) -> str | None:
    """Why this distributed type cannot really run on a machine with no GPU, or None."""
    if levers.distributed_type == "fsdp2" and levers.num_processes * levers.num_machines > 1:
        return (
            "FSDP2 through accelerate on a CPU runs as plain DDP or as independent one-rank runs, exiting 0 "
            "(seen with accelerate 1.15 and TRL 1.16); accelerate's FSDP path needs GPUs"
        )
    return None


def deepspeed_config(levers: Levers) -> dict[str, Any]:
    """DeepSpeed's config for a ZeRO lever: the stage and offload devices from the levers, everything
    else "auto" for transformers to fill from the trainer's arguments, as TRL's configs leave it."""
    stage = int(levers.distributed_type[-1])
    zero: dict[str, Any] = {
        "stage": stage,
        "offload_optimizer": {"device": levers.offload_optimizer_device},
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if stage == 3:
        zero |= {
            "offload_param": {"device": levers.offload_param_device},
            "stage3_prefetch_bucket_size": "auto",
            # DeepSpeed's "auto" keeps parameters under 10 x hidden elements whole on every rank (norms,
            # biases): 0 partitions every one, so that a rank holds 1/N of the model, as ZeRO-3 says.
            "stage3_param_persistence_threshold": 0,
            # DeepSpeed's defaults (1e9 elements each) are sized for models far past a billion parameters:
            # below that they keep the whole model gathered through forward and backward, and make the
            # fp32 partition one tensor that each of AdamW's temporaries copies whole. A tenth of that
            # keeps ZeRO-3 partitioned on the small shapes too (0.5B in fp32 on 2 ranks here: a rank peaked
            # at 9.55 GiB with these, results/runs/cpu/20261130T200906Z-distributed.json; the defaults were
            # tried only before the harness counted a fork's shared pages once, so no like figure for
            # them); on large models it changes only how many pieces each is done in.
            "stage3_max_live_parameters": 100_000_000,
            "stage3_max_reuse_distance": 100_000_000,
            "sub_group_size": 100_000_000,
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "zero_allow_untested_optimizer": True,  # bitsandbytes' 8-bit AdamW under ZeRO
    }


def accelerate_config(
    levers: Levers, dtype: str, cuda: bool, place: Rendezvous, deepspeed_file: Path | None
) -> dict[str, Any]:
    """TRL's shipped accelerate config for the lever's distributed type with the levers over it."""
    import yaml  # accelerate's and transformers' dependency: only a launch with many ranks reads it

    kind = levers.distributed_type
    config = yaml.safe_load((resources.files("trl") / "accelerate_configs" / TRL_CONFIGS[kind]).read_text())
    config |= {
        "num_processes": levers.num_processes * levers.num_machines,  # accelerate counts every machine's
        "num_machines": levers.num_machines,
        "machine_rank": place.machine_rank,
        "main_process_ip": place.main_process_ip,
        "main_process_port": place.main_process_port,
        "use_cpu": not cuda,
        "mixed_precision": "bf16" if dtype == "bfloat16" and cuda else "no",
    }
    if levers.num_machines > 1:
        config |= {"rdzv_backend": "c10d", "same_network": True}
    if kind.startswith("zero"):  # precision then comes from DeepSpeed's file ("auto": the trainer's bf16/fp16)
        del config["mixed_precision"]
        config["deepspeed_config"] = {
            "deepspeed_config_file": str(deepspeed_file),
            "zero3_init_flag": kind == "zero3",
            "deepspeed_multinode_launcher": "standard",
        }
    return config


def command(
    levers: Levers, dtype: str, cuda: bool, place: Rendezvous, job_path: Path, python: str = sys.executable
) -> tuple[list[str], dict[str, Any] | None]:
    """The command line that starts every rank of this machine, and the accelerate config it uses
    (None: one process, no launcher). Configs are written beside ``job_path``."""
    worker = ["-m", "benchmarks.run.grpo.worker", str(job_path)]
    if levers.distributed_type == "no":
        return [python, *worker], None
    deepspeed_file = None
    if levers.distributed_type.startswith("zero"):
        deepspeed_file = job_path.with_name("deepspeed.json")
        deepspeed_file.write_text(json.dumps(deepspeed_config(levers), indent=1))
    config = accelerate_config(levers, dtype, cuda, place, deepspeed_file)
    config_file = job_path.with_name("accelerate.json")
    config_file.write_text(json.dumps(config, indent=1))
    launcher = [python, "-m", "accelerate.commands.launch", "--config_file", str(config_file)]
    if deepspeed_file is not None:  # the record holds DeepSpeed's config itself, not a path of this machine
        config = {
            **config,
            "deepspeed_config": {**config["deepspeed_config"], "deepspeed_config_file": deepspeed_config(levers)},
        }
    return [*launcher, *worker], config
