"""Every profile under profiles/ loads and validates; bad ones fail naming file and key."""

import shutil

import pytest

from benchmarks import profile as profiles


@pytest.mark.parametrize("name", profiles.available())
@pytest.mark.parametrize("quick", [False, True])
def test_every_profile_loads(name, quick):
    loaded = profiles.load(name, quick=quick)
    assert loaded.name == name and loaded.question and loaded.parts
    assert set(loaded.rewards.formats) <= set(profiles.FORMATS)


def test_cpu_profile_runs_every_reward_case_the_issue_names():
    rewards = profiles.load("cpu").rewards
    assert rewards.batch_sizes == (8, 64, 512) and rewards.words == (100, 2000)
    assert set(rewards.formats) == {"str", "conversational"} and rewards.seed_execution_batch == 64


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
    ],
)
def test_a_bad_profile_is_an_error_naming_file_and_key(profile_dir, text, message):
    (profile_dir / "mine.toml").write_text(text)
    with pytest.raises(profiles.ProfileError, match=message):
        profiles.load("mine", directory=profile_dir)


def test_an_unknown_profile_lists_the_known_ones(profile_dir):
    with pytest.raises(profiles.ProfileError, match="no profile 'h100'"):
        profiles.load("h100", directory=profile_dir)


def test_quick_overlays_only_what_it_names(profile_dir):
    (profile_dir / "mine.toml").write_text('question = "q"\n[rewards]\nformats = ["str"]\n')
    full, quick = profiles.load("mine", directory=profile_dir), profiles.load("mine", quick=True, directory=profile_dir)
    assert quick.rewards.batch_sizes == (8,) and full.rewards.batch_sizes == (8, 64, 512)
    assert quick.rewards.formats == full.rewards.formats == ("str",)
