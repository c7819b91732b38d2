"""Every profile under profiles/ loads and validates; bad ones fail naming file and key."""

import dataclasses
import shutil

import pytest

from benchmarks.catalog import profiles


@pytest.mark.parametrize("name", profiles.available())
@pytest.mark.parametrize("quick", [False, True])
def test_every_profile_loads(name, quick):
    loaded = profiles.load(name, quick=quick)
    assert loaded.name == name and loaded.question and loaded.parts
    assert set(loaded.rewards.formats) <= set(profiles.FORMATS)


@pytest.mark.parametrize("name", ["cpu", "cpu-full"])
def test_cpu_profiles_run_every_reward_case_the_issue_names(name):
    rewards = profiles.load(name).rewards
    assert rewards.batch_sizes == (8, 64, 512) and rewards.words == (100, 2000)
    assert set(rewards.formats) == {"str", "conversational"} and rewards.seed_execution_batch in rewards.batch_sizes


def test_the_default_cpu_profile_varies_one_lever_at_a_time_and_sets_its_time_limit():
    profile = profiles.load("cpu")
    base = dataclasses.asdict(profile.grpo.levers)
    changed = [
        {k for k, v in dataclasses.asdict(levers).items() if v != base[k]}
        for _, levers in profiles.configurations(profile.grpo)
    ]
    assert changed == [
        set(),
        {"optim"},
        {"gradient_checkpointing"},
        {"model"},
        {"reward"},
    ]
    assert profile.time_limit_min == 15 and profiles.load("cpu", quick=True).time_limit_min == 2


@pytest.fixture
def profile_dir(tmp_path):
    shutil.copy(profiles.PROFILES_DIR / "base.toml", tmp_path / "base.toml")
    return tmp_path


@pytest.mark.parametrize(
    "text, message",
    [
        ('question = "q"\nbogus = 1\n', r"mine.toml: unknown key bogus"),
        ('question = "q"\n[rewards]\nbatch_size = [8]\n', r"mine.toml: unknown key rewards.batch_size"),
        (
            'question = "q"\n[rewards]\nbatch_sizes = [8, "64"]\n',
            r"mine.toml: rewards.batch_sizes\[1\]: expected int, got str",
        ),
        (
            'question = "q"\n[rewards]\nexecution_timeout_s = "10"\n',
            r"mine.toml: rewards.execution_timeout_s: expected float",
        ),
        ('question = "q"\n[rewards]\nformats = ["xml"]\n', r"mine.toml: rewards.formats\[0\]: 'xml' is not one of"),
        ('question = "q"\nparts = ["everything"]\n', r"mine.toml: parts\[0\]: 'everything' is not one of"),
        ('question = "q"\n[quick]\nrewards.words = "short"\n', r"mine.toml \[quick\]: rewards.words: expected a list"),
        ('question = "q\n', r"mine.toml: not valid TOML"),
        ('inherits = "nowhere"\n', r"mine.toml: inherits: 'nowhere' is not another profile"),
        ('inherits = "mine"\n', r"mine.toml: inherits: 'mine' is not another profile"),  # itself
    ],
)
def test_a_bad_profile_is_an_error_naming_file_and_key(profile_dir, text, message):
    (profile_dir / "mine.toml").write_text(text)
    with pytest.raises(profiles.ProfileError, match=message):
        profiles.load("mine", directory=profile_dir)


def test_an_engine_share_is_the_levers_or_the_rollout_s(profile_dir):
    (profile_dir / "h100.toml").write_text((profiles.PROFILES_DIR / "h100.toml").read_text())
    (profile_dir / "mine.toml").write_text('inherits = "h100"\n[grpo]\nengine_share = "half"\n')
    with pytest.raises(profiles.ProfileError, match=r"mine.toml: grpo.engine_share: 'half' is not one of levers"):
        profiles.load("mine", directory=profile_dir)


def test_a_profile_inherits_another_and_holds_only_what_differs(profile_dir):
    (profile_dir / "one.toml").write_text('question = "one"\n[decode]\nshape = "tiny"\nbatches = [1]\n')
    (profile_dir / "two.toml").write_text('inherits = "one"\nquestion = "two"\n[decode]\nbatches = [2]\n')
    two = profiles.load("two", directory=profile_dir)
    assert (two.question, two.decode.shape, two.decode.batches) == ("two", "tiny", (2,))
    assert two.decode.contexts == profiles.load("one", directory=profile_dir).decode.contexts  # from base, through one
    node, one = profiles.load("h100-node"), profiles.load("h100")
    assert node.grpo == one.grpo and node.decode == one.decode and node.parts == (*one.parts, "distributed")


def test_an_unknown_profile_lists_the_known_ones(profile_dir):
    with pytest.raises(profiles.ProfileError, match="no profile 'h100'"):
        profiles.load("h100", directory=profile_dir)


def test_quick_overlays_only_what_it_names(profile_dir):
    (profile_dir / "mine.toml").write_text('question = "q"\n[rewards]\nformats = ["str"]\n')
    full, quick = profiles.load("mine", directory=profile_dir), profiles.load("mine", quick=True, directory=profile_dir)
    assert quick.rewards.batch_sizes == (8,) and full.rewards.batch_sizes == (8, 64, 512)
    assert quick.rewards.formats == full.rewards.formats == ("str",)


GRPO = """
question = "q"
parts = ["grpo"]
[grpo]
shape = "tiny"
dtype = "float32"
warmup_steps = 1
measured_steps = 2
prompt_words = 8
memory_budget_gib = 4.0
configuration_timeout_s = 60
[grpo.levers]
num_generations = 2
[grpo.matrix]
optim = ["adamw_torch", "adamw_8bit"]
use_vllm = [false, true]
[[grpo.extra]]
model = "lora"
"""


def test_a_grpo_matrix_runs_every_combination_then_each_extra(profile_dir):
    (profile_dir / "mine.toml").write_text(GRPO)
    grpo = profiles.load("mine", directory=profile_dir).grpo
    names = [name for name, _ in profiles.configurations(grpo)]
    assert names == [
        "optim=adamw_torch use_vllm=False model=full",
        "optim=adamw_torch use_vllm=True model=full",
        "optim=adamw_8bit use_vllm=False model=full",
        "optim=adamw_8bit use_vllm=True model=full",
        "optim=adamw_torch use_vllm=False model=lora",
    ]
    assert all(levers.num_generations == 2 for _, levers in profiles.configurations(grpo))


@pytest.mark.parametrize(
    "change, message",
    [
        (("optim = [", "optimizer = ["), r"grpo.matrix\[0\].: unknown key grpo.matrix\[0\].optimizer|unknown key"),
        (('shape = "tiny"', 'shape = "13b"'), r"grpo.shape: '13b' is not in profiles/shapes.toml"),
        (("num_generations = 2", "num_generations = 2.5"), r"grpo.levers.num_generations: expected int"),
        (('model = "lora"', 'model = "dora"'), r"grpo.extra\[0\].model: 'dora' is not one of full, lora, qlora"),
        # a typo of adamw_8bit: named with the file's key, the close names and every allowed value
        (
            ('optim = ["adamw_torch", "adamw_8bit"]', 'optim = ["adamw_torch", "adamw8bit"]'),
            r"grpo.matrix.optim\[1\]: 'adamw8bit' is not one of TRL's optimizers .*did you mean adamw_8bit.*"
            r"allowed: adamw_torch, ",
        ),
        (("memory_budget_gib = 4.0", "memory_budget_gib = -3"), r"grpo.memory_budget_gib: must be positive, got -3"),
        (("configuration_timeout_s = 60", "configuration_timeout_s = 0"), r"grpo.configuration_timeout_s: must be"),
        (
            ("num_generations = 2", "num_generations = 3"),
            r"per_device_train_batch_size 4 x 1 rank\(s\) x steps_per_generation 1 = 4, is not a multiple",
        ),
        (("num_generations = 2", "num_generations = 2\nmax_completion_length = 0"), r"max_completion_length: 0 is"),
        (
            ("num_generations = 2", "num_generations = 2\nvllm_gpu_memory_utilization = 1.5"),
            r"grpo.levers.vllm_gpu_memory_utilization: 1.5 is not a fraction in \(0, 1\]",
        ),
        (('model = "lora"', 'vllm_mode = "remote"'), r"grpo.extra\[0\].vllm_mode: 'remote' is not one of colocate"),
        (('dtype = "float32"', 'dtype = "fp8"'), r"grpo.dtype: 'fp8'"),
        (("use_vllm = [false, true]", 'use_vllm = ["yes"]'), r"use_vllm: expected bool"),
    ],
)
def test_a_bad_grpo_table_is_an_error_naming_the_key(profile_dir, change, message):
    (profile_dir / "mine.toml").write_text(GRPO.replace(*change))
    with pytest.raises(profiles.ProfileError, match=message):
        profiles.load("mine", directory=profile_dir)


def test_the_optimizer_names_are_transformers_own():
    training_args = pytest.importorskip("transformers.training_args")
    assert set(profiles.OPTIMIZERS) == {o.value for o in training_args.OptimizerNames}


def test_estimate_refuses_a_mistyped_lever_naming_it(capsys):
    from benchmarks import cli

    with pytest.raises(SystemExit):
        cli.main(["estimate", "--shape", "0.5b", "--hardware", "h100", "--levers", "optim=adamw8bit"])
    assert "optim: 'adamw8bit' is not one of TRL's optimizers" in capsys.readouterr().err


def test_lever_names_are_trl_grpo_config_fields():
    import dataclasses

    trl = pytest.importorskip("trl")
    config_fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    loading = {"model", "lora_r"}  # how the policy is loaded, not a GRPOConfig field
    launching = {
        "num_processes",
        "num_machines",
        "distributed_type",
        "offload_optimizer_device",
        "offload_param_device",
    }
    server = {"vllm_server_tensor_parallel_size", "vllm_server_data_parallel_size"}  # `trl vllm-serve`'s, prefixed
    trainer = {"reward"}  # GRPOTrainer's reward_funcs, not a GRPOConfig field
    levers = {f.name for f in dataclasses.fields(profiles.Levers)}
    assert levers - loading - launching - server - trainer <= config_fields
    # accelerate's own names: its config file's and its DeepSpeed plugin's fields
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DeepSpeedPlugin
    from trl.scripts.vllm_serve import ScriptArguments

    accelerate_fields = {f.name for f in dataclasses.fields(ClusterConfig) + dataclasses.fields(DeepSpeedPlugin)}
    assert launching <= accelerate_fields
    assert {name.removeprefix("vllm_server_") for name in server} <= {
        f.name for f in dataclasses.fields(ScriptArguments)
    }


@pytest.mark.parametrize(
    "levers, message",
    [
        ({"num_processes": 2}, r"2 ranks with distributed_type 'no': name how they share the model"),
        ({"num_processes": 2, "distributed_type": "zero4"}, r"distributed_type: 'zero4' is not one of no, ddp, zero1"),
        ({"distributed_type": "ddp", "offload_optimizer_device": "cpu"}, r"offload_optimizer_device 'cpu' is Deep"),
        ({"distributed_type": "zero2", "offload_param_device": "cpu"}, r"offload_param_device 'cpu' needs ZeRO-3"),
        ({"num_processes": 3, "distributed_type": "zero3", "use_vllm": True, "vllm_tensor_parallel_size": 2},
         r"vllm_tensor_parallel_size 2 does not divide the world size 3"),
        ({"vllm_tensor_parallel_size": 2}, r"vllm_tensor_parallel_size > 1 splits the colocated engine"),
        ({"use_vllm": True, "vllm_server_data_parallel_size": 2}, r"they need use_vllm with vllm_mode 'server'"),
        ({"num_machines": 0}, r"num_machines: 0 is not positive"),
    ],
)  # fmt: skip
def test_an_impossible_combination_of_levers_is_an_error_naming_it(levers, message):
    with pytest.raises(profiles.ProfileError, match=message):
        profiles.check_levers(profiles.Levers(**levers), "mine.toml", "grpo.extra[0]")
    fine = profiles.Levers(num_processes=4, num_machines=2, distributed_type="zero3", offload_param_device="cpu")
    profiles.check_levers(fine, "mine.toml", "grpo.extra[0]")
    # TRL's rule is the whole generation batch's: 4 a rank on 2 ranks holds a group of 8
    groups = profiles.Levers(num_generations=8, per_device_train_batch_size=4, num_processes=2, distributed_type="ddp")
    profiles.check_levers(groups, "mine.toml", "grpo.extra[0]")
    accumulated = dataclasses.replace(groups, num_processes=1, distributed_type="no", gradient_accumulation_steps=2)
    profiles.check_levers(accumulated, "mine.toml", "grpo.extra[0]")


def test_every_hardware_class_says_where_its_figures_come_from():
    for name, hardware in profiles.load_hardware().items():
        assert hardware.memory_source, name
        assert (hardware.spec_bandwidth_gb_s is None) == (hardware.bandwidth_source is None), name
    assert profiles.load_hardware()["spark"].sustained_bandwidth_gb_s == (180.0, 192.0)
    assert {"24gb", "a100", "h100", "h200", "b200", "spark", "cpu"} <= {
        h.gpu_class for h in profiles.load_hardware().values()
    }


CONTEXT = """question = "q"
[context]
shape = "tiny"
dtype = "float32"
budget_gib = 4.0
prompt_words = 8
probe_timeout_s = 60
start_tokens = 16
max_tokens = 64
resolution = 0.125
granule = 16
contenders = ["trl-1.16"]
[context.levers]
model = "lora"
"""


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ('contenders = ["trl-1.16"]', 'contenders = ["trl-1.16", "deepspeed"]'),
            r"context.contenders\[1\]: 'deepspeed'",
        ),
        (('shape = "tiny"', 'shape = "13b"'), r"context.shape: '13b'"),
        (("resolution = 0.125", "resolution = 2.0"), r"0 < resolution < 1"),
        (('model = "lora"', 'model = "lorra"'), r"context.levers.model: 'lorra'"),
    ],
)
def test_a_bad_context_table_is_an_error_naming_the_key(profile_dir, change, message):
    (profile_dir / "good.toml").write_text(CONTEXT)
    assert profiles.load("good", directory=profile_dir).context.contenders == ("trl-1.16",)
    (profile_dir / "mine.toml").write_text(CONTEXT.replace(*change))
    with pytest.raises(profiles.ProfileError, match=message):
        profiles.load("mine", directory=profile_dir)


def test_levers_read_back_from_a_result_file_take_defaults_for_new_levers_and_drop_unknown_keys():
    recorded = {"optim": "adamw_8bit", "a_lever_since_removed": 1}
    assert profiles.Levers.recorded(recorded) == profiles.Levers(optim="adamw_8bit")
