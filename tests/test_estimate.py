"""The analytic model over many GPUs: per-rank model states against DeepSpeed's own estimators, and
`estimate` answering how many GPUs a size class needs."""

import dataclasses

import pytest

from benchmarks.catalog.profiles import Levers, load_hardware, load_shapes
from benchmarks.cli import main
from benchmarks.model.memory.placement import on_gpus
from benchmarks.model.memory.predict import GIB, Workload, estimate
from benchmarks.model.memory.sharding import largest_layer_params, rank_model_states

SHAPES = ("0.5b", "7b", "14b", "32b", "70b", "72b")


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("gpus, machines", [(1, 1), (2, 1), (8, 1), (8, 4), (8, 8)])
def test_per_rank_model_states_agree_with_deepspeed_s_estimators(name, gpus, machines):
    stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    shape = load_shapes()[name]
    total, largest = shape.param_count(), largest_layer_params(shape)
    ranks = {"num_processes": gpus, "num_machines": machines}
    for offload in (False, True):
        device = "cpu" if offload else "none"
        zero2 = rank_model_states(
            shape, "bfloat16", Levers(distributed_type="zero2", offload_optimizer_device=device, **ranks)
        )
        _, expected = stage_1_and_2.estimate_zero2_model_states_mem_needs(
            total, num_gpus_per_node=gpus, num_nodes=machines, cpu_offload=offload
        )
        assert zero2.total + zero2.fp32_gradients == pytest.approx(expected, rel=0.05), ("zero2", offload)
    for optimizer, parameters in ((False, False), (True, False), (True, True)):  # ZeRO-3's offloads, each way
        devices = {"offload_optimizer_device": "cpu" if optimizer else "none",
                   "offload_param_device": "cpu" if parameters else "none"}  # fmt: skip
        zero3 = rank_model_states(shape, "bfloat16", Levers(distributed_type="zero3", **devices, **ranks))
        _, expected, _ = stage3.estimate_zero3_model_states_mem_needs(
            total, largest, num_gpus_per_node=gpus, num_nodes=machines, cpu_offload=optimizer,
            cpu_offload_params=parameters,
        )  # fmt: skip
        assert zero3.total + zero3.gathered == pytest.approx(expected, rel=0.05), ("zero3", optimizer, parameters)


def test_each_zero_stage_holds_less_per_rank_and_more_ranks_hold_less():
    shape = load_shapes()["32b"]

    def held(kind: str, gpus: int) -> int:
        states = rank_model_states(shape, "bfloat16", Levers(distributed_type=kind, num_processes=gpus))
        return states.total + states.fp32_gradients

    for gpus in (2, 8):  # DeepSpeed's mixed precision: 16-bit weights over an fp32 master
        assert held("zero1", gpus) > held("zero2", gpus) > held("zero3", gpus)
    # DDP of a bf16 model keeps AdamW's states in bf16 and no master: 8 B/param, which ZeRO-3 passes at 3 ranks
    assert held("ddp", 2) < held("zero3", 2) and held("ddp", 4) > held("zero3", 4)
    assert held("zero3", 2) > held("zero3", 4) > held("zero3", 8)
    assert held("ddp", 2) == held("ddp", 8)  # DDP replicates everything
    lora = rank_model_states(shape, "bfloat16", Levers(distributed_type="zero3", num_processes=8, model="lora"))
    assert lora.total < held("zero3", 8) / 4  # adapters' states only, the base partitioned


def test_on_gpus_fills_machines_of_eight_and_splits_the_colocated_engine_over_them():
    levers = on_gpus(Levers(use_vllm=True), 32)
    assert (levers.num_processes, levers.num_machines, levers.distributed_type) == (8, 4, "zero3")
    assert levers.vllm_tensor_parallel_size == 8 and levers.world_size == 32
    assert on_gpus(Levers(distributed_type="zero2"), 4).distributed_type == "zero2"
    assert dataclasses.astuple(on_gpus(Levers(), 1)) == dataclasses.astuple(Levers())


def test_estimate_answers_how_many_gpus_a_size_class_needs(capsys):
    levers = "gradient_checkpointing=true,optim=adamw_8bit,use_vllm=true,vllm_enable_sleep_mode=true"
    assert main(["estimate", "--shape", "32b", "--hardware", "h100", "--levers", levers]) == 1
    single = capsys.readouterr().out
    assert "on 1 x NVIDIA H100" in single and "\ndoes NOT fit (predicted): " in single
    assert "the smallest change that fits: more GPUs: " in single and "no time or cost: it does not fit" in single
    assert "time per step" not in single
    assert main(["estimate", "--shape", "32b", "--hardware", "h100", "--levers", levers, "--min-gpus"]) == 0
    out = capsys.readouterr().out
    count = int(out.split(" x NVIDIA")[0].rsplit(" ", 1)[-1])
    assert count > 1 and "\nfits (predicted): peak" in out and "of 79.65 GiB per GPU" in out
    # one statement of the step, the guide's, and each rank's share of it
    assert "the step: 1,000 steps of 1 prompt(s) x 8 completions = 8 a step, 256-token prompts, completions of up to " \
        "1024 tokens" in out  # fmt: skip
    assert f"per rank: {8 // count} completions a step" in out and f"on each of {count} ranks" in out


def test_estimate_states_the_workload_and_only_the_levers_that_differ_from_the_defaults(capsys):
    levers = "num_generations=4,per_device_train_batch_size=8,max_completion_length=32"
    assert main(["estimate", "--shape", "0.5b", "--hardware", "h100", "--levers", levers]) == 0
    out = capsys.readouterr().out
    assert "the step: 1,000 steps of 2 prompt(s) x 4 completions = 8 a step, 256-token prompts, completions of up to " \
        "32 tokens" in out  # fmt: skip
    assert "per rank: 8 completions a step, micro-batches of 8 x gradient_accumulation_steps 1\n" in out
    assert "Levers(" not in out
    assert "levers beside the defaults: num_generations=4, max_completion_length=32\n" in out


def test_levers_accept_true_in_either_case_merge_when_repeated_and_refuse_two_values(capsys):
    assert main(["estimate", "--shape", "0.5b", "--hardware", "h100", "--levers", "model=lora",
                 "--levers", "gradient_checkpointing=True"]) == 0  # fmt: skip
    assert "levers beside the defaults: gradient_checkpointing=true, model=lora\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["estimate", "--shape", "0.5b", "--hardware", "h100", "--levers", "model=lora", "--levers", "model=full"])
    assert "--levers: model given twice, as 'lora' and 'full'" in capsys.readouterr().err


def test_seven_b_lora_on_a_24gb_card_says_why_not_and_what_would_fit_and_exits_non_zero(capsys):
    assert main(["estimate", "--shape", "7b", "--hardware", "rtx4090", "--levers", "model=lora"]) == 1
    out = capsys.readouterr().out
    assert "the binding term is activations" in out
    # the guide's 8 completions spread over more ranks: each holds fewer completions' activations
    assert "activations shrinks with more GPUs: 9.27 GiB per GPU on 8" in out
    change = out.split("the smallest change that fits: ")[1]
    assert change.startswith("more GPUs: 8 x NVIDIA GeForce RTX 4090, LoRA") and "{" not in out  # no Python dict
    assert main(["estimate", "--shape", "7b", "--hardware", "rtx4090", "--levers", "model=lora", "--min-gpus"]) == 0
    assert "on 8 x NVIDIA GeForce RTX 4090" in capsys.readouterr().out
    more = ["--global-batch", "512", "--levers", "per_device_train_batch_size=8"]  # micro-batches of 8 however many
    assert main(["estimate", "--shape", "7b", "--hardware", "rtx4090", "--levers", "model=lora", *more]) == 1
    out = capsys.readouterr().out
    assert "activations does not shrink with more GPUs" in out
    assert out.split("the smallest change that fits: ")[1].startswith("gradient_checkpointing=true: ")


def test_min_gpus_says_when_the_global_batch_not_memory_ends_the_search(capsys):
    """The guide's batch of 8 splits over at most 8 ranks: the search stops there, and ZeRO-3's optimizer states,
    which it shards, are not called a rank's own."""
    levers = "model=full,distributed_type=zero3,gradient_checkpointing=true"
    asked = ["estimate", "--shape", "32b", "--hardware", "h100", "--min-gpus", "--levers", levers]
    assert main(asked) == 1
    out = capsys.readouterr().out
    assert "any count up to 64" not in out and "does not fit any count up to 8 x" in out
    assert "the global batch of 8 completions, not memory, bounds the search at 8 GPUs" in out
    assert "--global-batch 64 lets it go on to 64" in out
    assert "optimizer_state shrinks with more GPUs" in out and "each rank holds its own" not in out
    assert main([*asked, "--global-batch", "256"]) == 0  # the batch that goes on finds a count
    assert "32b (32.76B params, bfloat16) on 16 x" in capsys.readouterr().out


def test_a_hint_names_the_configuration_that_results_in_words_not_a_ladder_label(capsys):
    assert main(["estimate", "--shape", "70b", "--hardware", "h200", "--levers", "model=qlora"]) == 1
    out = capsys.readouterr().out
    change = out.split("the smallest change that fits: ")[1].splitlines()[0]
    assert change.startswith("more GPUs: 4 x NVIDIA H200, QLoRA, ")  # the user's QLoRA, kept
    assert "{" not in out and ", full," not in change


def test_adamw_s_update_holds_one_temporary_a_parameter_on_cuda_two_of_the_largest_on_a_cpu_and_none_fused():
    shape, work = load_shapes()["0.5b"], Workload(1, 256, 256)
    full = Levers(model="full")
    params = shape.param_count()

    def update(levers: Levers, hardware: str) -> int:
        training = estimate(shape, "float32", levers, work, load_hardware()[hardware]).phases["training"]
        return training["optimizer_update"]

    # torch's foreach AdamW: _foreach_sqrt(exp_avg_sqs) for every parameter at once, then in place
    assert update(full, "h100") == params * 4
    assert update(dataclasses.replace(full, optim="adamw_torch_fused"), "h100") == 0
    # one parameter at a time: sqrt() and its quotient, the largest parameter (the embedding) twice
    largest = shape.vocab_size * shape.hidden_size
    assert update(full, "cpu") <= 2 * largest * 4 < params * 4


def test_an_offloaded_optimizer_steps_on_the_host_so_its_update_takes_no_gpu_memory():
    shape, work = load_shapes()["32b"], Workload(1, 256, 1024)
    zero3 = Levers(model="full", num_processes=8, distributed_type="zero3", gradient_checkpointing=True)
    offloaded = dataclasses.replace(zero3, offload_optimizer_device="cpu", offload_param_device="cpu")
    on_gpu = estimate(shape, "bfloat16", zero3, work, load_hardware()["h100"]).phases["training"]
    on_host = estimate(shape, "bfloat16", offloaded, work, load_hardware()["h100"]).phases["training"]
    assert on_gpu["optimizer_update"] > 0 == on_host["optimizer_update"]
    assert on_host["optimizer_state"] < 0.01 * on_gpu["optimizer_state"]  # the states went to the host too


def test_a_zero3_rank_of_a_large_model_holds_a_fraction_of_one_gpu_s_states():
    shape = load_shapes()["70b"]
    one = rank_model_states(shape, "bfloat16", Levers())
    eight = rank_model_states(shape, "bfloat16", Levers(distributed_type="zero3", num_processes=8))
    params = shape.param_count()
    assert one.total == pytest.approx(8 * params, rel=0.01)  # bf16 weights, gradients and AdamW states
    assert eight.total == pytest.approx(18 * params / 8, rel=0.01)  # DeepSpeed: 18 B/param over the ranks
    assert eight.total / GIB < 160 < one.total / GIB


def test_a_moe_keeps_every_expert_resident_but_runs_few_per_token():
    from benchmarks.model.memory.predict import layer_activation_bytes, lora_params, qlora_weight_bytes

    moe, dense = load_shapes()["qwen3-30b-a3b"], load_shapes()["32b"]
    states = rank_model_states(moe, "bfloat16", Levers())
    assert states.parameters == moe.param_count() * 2  # all 128 experts in memory
    assert layer_activation_bytes(moe, 2, lora=False) < layer_activation_bytes(dense, 2, lora=False)
    # LoRA "all-linear" reaches a MoE's attention only: its experts are 3-D tensors, not linears
    assert lora_params(moe, 16) == 48 * 16 * (2048 + 4096 + 2 * (2048 + 512) + 4096 + 2048)
    # bitsandbytes quantizes linears: the experts stay 16-bit, most of the model
    assert qlora_weight_bytes(moe, 2) > 0.8 * moe.param_count() * 2
    assert largest_layer_params(moe) == 128 * 3 * 2048 * 768  # one layer's experts, one module


def test_gradient_accumulation_grows_the_rollout_not_the_micro_batch():
    from benchmarks.catalog.profiles import load_hardware
    from benchmarks.model.memory.predict import Workload, estimate

    shape, h100 = load_shapes()["7b"], load_hardware()["h100"]
    one = Levers(num_generations=8, per_device_train_batch_size=8, max_completion_length=512)
    four = dataclasses.replace(one, gradient_accumulation_steps=4)
    assert Workload.from_levers(four, 256).rollout_sequences == 32 and Workload.from_levers(four, 256).completions == 8
    single, accumulated = (estimate(shape, "bfloat16", lv, Workload.from_levers(lv, 256), h100) for lv in (one, four))
    assert accumulated.phases["rollout"]["kv_cache"] == 4 * single.phases["rollout"]["kv_cache"]
    assert accumulated.phases["training"]["activations"] == single.phases["training"]["activations"]


def test_unsloth_s_gpu_path_shares_its_engine_s_weights_and_offloads_its_checkpoints():
    from benchmarks.catalog.profiles import load_hardware
    from benchmarks.model.memory.predict import Workload, estimate

    shape, h100, cpu = load_shapes()["8b"], load_hardware()["h100"], load_hardware()["cpu"]
    levers = Levers(
        model="lora", gradient_checkpointing=True, use_vllm=True, vllm_gpu_memory_utilization=0.5,
        num_generations=8, per_device_train_batch_size=8, max_completion_length=4096,
    )  # fmt: skip
    work = Workload.from_levers(levers, 256)
    trl, unsloth = (estimate(shape, "bfloat16", levers, work, h100, path) for path in ("trl-tiled", "unsloth-gpu"))
    engine_weights = shape.param_count() * 2
    assert trl.phases["rollout"]["vllm"] - unsloth.phases["rollout"]["vllm"] == engine_weights  # counted once
    assert unsloth.phases["training"]["activations"] < trl.phases["training"]["activations"]  # inputs on the host
    assert unsloth.peak < trl.peak
    # no GPU, no offload: Unsloth's CPU backend keeps its checkpoints where they are
    on_cpu = estimate(shape, "bfloat16", levers, work, cpu, "unsloth-gpu")
    assert (
        on_cpu.phases["training"]["activations"]
        == estimate(shape, "bfloat16", levers, work, cpu).phases["training"]["activations"]
    )


LEVER_SHAPES = ("0.5b", "7b", "32b", "72b", "qwen3-30b-a3b", "gpt-oss-20b")


@pytest.mark.parametrize("name", LEVER_SHAPES)
def test_every_lever_moves_memory_the_way_the_physics_says(name):
    from benchmarks.catalog.profiles import load_hardware
    from benchmarks.model.memory.predict import Workload, estimate

    shape, h200 = load_shapes()[name], load_hardware()["h200"]
    base = Levers(num_generations=8, per_device_train_batch_size=8, max_completion_length=1024, use_vllm=True)

    def peak(phase: str = "training", **change) -> int:
        levers = dataclasses.replace(base, **change)
        return estimate(shape, "bfloat16", levers, Workload.from_levers(levers, 256), h200).total(phase)

    def term(term: str, phase: str = "training", **change) -> int:
        levers = dataclasses.replace(base, **change)
        return estimate(shape, "bfloat16", levers, Workload.from_levers(levers, 256), h200).phases[phase].get(term, 0)

    assert term("activations", gradient_checkpointing=True) < term("activations")  # recompute keeps less
    assert term("optimizer_state", optim="adamw_8bit") < term("optimizer_state")  # 8-bit states
    assert term("optimizer_state", model="lora") < term("optimizer_state")  # adapters' states only
    assert term("gradients", model="lora") < term("gradients")
    assert term("weights", model="qlora") < term("weights", model="lora")  # a 4-bit base
    assert peak(vllm_enable_sleep_mode=True) < peak()  # the engine leaves the device outside the rollout
    assert peak(beta=0.04) > peak()  # a reference copy without PEFT
    assert peak(beta=0.04, model="lora") == peak(model="lora")  # PEFT's reference is the base, adapters off
    assert peak(max_completion_length=2048) > peak()  # longer completions, more of everything per token
    for kind in ("zero1", "zero2", "zero3"):  # more ranks never hold more per rank
        two, eight = (peak(distributed_type=kind, num_processes=n) for n in (2, 8))
        assert eight <= two, kind


@pytest.mark.parametrize("distributed_type", ["zero2", "zero3"])
def test_a_deepspeed_rank_on_a_cpu_carries_its_whole_gradient_as_a_transient_and_on_cuda_does_not(distributed_type):
    from benchmarks.catalog.profiles import load_hardware
    from benchmarks.model.memory.predict import CPU_DEEPSPEED_TRANSIENT_GRADIENTS, Workload, estimate

    shape = load_shapes()["0.5b"]
    levers = Levers(distributed_type=distributed_type, num_processes=2)
    work = Workload.from_levers(levers, 16)
    on_cpu = estimate(shape, "float32", levers, work, load_hardware()["cpu"])
    transient = on_cpu.phases["training"]["cpu_transient_gradients"]
    assert transient == int(CPU_DEEPSPEED_TRANSIENT_GRADIENTS * shape.param_count() * 4)
    assert "cpu_transient_gradients" not in on_cpu.phases["rollout"]
    on_cuda = estimate(shape, "float32", levers, work, load_hardware()["h100"])
    assert "cpu_transient_gradients" not in on_cuda.phases["training"]
    lora = estimate(shape, "float32", dataclasses.replace(levers, model="lora"), work, load_hardware()["cpu"])
    assert lora.phases["training"]["cpu_transient_gradients"] < transient / 50  # the adapters' gradient only
    alone = estimate(shape, "float32", Levers(), work, load_hardware()["cpu"])
    assert "cpu_transient_gradients" not in alone.phases["training"]


@pytest.mark.parametrize("name", ["0.5b", "1.5b", "7b", "8b", "32b", "70b", "72b"])
def test_lora_keeps_less_than_full_fine_tuning_in_fp32_and_at_most_a_third_more_in_16_bit(name):
    """Dense shapes (what autograd was counted on); a MoE's frozen experts keep nothing under LoRA."""
    from benchmarks.model.memory.predict import layer_activation_bytes

    shape = load_shapes()[name]
    assert layer_activation_bytes(shape, 4, lora=True) < layer_activation_bytes(shape, 4, lora=False)
    full = layer_activation_bytes(shape, 2, lora=False)
    assert full < layer_activation_bytes(shape, 2, lora=True, autocast=True) < 1.34 * full


def test_trl_s_weight_sync_under_zero3_gathers_the_whole_model_with_lora_and_one_parameter_without(capsys):
    """TRL 1.16 merges LoRA into a model it gathers whole on every rank (generation/vllm_generation.py), and syncs a
    full model one parameter at a time; the sync's peak sits in the rollout phase."""
    shape, hardware = load_shapes()["14b"], load_hardware()["h100"]
    work = Workload.from_levers(Levers(), 256)
    base = dict(distributed_type="zero3", num_processes=8, use_vllm=True, vllm_tensor_parallel_size=8)
    lora = estimate(shape, "bfloat16", Levers(model="lora", **base), work, hardware)
    partition = lora.phases["rollout"]["weights"]
    assert lora.phases["rollout"]["sync_gather"] == pytest.approx(7 * partition, rel=0.01)
    full = estimate(shape, "bfloat16", Levers(**base), work, hardware)
    largest = largest_layer_params(shape) * 2
    assert full.phases["rollout"]["sync_gather"] == pytest.approx(largest * 7 / 8, rel=0.01)
    assert full.phases["rollout"]["sync_gather"] < partition
    asleep = estimate(shape, "bfloat16", Levers(model="lora", vllm_enable_sleep_mode=True, **base), work, hardware)
    assert asleep.phases["rollout"]["sync_gather"] < lora.phases["rollout"]["sync_gather"]  # its KV asleep then
    one = dict(base, num_processes=1, vllm_tensor_parallel_size=1)
    for unsharded in (dict(base, distributed_type="zero2"), one, dict(base, use_vllm=False)):
        assert "sync_gather" not in estimate(shape, "bfloat16", Levers(**unsharded), work, hardware).phases["rollout"]
    asked = "model=lora,distributed_type=zero3,use_vllm=true"
    main(["estimate", "--shape", "14b", "--hardware", "h100", "--gpus", "8", "--levers", asked])
    assert "sync_gather" in capsys.readouterr().out
