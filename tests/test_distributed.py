"""GRPO steps over many ranks and machines on this CPU: real TRL under accelerate and DeepSpeed over
gloo, on the tiny shape. Each launch takes ~10-40 s here (imports, two ranks on two cores)."""

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

from benchmarks.catalog.profiles import Levers, load_shapes  # noqa: E402
from benchmarks.model.memory.sharding import rank_model_states  # noqa: E402
from benchmarks.run.grpo import configuration, launch, multinode  # noqa: E402
from benchmarks.run.grpo.job import Job  # noqa: E402
from benchmarks.run.model_dirs import materialise  # noqa: E402

TINY = load_shapes()["tiny"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return materialise(TINY, "float32", root=tmp_path_factory.mktemp("models"))


def job(model_dir, **levers) -> Job:
    chosen = Levers(num_generations=4, per_device_train_batch_size=4, max_completion_length=8, **levers)
    return Job(
        levers=chosen, model_dir=str(model_dir), dtype="float32", warmup_steps=0, measured_steps=1, prompt_words=8
    )


def test_two_ranks_under_zero3_each_hold_half_the_model_and_are_recorded_per_rank(model_dir, tmp_path):
    record = configuration.run_configuration(
        job(model_dir, num_processes=2, distributed_type="zero3"), None, tmp_path / "w.log", timeout_s=300
    )
    assert record.status == "ok", record.reason
    ran = record.distribution
    assert (ran.world_size, ran.distributed_type, ran.zero_stage, ran.backend) == (2, "DEEPSPEED", 3, "gloo")
    assert ran.held_parameter_fraction == pytest.approx(0.5, abs=0.01)  # every parameter partitioned
    assert ran.launcher == "accelerate launch" and ran.config["deepspeed_config"]["zero3_init_flag"]
    assert [rank.rank for rank in record.ranks] == [0, 1]
    predicted = rank_model_states(TINY, "float32", Levers(num_processes=2, distributed_type="zero3"))
    for rank in record.ranks:
        states = rank.summary.model_states
        assert states.parameters == pytest.approx(TINY.param_count() * 4 / 2, rel=0.01)
        assert states.total == pytest.approx(predicted.total, rel=0.01)
        assert rank.summary.peak_bytes > 0 and rank.summary.step_s_median > 0
    # the configuration's figure: the larger rank's memory, both ranks' completions
    assert record.summary.peak_bytes == max(rank.summary.peak_bytes for rank in record.ranks)
    assert record.steps[0].completion_tokens == 2 * 4 * 8


def test_a_launch_that_runs_one_process_for_two_ranks_is_an_error_never_a_result(model_dir, tmp_path, monkeypatch):
    original = launch.accelerate_config

    def cpu_launcher(*args, **kwargs):  # accelerate's MULTI_CPU path: its simple launcher starts one process
        return {**original(*args, **kwargs), "distributed_type": "MULTI_CPU"}

    monkeypatch.setattr(launch, "accelerate_config", cpu_launcher)
    record = configuration.run_configuration(
        job(model_dir, num_processes=2, distributed_type="ddp"), None, tmp_path / "w.log", timeout_s=300
    )
    assert record.status == "error" and not record.steps and record.summary is None
    assert "2 ranks asked for, but torch.distributed has 1" in record.reason
    assert record.distribution.world_size is None  # no rank got as far as reporting a world it ran in


def test_fsdp2_on_a_cpu_is_skipped_with_the_reason_and_starts_nothing(model_dir, tmp_path):
    record = configuration.run_configuration(
        job(model_dir, num_processes=2, distributed_type="fsdp2"), None, tmp_path / "w.log", nvml=None
    )
    assert record.status == "skipped" and "plain DDP" in record.reason
    assert not (tmp_path / "w.log").exists()


def test_two_machines_over_loopback_through_submitit_s_local_executor_make_one_run(model_dir, tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.delenv("GRPO_BENCH_EXECUTOR", raising=False)
    record = multinode.run_machines(
        job(model_dir, num_processes=1, num_machines=2, distributed_type="zero3"),
        None,
        tmp_path / "w.log",
        300,
        gpus=False,
    )
    assert record.status == "ok", record.reason
    assert record.distribution.world_size == 2 and record.distribution.num_machines == 2
    assert [(rank.rank, rank.machine_rank) for rank in record.ranks] == [(0, 0), (1, 1)]
    assert record.distribution.held_parameter_fraction == pytest.approx(0.5, abs=0.01)
    assert record.distribution.config["rdzv_backend"] == "c10d"


def test_the_accelerate_config_starts_from_trl_s_and_carries_the_levers(tmp_path):
    levers = Levers(num_processes=4, num_machines=2, distributed_type="zero3", offload_optimizer_device="cpu")
    place = launch.Rendezvous(machine_rank=1, main_process_ip="10.0.0.1", main_process_port=29500)
    argv, config = launch.command(levers, "bfloat16", True, place, tmp_path / "job.json", python="python")
    assert argv[:3] == ["python", "-m", "accelerate.commands.launch"] and argv[-3:] == [
        "-m",
        "benchmarks.run.grpo.worker",
        str(tmp_path / "job.json"),
    ]
    assert (config["num_processes"], config["num_machines"], config["machine_rank"]) == (8, 2, 1)
    assert config["distributed_type"] == "DEEPSPEED" and config["main_process_ip"] == "10.0.0.1"
    assert "mixed_precision" not in config  # DeepSpeed's file decides ("auto": the trainer's bf16)
    zero = config["deepspeed_config"]["deepspeed_config_file"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"] == {"device": "cpu"}
    assert zero["stage3_param_persistence_threshold"] == 0
    one, none = launch.command(Levers(), "float32", False, place, tmp_path / "job.json", "python")
    assert none is None and one[:3] == ["python", "-m", "benchmarks.run.grpo.worker"]


def test_server_mode_over_many_machines_without_gpus_is_skipped_before_any_machine_starts(model_dir, tmp_path):
    levers = {"num_processes": 1, "num_machines": 2, "distributed_type": "zero3", "use_vllm": True}
    record = multinode.run_machines(
        job(model_dir, **levers, vllm_mode="server"), None, tmp_path / "w.log", 300, gpus=False
    )
    assert record.status == "skipped" and "only over CUDA" in record.reason
    assert not (tmp_path / "w.submitit").exists()
