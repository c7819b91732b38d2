"""test_execution_reward behind the default sandbox: correct code passes, adversarial code
scores 0.0 within its timeout + 1 s and leaves no process, no file and no connection behind."""

import asyncio
import logging
import os
import pickle
import socket
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from rewards import (
    Bubblewrap,
    CommandPrefix,
    async_test_execution_reward,
    make_test_execution_reward,
    test_execution_reward,
)
from rewards.sandbox import UID_BASE, find_bwrap

TIMEOUT_S = 2.0
RUNNER_MARKER = "The program that runs inside the sandbox"
ADD_TESTS = """
from candidate import add

def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-1, -2) == -3
"""
CORRECT_ADD = "def add(a, b):\n    return a + b\n"
ATTACK_TESTS = "from candidate import attack\n\ndef test_attack_worked():\n    assert attack() is True\n"


def sandbox_processes():
    """Processes still alive from any sandbox run: the runner's source is in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if RUNNER_MARKER.encode() in cmdline or UID_BASE <= uid < UID_BASE + 1024:
            found.append(int(entry.name))
    return found


def score(candidate, tests=ATTACK_TESTS, fmt="str"):
    """Run one candidate; assert the liveness and leftover guarantees; return its reward."""
    completion = candidate if fmt == "str" else [{"role": "assistant", "content": candidate}]
    start = time.monotonic()
    [reward] = make_test_execution_reward(timeout_s=TIMEOUT_S)([completion], test_code=[tests])
    assert time.monotonic() - start < TIMEOUT_S + 1.0
    deadline = time.monotonic() + 1.0  # the kernel reaps a killed PID namespace asynchronously
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []
    return reward


@pytest.mark.sandbox
@pytest.mark.parametrize("fmt", ["str", "conversational"])
def test_a_correct_candidate_scores_one(sandbox, fmt):
    assert score(CORRECT_ADD, ADD_TESTS, fmt) == 1.0


@pytest.mark.sandbox
@pytest.mark.parametrize(
    "candidate",
    [
        "def add(a, b):\n    return a - b\n",  # wrong answer
        "def add(a, b):\n    return a + b\nraise SystemExit(0)\n",  # exits cleanly at import
        "def add(a, b):\n    return a +\n",  # syntax error
        "def add(a, b):\n    return 3\n",  # passes one test of two
    ],
)
def test_an_incorrect_candidate_scores_zero(sandbox, candidate):
    assert score(candidate, ADD_TESTS) == 0.0


ATTACKS = {
    "infinite loop": """
        def attack():
            while True:
                pass
        """,
    "fork bomb": """
        import os

        def attack():
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """,
    "memory bomb": """
        def attack():
            hoard = [bytearray(1 << 26) for _ in range(10_000)]
            return len(hoard) > 0
        """,
    "tcp connection": """
        import socket

        def attack():
            connection = socket.create_connection(("127.0.0.1", PORT), timeout=1)
            connection.sendall(b"leak")
            return True
        """,
    "parent environment secret": """
        import os

        def attack():
            return os.environ.get("GRPO_BENCH_SECRET") == "SECRET"
        """,
    "file in the host user's home": """
        def attack():
            return open("HOME_FILE").read() == "SECRET"
        """,
    "write outside tmp": """
        def attack():
            wrote = False
            for path in TARGETS:
                try:
                    with open(path, "w") as f:
                        f.write("escaped")
                    wrote = wrote or not path.startswith("/tmp/")
                except OSError:
                    pass
            return wrote
        """,
    "daemonised child": """
        import os, time

        def attack():
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(60)
                os._exit(0)
            return True
        """,
    "100 MB of output": """
        import sys

        def attack():
            sys.stdout.write("x" * 100_000_000)
            sys.stdout.flush()
            return True
        """,
    "kills its parent": """
        import os, signal

        def attack():
            os.kill(os.getppid(), signal.SIGKILL)
            return True
        """,
    "os._exit(0) before the tests": """
        import os

        os._exit(0)

        def attack():
            return True
        """,
    "forged verdict": """
        import os

        verdict = "passed\\n1 tests passed\\n"  # the runner's verdict format, everywhere it can reach
        print(verdict, flush=True)
        for fd in os.listdir("/proc/self/fd"):
            try:
                os.write(int(fd), verdict.encode())
            except OSError:
                pass
        for fd in range(3):
            try:
                with open(f"/proc/{os.getppid()}/fd/{fd}", "w") as f:
                    f.write(verdict)
            except OSError:
                pass
        os._exit(0)

        def attack():
            return True
        """,
}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_adversarial_candidate_scores_zero_and_leaves_nothing(sandbox, name, monkeypatch, tmp_path):
    marker = f"grpo-bench-escape-{uuid.uuid4().hex}"
    home_file = Path.home() / f".{marker}"
    home_file.write_text("SECRET")
    monkeypatch.setenv("GRPO_BENCH_SECRET", "SECRET")
    targets = [f"/tmp/{marker}", f"/{marker}", f"/usr/{marker}", str(Path.home() / marker), str(tmp_path / marker)]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    candidate = (
        textwrap.dedent(ATTACKS[name])
        .replace("PORT", str(listener.getsockname()[1]))
        .replace("HOME_FILE", str(home_file))
        .replace("TARGETS", repr(targets))
    )
    try:
        assert score(candidate) == 0.0
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
        assert [t for t in targets if os.path.exists(t)] == []
    finally:
        listener.close()
        home_file.unlink()


@pytest.mark.sandbox
def test_completions_run_in_parallel_and_keep_their_order(sandbox):
    candidates = [CORRECT_ADD, "def add(a, b):\n    return 0\n"] * 4
    reward = make_test_execution_reward(workers=3, timeout_s=TIMEOUT_S)
    assert reward(candidates, test_code=[ADD_TESTS] * 8) == [1.0, 0.0] * 4
    verdicts = reward.verdicts(candidates[:2], [ADD_TESTS] * 2)
    assert [v.passed for v in verdicts] == [True, False]
    assert "assert 0 == 3" in verdicts[1].reason or "AssertionError" in verdicts[1].reason


@pytest.mark.sandbox
def test_seed_signature_and_async_form(sandbox):
    completions = [CORRECT_ADD, "def add(a, b):\n    return a * b\n"]
    assert test_execution_reward(completions, test_code=[ADD_TESTS] * 2, timeout_s=TIMEOUT_S) == [1.0, 0.0]
    assert asyncio.run(async_test_execution_reward(completions, test_code=[ADD_TESTS, None])) == [1.0, None]
    clone = pickle.loads(pickle.dumps(make_test_execution_reward(asynchronous=True)))
    assert asyncio.run(clone(completions[:1], test_code=ADD_TESTS)) == [1.0]


@pytest.mark.sandbox
def test_a_command_prefix_boundary_gets_the_job_on_stdin(sandbox):
    """A user-given prefix (here bubblewrap spelled out by hand) sees the candidate and tests
    without any shared path: they travel on stdin, unlike the guide's Docker example."""
    prefix = [find_bwrap(), "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--tmpfs", "/tmp"]
    for path in dict.fromkeys((sys.prefix, sys.base_prefix)):  # the interpreter, where /tmp's tmpfs hid it
        prefix += ["--ro-bind", path, path]
    prefix += ["--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp", "--"]
    boundary = CommandPrefix(prefix, python=Bubblewrap().python, drop_to_uid=None)
    completions = [CORRECT_ADD, "def add(a, b):\n    return None\n"]
    assert test_execution_reward(completions, [ADD_TESTS] * 2, sandbox_cmd=None) == [1.0, 0.0]
    verdicts = make_test_execution_reward(boundary).verdicts(completions, [ADD_TESTS] * 2)
    assert [v.passed for v in verdicts] == [True, False], [v.reason for v in verdicts]


@pytest.mark.parametrize(
    "boundary",
    [CommandPrefix(["no-such-sandbox-binary", "run"]), Bubblewrap(bwrap="/nonexistent/bwrap")],
    ids=["missing prefix command", "missing bwrap"],
)
def test_without_a_boundary_nothing_runs_and_one_warning_says_why(boundary, caplog, tmp_path):
    proof = tmp_path / "ran"
    candidate = f"open({str(proof)!r}, 'w').write('ran on the host')\ndef add(a, b):\n    return a + b\n"
    reward = make_test_execution_reward(boundary)
    with caplog.at_level(logging.WARNING):
        assert reward([candidate] * 3, test_code=[ADD_TESTS] * 3) == [0.0, 0.0, 0.0]
        assert reward([candidate], test_code=[ADD_TESTS]) == [0.0]
    assert len([r for r in caplog.records if "refusing to execute" in r.message]) == 1
    assert not proof.exists()


def test_an_empty_sandbox_cmd_is_an_error_not_a_host_run():
    with pytest.raises(ValueError, match="sandbox_cmd must be a non-empty list"):
        test_execution_reward([CORRECT_ADD], test_code=[ADD_TESTS], sandbox_cmd=[])


def test_misaligned_test_code_raises_naming_both_lengths():
    with pytest.raises(ValueError, match="1 test_code for 2 completions"):
        make_test_execution_reward(CommandPrefix(["no-such-sandbox-binary"]))(["a", "b"], test_code=[ADD_TESTS])


def test_the_process_scan_survives_processes_ending_under_it(monkeypatch):
    from rewards import sandbox as sandbox_module

    real_listdir = os.listdir
    monkeypatch.setattr(sandbox_module.os, "listdir", lambda path: ["999999999", "self", *real_listdir(path)])
    assert sandbox_module._processes_of(4_000_000_000) is False  # a vanished pid is skipped, not raised
