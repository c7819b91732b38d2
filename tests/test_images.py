"""The GPU image as a declared environment (profiles/images.toml): the guard that makes an interpreter here see only
what the image holds, the harness importing under it, and the H200 script preparing exactly what the image lacks."""

import subprocess
import sys

from benchmarks import REPO
from benchmarks.catalog import images

IMAGE = images.load_images()["h200"]


def under_guard(code: str, tmp_path=None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter of this environment, guarded as the image's."""
    guarded = f"from benchmarks.catalog import images\nimages.install({IMAGE.name!r})\n{code}"
    env = {"PYTHONPATH": str(tmp_path)} if tmp_path else None
    return subprocess.run([sys.executable, "-c", guarded], cwd=REPO, capture_output=True, text=True, env=env)


def test_the_image_s_list_holds_what_it_needs_and_not_what_its_script_carries():
    assert {"torch", "transformers", "peft", "accelerate", "pandas", "pyarrow", "nvidia-ml-py"} <= set(IMAGE.packages)
    carried = {images.normalise(r.split("==")[0]) for r in IMAGE.carried}
    assert carried & {images.normalise(p) for p in IMAGE.packages} == set()  # carry one only where it is missing
    assert {"trl", "datasets", "bitsandbytes"} <= carried and all("==" in r for r in IMAGE.carried)
    assert set(IMAGE.rehearsed) <= set(IMAGE.packages)


def test_the_h200_script_prepares_the_wheels_the_image_declares_it_lacks():
    script = (REPO / "benchmarks" / "device" / "h200.sh").read_text()
    assert 'tomllib.load(open("profiles/images.toml", "rb"))["h200"]["carried"]' in script
    assert not any(r in script for r in IMAGE.carried)  # named once, in profiles/images.toml


def test_under_the_guard_a_package_the_image_lacks_is_absent_as_it_is_there():
    done = under_guard(
        "import importlib.util\nassert importlib.util.find_spec('jsonschema') is None\nimport jsonschema"
    )
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr and "jsonschema" in done.stderr


def test_a_harness_module_that_imports_what_the_image_lacks_fails_under_the_guard(tmp_path):
    (tmp_path / "harness_part.py").write_text("import fastjsonschema\n")
    done = under_guard("import harness_part", tmp_path)
    assert done.returncode != 0 and "fastjsonschema" in done.stderr


def test_the_harness_imports_under_the_guard():
    modules = [
        "benchmarks.cli",
        "benchmarks.run.grpo.worker",
        "benchmarks.run.decode.sweep",
        "benchmarks.run.decode.engines",
        "benchmarks.run.max_context.contender_runs",
    ]
    modules += ["benchmarks.run.machine.preflight", "rewards"]
    done = under_guard("\n".join(f"import {m}" for m in modules))
    assert done.returncode == 0, done.stderr[-3000:]
