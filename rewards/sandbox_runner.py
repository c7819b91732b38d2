"""The program that runs inside the sandbox: standard library only, passed as ``python -c``.

Usage inside the boundary::

    python -I -c <this file> '<confinement JSON>'            # run one job read from stdin
    python -I -c <this file> '<confinement JSON>' CMD ARG..  # confine, then exec CMD

The confinement JSON is ``{"limits": {"cpu": 11, "as": ..., ...}, "uid": 65100 | null}``:
``limits`` maps ``resource.RLIMIT_<NAME>`` names to values; ``uid`` is the unprivileged
user to become when the runner starts as root (bubblewrap run by root, without a user
namespace, so that ``RLIMIT_NPROC`` binds: the kernel exempts uid 0 from it).

A job is ``{"candidate": str, "tests": str}`` on stdin. The runner writes both as
``candidate.py`` and ``test_candidate.py`` in a private directory, lists the top-level
``test_*`` functions of the tests by parsing them (before any untrusted code runs),
confines itself, then forks: the child imports the tests (which import the candidate),
calls each ``test_*`` function and reports each outcome over a pipe; its stdout and stderr
go to a file capped by ``RLIMIT_FSIZE``. The parent never runs untrusted code: it makes
itself non-dumpable (so the child cannot reach its file descriptors through /proc), waits
for the child, and only then writes one JSON verdict line to its own stdout, which the
child does not hold (its stdout is replaced before it runs anything). The verdict passes only if the child exited with status 0 after
reporting every listed test, in order, as passed. Exit codes and output of the candidate
count for nothing.
"""

import ast
import json
import os
import resource
import sys
import tempfile

OUTPUT_HEAD_BYTES = 2048
REPORT_MAX_BYTES = 1 << 20


def confine(limits, uid):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (value, value))
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def listed_tests(source):
    """Names of the top-level ``test_*`` functions, in file order."""
    tree = ast.parse(source, "test_candidate.py")
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    ]


def describe(error):
    return f"{type(error).__name__}: {error}"[:300]


def run_tests(workdir, expected, report_fd):
    """The child: import the tests, call each one, report; never returns."""
    import importlib

    sys.dont_write_bytecode = True
    sys.path.insert(0, workdir)
    report = os.fdopen(report_fd, "w", buffering=1)
    try:
        module = importlib.import_module("test_candidate")
    except BaseException as error:  # the candidate may raise anything, SystemExit included
        report.write(json.dumps({"test": None, "ok": False, "error": describe(error)}) + "\n")
        os._exit(1)
    for name in expected:
        try:
            getattr(module, name)()
            outcome = {"test": name, "ok": True}
        except BaseException as error:
            outcome = {"test": name, "ok": False, "error": describe(error)}
        report.write(json.dumps(outcome) + "\n")
    report.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def judge(expected, reports, status):
    failures = [r for r in reports if not r.get("ok")]
    ran = [r.get("test") for r in reports]
    if os.WIFSIGNALED(status):
        exit_reason = f"killed by signal {os.WTERMSIG(status)}"
    else:
        exit_reason = f"exit status {os.WEXITSTATUS(status)}"
    passed = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and ran == expected and not failures
    if passed:
        reason = f"{len(expected)} tests passed"
    elif failures:
        first = failures[0]
        reason = f"{first.get('test') or 'import'} failed: {first.get('error')}"
    elif ran != expected:
        reason = f"tests ran {len(ran)} of {len(expected)} ({exit_reason})"
    else:
        reason = exit_reason
    return {"passed": passed, "reason": reason, "tests": len(expected), "failures": failures[:3]}


def read_reports(fd):
    chunks, size = [], 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if size < REPORT_MAX_BYTES:
            chunks.append(chunk)
        size += len(chunk)
    reports = []
    for line in b"".join(chunks)[:REPORT_MAX_BYTES].splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:
            reports.append({"test": None, "ok": False, "error": "unreadable report line"})
    return reports


def make_undumpable():
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def run_job(job, confinement):
    try:
        expected = listed_tests(job["tests"])
    except SyntaxError as error:
        return {"passed": False, "reason": f"test code does not parse: {error}", "tests": 0, "failures": []}
    if not expected:
        return {"passed": False, "reason": "test code defines no test_* function", "tests": 0, "failures": []}
    workdir = tempfile.mkdtemp(prefix="job-")
    os.chmod(workdir, 0o755)
    for name, text in (("candidate.py", job["candidate"]), ("test_candidate.py", job["tests"])):
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
    output = os.open(os.path.join(workdir, "output.log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    confine(confinement["limits"], confinement.get("uid"))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        os.chdir(tempfile.gettempdir())
        run_tests(workdir, expected, write_end)
    os.close(write_end)
    make_undumpable()
    reports = read_reports(read_end)
    _, status = os.waitpid(pid, 0)
    verdict = judge(expected, reports, status)
    verdict["output_head"] = os.pread(output, OUTPUT_HEAD_BYTES, 0).decode("utf-8", "replace")
    return verdict


def main(argv):
    confinement = json.loads(argv[1])
    if len(argv) > 2:
        confine(confinement["limits"], confinement.get("uid"))
        os.execvp(argv[2], argv[2:])
    verdict = run_job(json.loads(sys.stdin.read()), confinement)
    sys.stdout.write(json.dumps(verdict) + "\n")


if __name__ == "__main__":
    main(sys.argv)
