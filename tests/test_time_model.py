"""The time model: the work it counts per phase, its fit, its rates, and its figures in estimate and the tables."""

from dataclasses import replace

import numpy as np
import pytest
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import cli
from benchmarks.catalog.profiles import Levers, load_hardware, load_shapes
from benchmarks.model.memory import vllm_engine
from benchmarks.model.memory.predict import Workload
from benchmarks.model.time import calibration, engine_work, phase_seconds, schedule, work_rates
from benchmarks.model.time import rates as model_rates
from benchmarks.report import time_validation
from benchmarks.results import schema
from benchmarks.run.machine import pace

SHAPE = load_shapes()["0.5b"]
WORK = Workload(completions=8, prompt_tokens=256, completion_tokens=1024)
BASE = Levers(num_generations=8, per_device_train_batch_size=8, max_completion_length=1024)


def work_of(**levers):
    chosen = replace(BASE, **levers)
    return phase_seconds.phase_work(SHAPE, "bfloat16", chosen, Workload.from_levers(chosen, 256))


def test_the_calibration_flops_are_what_its_work_does():
    with FlopCounterMode(display=False) as counter:
        pace._torch_work()
    assert counter.get_total_flops() == work_rates.CALIBRATION_FLOPS


def test_checkpointing_adds_one_forward_and_lora_skips_the_weight_gradients():
    forward = work_of(beta=0.04)["logprob"].flops  # a reference forward over the same batch
    full = work_of()["forward_backward"].flops
    assert full == pytest.approx(3 * forward)
    assert work_of(gradient_checkpointing=True)["forward_backward"].flops == pytest.approx(4 * forward)
    assert work_of(model="lora")["forward_backward"].flops == pytest.approx(2 * forward)
    assert work_of(model="lora", gradient_checkpointing=True)["forward_backward"].flops == pytest.approx(3 * forward)


def test_a_moe_s_routed_experts_train_at_their_own_rate_and_a_dense_model_has_none():
    moe, dense = load_shapes()["qwen3-30b-a3b"], load_shapes()["8b"]
    forward = work_rates.forward_work(moe, 2, 4096)
    routed = moe.num_hidden_layers * moe.num_experts_per_tok * moe.expert_params()
    assert forward.expert_flops == 2 * routed * 2 * 4096  # 8 of 128 experts a token, not all of them
    matmuls = forward.flops + forward.expert_flops - work_rates.attention_flops(moe, 2, 4096)
    assert matmuls == pytest.approx(2 * work_rates.matmul_params(moe) * 2 * 4096)
    assert work_rates.forward_work(dense, 2, 4096).expert_flops == 0
    h100 = load_hardware()["h100"]
    fast, slow = (model_rates.gpu_rates(h100, model_rates.GpuConstants(expert_mfu=share)) for share in (0.4, 0.2))
    assert slow.seconds(forward) > fast.seconds(forward)
    assert slow.seconds(work_rates.forward_work(dense, 2, 4096)) == fast.seconds(
        work_rates.forward_work(dense, 2, 4096)
    )


def test_a_packed_micro_batch_trains_its_sequences_own_lengths_not_its_longest_times_their_count():
    levers = replace(BASE, per_device_train_batch_size=8, max_completion_length=1024)
    work = {}
    for packed in (False, True):
        workload = Workload.from_levers(levers, 256, mean_completion=200, packed=packed)
        work[packed] = phase_seconds.training_work(SHAPE, "bfloat16", levers, workload)["forward_backward"].flops
    assert work[True] == pytest.approx(3 * work_rates.forward_work(SHAPE, 8, 256 + 200).flops)
    longest = schedule.expected_longest(8, 1024, 200)  # TRL pads the 8 to their longest, some 540 tokens
    assert work[False] == pytest.approx(3 * work_rates.forward_work(SHAPE, 8, 256 + longest).flops)
    assert work[False] > 1.5 * work[True]
    one = replace(levers, per_device_train_batch_size=1)
    loads = [Workload.from_levers(one, 256, mean_completion=200, packed=p) for p in (False, True)]
    alone = [phase_seconds.training_work(SHAPE, "bfloat16", one, load) for load in loads]
    assert alone[0]["forward_backward"].flops == pytest.approx(alone[1]["forward_backward"].flops)


def test_a_server_runs_at_most_vllm_s_default_max_num_seqs_at_once_as_the_memory_model_sizes_it():
    levers = replace(BASE, use_vllm=True, vllm_mode="server", num_processes=8, per_device_train_batch_size=256)
    work = Workload.from_levers(levers, 256, mean_completion=300)
    engine = engine_work.engine_of(levers, work)
    assert engine.sequences == 8 * 256 and engine.held == vllm_engine.VLLM_DEFAULT_SEQS == 1024
    assert vllm_engine.engine_overheads(SHAPE, 2, levers).activations >= 1024 * SHAPE.vocab_size * 15  # its sampler
    unbounded = replace(engine, held=float("inf"))
    queued, at_once = (schedule.decode_schedule(e, 1024, 300)[0] for e in (engine, unbounded))
    assert queued.max() == 1024 and at_once.max() == 2048 and len(queued) > len(at_once)
    fewer = replace(levers, per_device_train_batch_size=64)  # 512 sequences: none wait
    small = engine_work.engine_of(fewer, Workload.from_levers(fewer, 256, mean_completion=300))
    assert small.sequences == 512 and small.held >= small.sequences


def test_estimate_says_when_a_server_s_max_num_seqs_queues_its_sequences(capsys):
    server = ["--levers", "use_vllm=true,vllm_mode=server", "--hardware", "h100", "--gpus", "8", "--shape", "0.5b"]
    cli.main(["estimate", *server, "--global-batch", "2048"])
    said = "the server runs at most vLLM's default max_num_seqs, 1024, of its 2048 sequences at once"
    assert said in capsys.readouterr().out
    cli.main(["estimate", *server, "--global-batch", "512"])
    assert "max_num_seqs" not in capsys.readouterr().out


def test_log_prob_forwards_come_with_vllm_and_with_a_reference():
    assert "logprob" not in work_of()
    one = work_of(use_vllm=True)["logprob"].flops
    assert work_of(beta=0.04)["logprob"].flops == pytest.approx(one)
    assert work_of(use_vllm=True, beta=0.04)["logprob"].flops == pytest.approx(2 * one)


def test_each_rollout_engine_pays_its_own_transfers():
    weights = SHAPE.param_count() * 2
    eager, colocated = work_of()["rollout"], work_of(use_vllm=True)["rollout"]
    assert (
        colocated.bytes - eager.bytes == pytest.approx(2 * weights)
        and eager.layer_passes
        and not colocated.layer_passes
    )
    assert work_of(use_vllm=True, vllm_mode="server")["rollout"].link_bytes == pytest.approx(weights)
    assert work_of(use_vllm=True, vllm_enable_sleep_mode=True)["sleep_wake"].host_bytes == pytest.approx(2 * weights)


def decoded_bytes(work: work_rates.Work) -> float:
    return sum(steps * nbytes for steps, _, nbytes in work.roofline)


def test_a_longer_completion_costs_more_decode_and_a_bigger_generation_batch_more_of_everything():
    short, long = work_of(max_completion_length=256), work_of()
    assert decoded_bytes(long["rollout"]) > 3.9 * decoded_bytes(short["rollout"])
    double = work_of(gradient_accumulation_steps=2)
    assert double["rollout"].flops == pytest.approx(2 * long["rollout"].flops)
    assert double["forward_backward"].flops == pytest.approx(2 * long["forward_backward"].flops)


def test_zero3_gathers_every_weight_for_each_micro_batch_again_for_backward_beyond_reuse_and_steps_inside_backward():
    def moved(shape, **levers):
        chosen = replace(BASE, num_processes=2, model="lora", **levers)
        return phase_seconds.phase_work(shape, "bfloat16", chosen, Workload.from_levers(chosen, 256))

    for shape in (SHAPE, load_shapes()["7b"]):
        half = shape.param_count() * 2 / 2  # each of 2 ranks gathers the other's half
        zero2, zero3 = moved(shape, distributed_type="zero2"), moved(shape, distributed_type="zero3")
        assert "optimizer" not in zero2 and 0 < zero2["forward_backward"].link_bytes < 0.05 * half  # adapters only
        again = phase_seconds.regathered_for_backward(shape)  # DeepSpeed keeps what it reuses within 1e9 parameters
        frozen = zero3["forward_backward"].link_bytes - zero2["forward_backward"].link_bytes
        assert frozen == pytest.approx((1 + again) * half, rel=0.05)  # the frozen base too
        four = moved(shape, distributed_type="zero3", gradient_accumulation_steps=4, per_device_train_batch_size=2)
        assert four["forward_backward"].link_bytes == pytest.approx(4 * zero3["forward_backward"].link_bytes)
        assert zero3["rollout"].link_bytes > 0 == zero2["rollout"].link_bytes  # gathered to generate
    assert (
        phase_seconds.regathered_for_backward(SHAPE)
        == 0
        < 0.9
        < phase_seconds.regathered_for_backward(load_shapes()["7b"])
    )


def test_the_fit_recovers_the_coefficients_that_made_the_rows():
    truth = model_rates.Coefficients(
        flops=1.5,
        bytes=3.0,
        layer_passes=0.01,
        adapter_passes=0.002,
        engine_steps=0.0,
        link_bytes=200.0,
        quantised_params=1500.0,
        faulted_bytes=6.0,
    )
    rates = model_rates.measured_rates(truth, torch_s=0.5, python_s=0.1, gb_s=20.0)
    rows = []
    for levers in ({}, {"model": "lora"}, {"gradient_checkpointing": True}, {"optim": "adamw_8bit"}, {"beta": 0.04}):
        chosen = replace(BASE, max_completion_length=64, **levers)
        for fixed in (False, True):
            phases = phase_seconds.phase_work(
                SHAPE, "bfloat16", chosen, Workload.from_levers(chosen, 256), malloc_fixed=fixed
            )
            for phase, work in phases.items():
                if phase != "reward":
                    rows.append((model_rates.calibration_units(work, 0.5, 0.1, 20.0), rates.seconds(work)))
    fitted = model_rates.fit(rows, "made here")
    for name in ("flops", "bytes", "layer_passes", "adapter_passes", "quantised_params", "faulted_bytes"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fitted.link_bytes == 0  # no row moved anything between ranks: left at 0, not guessed


def test_the_fit_keeps_every_coefficient_non_negative():
    rows = [(np.array([1.0, 1.0, 0, 0, 0, 0, 0, 0]), 1.0), (np.array([2.0, 0.5, 0, 0, 0, 0, 0, 0]), 1.0)]
    fitted = model_rates.fit(rows, "made here")
    assert min(fitted.flops, fitted.bytes) >= 0


def test_a_step_s_hours_and_throughput_follow_from_its_seconds():
    step = phase_seconds.StepTime({"rollout": 30.0, "forward_backward": 10.0}, completion_tokens=8192, gpus=4)
    assert step.step_s == 40 and step.rollout_share == 0.75
    assert step.tokens_per_s_per_gpu == pytest.approx(8192 / 40)
    assert step.gpu_hours(1000) == pytest.approx(40 * 1000 * 4 / 3600)


def test_a_class_without_peaks_has_no_fitted_rates():
    hardware = load_hardware()
    with pytest.raises(ValueError, match="no peak FLOP/s"):
        calibration.fitted_rates(hardware["gpu"])
    spark = calibration.fitted_rates(hardware["spark"], decode_gb_s=180.0)
    assert spark.bytes_s == 180e9 and "180 GB/s" in spark.source


def test_spark_at_its_budget_is_slower_than_an_h200_and_faster_at_192_than_180():
    hardware = load_hardware()
    lora = replace(BASE, model="lora", gradient_checkpointing=True, use_vllm=True)
    hours = {
        name: phase_seconds.step_time(SHAPE, "bfloat16", lora, WORK, rates).gpu_hours()
        for name, rates in {
            "180": calibration.fitted_rates(hardware["spark"], decode_gb_s=180.0),
            "192": calibration.fitted_rates(hardware["spark"], decode_gb_s=192.0),
            "h200": calibration.fitted_rates(hardware["h200"]),
        }.items()
    }
    assert hours["h200"] < hours["192"] < hours["180"]


def test_estimate_prints_seconds_throughput_gpu_hours_and_cost(capsys):
    cli.main(["estimate", "--shape", "8b", "--hardware", "h200", "--levers", "model=lora", "--price-per-gpu-hour", "4"])
    out = capsys.readouterr().out
    for text in ("time per step, per GPU", "forward_backward", "completion tokens/s per GPU", "GPU-hours for 1,000"):
        assert text in out
    assert "at 4 USD a GPU-hour" in out and "USD per million completion tokens" in out
    trained = f"training at {calibration.fitted().training_mfu:.0%} of peak bf16 FLOP/s (fitted)"
    assert "published calibration figures" in out and trained in out


def test_estimate_refuses_a_negative_price(capsys):
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--shape", "8b", "--hardware", "h200", "--price-per-gpu-hour", "-1"])
    assert "--price-per-gpu-hour must be at least 0" in capsys.readouterr().err


def test_the_time_model_meets_its_targets_on_the_committed_runs(committed_results):
    results = [r for r in schema.load_results(committed_results) if not r.quick and r.complete]
    checks = time_validation.validate_time(results)
    assert any(c.held_out for c in checks) and any(not c.held_out for c in checks)
    steps = {(c.held_out, name) for c in checks for name in [c.phase] if name == "step"}
    assert steps == {(False, "step"), (True, "step")}
    for claim, value, limit, met in time_validation.targets(checks):
        if claim.startswith("whole step"):
            assert met, f"{claim}: {value:.1%} against {limit:.0%}"


def test_a_run_without_a_calibration_is_named_as_not_scored(committed_results):
    results = schema.load_results(committed_results)
    unscored = time_validation.unscored(results)
    assert unscored and all("no calibration recorded" in line for line in unscored)


def test_a_missed_target_names_the_spread_between_repeats_on_alike_machines():
    def check(file, measured, machine, levers=BASE):
        return time_validation.TimeCheck(file, "base", "optimizer", 1.0, measured, 0.2, True, machine, levers)

    checks = [
        check("a.json", 0.2, (0.40, 0.10, 40.0)),
        check("b.json", 0.5, (0.42, 0.11, 44.0)),  # alike: a repeat
        check("c.json", 0.9, (0.80, 0.10, 40.0)),  # a slower machine: not a repeat
        check("d.json", 0.1, (0.40, 0.10, 40.0), replace(BASE, model="lora")),  # another configuration
    ]
    ratio, one, other = time_validation.repeat_spread(checks, "optimizer")
    assert ratio == pytest.approx(2.5) and {one.file, other.file} == {"a.json", "b.json"}
    assert time_validation.repeat_spread(checks, "rollout") is None


def test_estimate_on_this_cpu_uses_its_calibration_and_the_committed_fit(capsys):
    cli.main(["estimate", "--shape", "135m", "--hardware", "cpu", "--dtype", "float32", "--levers", "reward=execution"])
    out = capsys.readouterr().out
    assert "this machine's calibration x coefficients fitted on cpu/" in out
    assert "  reward " in out and "model.md's held-out time checks" in out


H100 = load_hardware()["h100"]
SEVEN_B = load_shapes()["7b"]


def colocated(sequences: int, tp: int = 1, **levers) -> Levers:
    return replace(BASE, use_vllm=True, per_device_train_batch_size=sequences, vllm_tensor_parallel_size=tp,
                   num_processes=tp, distributed_type="zero3" if tp > 1 else "no", **levers)  # fmt: skip


def rollout_s(levers: Levers, work: Workload | None = None, shape=SEVEN_B) -> float:
    work = work or Workload.from_levers(levers, 256)
    rates = calibration.fitted_rates(H100)
    return rates.seconds(phase_seconds.phase_work(shape, "bfloat16", levers, work)["rollout"])


def test_decode_throughput_rises_with_the_engine_s_sequences_until_compute_binds_then_flattens():
    rates = calibration.fitted_rates(H100)
    per_s = {}
    for batch in (1, 8, 64, 512, 2048, 4096):
        levers = colocated(batch)
        engine = engine_work.engine_of(levers, Workload.from_levers(levers, 256))
        decode = engine_work.decode_work(SEVEN_B, 2, engine, Workload.from_levers(levers, 1))
        per_s[batch] = batch * 1024 / rates.seconds(decode)
    assert per_s[1] < per_s[8] < per_s[64] < per_s[512]
    assert per_s[8] > 6 * per_s[1]  # bound by the weights: eight sequences for nearly the price of one
    assert per_s[4096] < 1.1 * per_s[2048]  # bound by FLOPs: more sequences, no more tokens a second


def test_a_tensor_parallel_2_engine_reads_half_the_weights_per_gpu_per_step():
    def weight_bytes_a_step(tp: int) -> float:
        levers = colocated(1, tp)
        work = Workload.from_levers(levers, 0, completion_tokens=1)
        engine = engine_work.engine_of(levers, work)
        (steps, _, nbytes), *_ = engine_work.decode_work(SEVEN_B, 2, engine, work).roofline
        return nbytes

    assert weight_bytes_a_step(2) == pytest.approx(weight_bytes_a_step(1) / 2, rel=0.01)


def test_the_longest_completion_decides_the_rollout_at_a_fixed_mean():
    levers = colocated(64, max_completion_length=4096)
    short_cap = Workload.from_levers(replace(levers, max_completion_length=1024), 256, mean_completion=512)
    long_cap = Workload.from_levers(levers, 256, mean_completion=512)
    assert rollout_s(levers, long_cap) > 1.2 * rollout_s(levers, short_cap)
    every_one_long = Workload.from_levers(levers, 256)
    assert rollout_s(levers, every_one_long) > rollout_s(levers, long_cap)  # the batch thins as completions end


def test_the_live_batch_thins_to_the_stated_mean():
    live = schedule.live_sequences(256, 4096, 700)
    assert live[0] == 256 and live[-1] == pytest.approx(1, abs=0.1) and len(live) <= 4096
    assert live.sum() / 256 == pytest.approx(700, rel=0.1)
    assert (schedule.live_sequences(8, 1024, 1024) == 8).all()


def test_a_running_sequence_is_half_the_longest_old_where_all_reach_it_and_its_scale_where_lengths_are_skewed():
    assert schedule.running_age(1024, 1024) == pytest.approx(512, abs=1)
    scale = schedule.exponential_scale(300, 8192)  # hardly cut: a running one is as old as the draws' scale
    assert schedule.running_age(8192, 300) == pytest.approx(scale, rel=0.02)


def test_sequences_beyond_what_the_engine_s_kv_cache_holds_wait_their_turn():
    levers = colocated(256, vllm_gpu_memory_utilization=0.25)
    work = Workload.from_levers(levers, 256)
    held = engine_work.kv_held(SEVEN_B, "bfloat16", levers, work, H100.memory_gib * 2**30)
    # 0.25 x 80 GiB less 14.2 GiB of weights and vLLM's own, over 56 KiB a token at 256 + 512 tokens each
    assert 90 < held < 140
    engine = engine_work.engine_of(levers, work, held)
    live, ages = schedule.decode_schedule(engine, 1024, 1024)
    assert live.max() == int(held) and live.sum() == pytest.approx(256 * 1024, rel=0.01)
    assert len(live) == pytest.approx(256 * 1024 / int(held), abs=2) and ages.max() == 1023
    whole = rollout_s(levers, work)
    # a card with memory enough that its 0.25 share holds every sequence: no bound; a little more memory: more held
    assert engine_work.kv_held(SEVEN_B, "bfloat16", levers, work, 2.5 * H100.memory_gib * 2**30) == float("inf")
    assert held < engine_work.kv_held(SEVEN_B, "bfloat16", levers, work, 1.2 * H100.memory_gib * 2**30) < 256
    phases = phase_seconds.phase_work(SEVEN_B, "bfloat16", levers, work, held=held)
    assert calibration.fitted_rates(H100).seconds(phases["rollout"]) > 1.5 * whole
    assert engine_work.kv_held(SEVEN_B, "bfloat16", replace(levers, use_vllm=False), work, 80 * 2**30) == float("inf")
    # a share that cannot start the engine: the memory model refuses it; timed as if the share held the rollout
    cannot = replace(levers, vllm_gpu_memory_utilization=0.1)
    assert engine_work.kv_held(SEVEN_B, "bfloat16", cannot, work, H100.memory_gib * 2**30) == float("inf")


def test_zero3_over_two_machines_is_slower_than_over_one_at_the_same_count():
    def phases(processes: int, machines: int) -> dict[str, float]:
        levers = replace(BASE, num_processes=processes, num_machines=machines, distributed_type="zero3")
        work = Workload.from_levers(levers, 256)
        return phase_seconds.step_time(SEVEN_B, "bfloat16", levers, work, calibration.fitted_rates(H100)).phases

    one_node, two = phases(8, 1), phases(4, 2)
    assert sum(two.values()) > sum(one_node.values())
    # the gathers cross the network (50 GB/s a GPU) instead of NVLink (450)
    assert two["forward_backward"] > 1.3 * one_node["forward_backward"]


def test_estimate_prices_the_gpus_its_levers_name(capsys):
    levers = "model=lora,num_processes=8,distributed_type=zero3"
    assert cli.main(["estimate", "--shape", "7b", "--hardware", "h100", "--levers", levers]) == 0
    out = capsys.readouterr().out
    assert "on 8 x NVIDIA H100" in out and "on 8 GPU(s)" in out
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--shape", "7b", "--hardware", "h100", "--gpus", "3"])
    assert "3 GPUs: the global batch of 8 completions does not split evenly" in capsys.readouterr().err


def test_estimate_says_how_many_sequences_its_engine_holds_where_the_kv_cache_binds(capsys):
    levers = "model=lora,use_vllm=true,gradient_checkpointing=true,vllm_gpu_memory_utilization="
    args = ["estimate", "--shape", "7b", "--hardware", "h100", "--global-batch", "256", "--levers"]
    assert cli.main([*args, levers + "0.25"]) == 0
    assert "the engine's KV cache holds 119 of its 256 sequences at once" in capsys.readouterr().out
    assert cli.main([*args, levers + "0.6"]) == 0
    assert "KV cache holds" not in capsys.readouterr().out  # a share that holds the whole rollout
