"""The scripts for a lent GPU machine: valid shell, an interpreter for every contender the h200 profile
searches, and a clear stop where their wheels were not prepared."""

import re
import shutil
import subprocess

import pytest

from benchmarks import REPO
from benchmarks.catalog.profiles import load

SCRIPTS = sorted((REPO / "benchmarks" / "device").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_script_is_valid_shell(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0


def test_the_context_script_gives_every_contender_of_the_h200_profile_its_interpreter():
    text = (REPO / "benchmarks" / "device" / "context-h200.sh").read_text()
    made = set(re.findall(r"^interpreter (\S+) ", text, re.M))
    passed = set(re.findall(r'--python "([^=]+)=', text))
    assert made == passed == set(load("h200").context.contenders)


def test_the_context_script_stops_naming_the_missing_preparation(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "benchmarks" / "device", copy / "benchmarks" / "device")
    done = subprocess.run(
        ["bash", str(copy / "benchmarks" / "device" / "context-h200.sh")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no .context-site: run" in done.stdout and "--prepare" in done.stdout
