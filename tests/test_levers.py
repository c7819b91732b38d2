"""Every lever is declared once (``benchmarks.catalog.profiles.Levers``) and arrives where its kind says:
set away from its default, each is read back from the real trainer's arguments, the launcher's configs,
the model loader or the server's command line. A lever that does not arrive fails here."""

import dataclasses
from pathlib import Path

import pytest

from benchmarks.catalog import profiles
from benchmarks.catalog.profiles import GRPO_CONFIG, LAUNCHER, LEVER_KINDS, MODEL_LOADING, SERVER, TRAINER, Levers
from benchmarks.run.grpo import launch, trainer, worker
from benchmarks.run.grpo.job import Job
from benchmarks.run.model_dirs import materialise

# Every lever away from its default, each to a value the checks on load accept together.
AWAY = Levers(
    optim="adamw_8bit",
    gradient_checkpointing=True,
    use_vllm=True,
    vllm_mode="server",
    vllm_enable_sleep_mode=True,
    vllm_gpu_memory_utilization=0.5,
    vllm_max_model_length=64,
    beta=0.04,
    num_generations=2,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    steps_per_generation=1,
    max_completion_length=8,
    learning_rate=3e-6,
    model="lora",
    lora_r=8,
    num_processes=2,
    num_machines=2,
    distributed_type="zero3",
    offload_optimizer_device="cpu",
    offload_param_device="cpu",
    ds3_gather_for_generation=False,
    vllm_tensor_parallel_size=2,
    vllm_server_tensor_parallel_size=2,
    vllm_server_data_parallel_size=2,
    reward="format-exact",
)


def job(levers: Levers, model_dir: str = "unused") -> Job:
    return Job(
        levers=levers,
        model_dir=model_dir,
        dtype="float32",
        warmup_steps=0,
        measured_steps=1,
        prompt_words=8,
        server_host="127.0.0.1",
        server_port=8000,
    )


def test_every_lever_is_declared_with_its_kind_and_help_and_set_away_from_its_default_here():
    default = Levers()
    for field in dataclasses.fields(Levers):
        assert field.metadata["kind"] in LEVER_KINDS and field.metadata["help"], field.name
        assert getattr(AWAY, field.name) != getattr(default, field.name), f"{field.name} is not set away here"


def test_every_grpo_config_lever_arrives_in_the_config(tmp_path):
    pytest.importorskip("trl")
    config = trainer.trainer_config(job(AWAY), cuda=False, output_dir=str(tmp_path), server_port=8000)
    for name in profiles.levers_of_kind(GRPO_CONFIG):
        assert getattr(config, name) == getattr(AWAY, name), name


def test_the_real_trainer_runs_with_every_lever_this_machine_can_run_and_keeps_them(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("bitsandbytes")
    # vLLM (not installed for the tests), a server, several ranks or machines cannot start here
    here = dataclasses.replace(
        AWAY,
        use_vllm=False,
        num_processes=1,
        num_machines=1,
        distributed_type="no",
        offload_optimizer_device="none",
        offload_param_device="none",
    )
    tiny = profiles.load_shapes()["tiny"]
    model_dir = materialise(tiny, "float32", root=tmp_path)
    trainer = worker.build_trainer(
        job(here, str(model_dir)), worker.Phases(_Sink(), cuda=False), False, str(tmp_path / "out"), None
    )
    for name in profiles.levers_of_kind(GRPO_CONFIG):
        assert getattr(trainer.args, name) == getattr(here, name), name
    assert trainer.model.peft_config["default"].r == here.lora_r  # model loading: LoRA at its rank
    assert [f.__name__ for f in trainer.reward_funcs] == ["format_reward", "correctness_reward"]  # the trainer's


def test_launcher_levers_arrive_in_accelerate_s_and_deepspeed_s_configs(tmp_path):
    place = launch.Rendezvous(machine_rank=1, main_process_ip="10.0.0.1", main_process_port=29500)
    deepspeed = launch.deepspeed_config(AWAY)
    config = launch.accelerate_config(AWAY, "bfloat16", True, place, Path(tmp_path / "ds.json"))
    assert set(profiles.levers_of_kind(LAUNCHER)) == {
        "num_processes",
        "num_machines",
        "distributed_type",
        "offload_optimizer_device",
        "offload_param_device",
    }
    assert config["num_processes"] == AWAY.num_processes * AWAY.num_machines and config["num_machines"] == 2
    assert deepspeed["zero_optimization"]["stage"] == 3 and config["deepspeed_config"]["zero3_init_flag"]
    assert deepspeed["zero_optimization"]["offload_optimizer"]["device"] == AWAY.offload_optimizer_device
    assert deepspeed["zero_optimization"]["offload_param"]["device"] == AWAY.offload_param_device


def test_server_levers_arrive_on_trl_vllm_serve_s_command_line():
    command = worker.server_command(job(AWAY), "python", "127.0.0.1")
    for name in profiles.levers_of_kind(SERVER):
        flag = "--" + name.removeprefix("vllm_server_")
        assert command[command.index(flag) + 1] == str(getattr(AWAY, name)), name
    assert command[command.index("--gpu_memory_utilization") + 1] == str(AWAY.vllm_gpu_memory_utilization)


def test_the_kinds_partition_the_levers():
    kinds = [profiles.levers_of_kind(kind) for kind in LEVER_KINDS]
    names = [name for names in kinds for name in names]
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(Levers))
    assert profiles.levers_of_kind(MODEL_LOADING) == ("model", "lora_r")
    assert profiles.levers_of_kind(TRAINER) == ("reward",)


class _Sink:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def test_changed_levers_are_what_dataclasses_replace_makes_and_an_unknown_name_is_refused():
    changes = {f.name: getattr(AWAY, f.name) for f in dataclasses.fields(Levers)}
    made = Levers().changed(**changes)
    assert made == dataclasses.replace(Levers(), **changes) == AWAY and hash(made) == hash(AWAY)
    assert Levers().changed(beta=0.1).beta == 0.1 and Levers().beta == 0.0  # the original is left as it was
    with pytest.raises(TypeError, match="no lever bta"):
        Levers().changed(bta=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.beta = 1.0
