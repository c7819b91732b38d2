"""The program that runs inside the sandbox, passed as ``python -I -S -c``.

Usage inside the boundary::

    python -I -S -c <this file> CONFINEMENT            # run one job read from stdin
    python -I -S -c <this file> CONFINEMENT CMD ARG..  # confine, then exec CMD

CONFINEMENT is ``name=value,...;uid``: rlimits by ``resource.RLIMIT_<NAME>`` name, then the
unprivileged uid to become when the runner starts as root (bubblewrap run by root keeps
the host user namespace, so that ``RLIMIT_NPROC`` binds: the kernel exempts uid 0 from
it), or ``-`` for none.

A job is ``marshal.dumps((candidate, tests))`` on stdin, from the trusted host. The runner
writes both as ``candidate.py`` and ``test_candidate.py`` in a private directory, lists the
top-level ``test_*`` functions of the tests by parsing them (before any untrusted code
runs), confines itself, then forks. The child imports the tests (which import the
candidate), calls each ``test_*`` function and reports each outcome on a pipe, one line
each (``ok NAME`` or ``fail NAME: ERROR``); its stdout and stderr go to a file capped by
``RLIMIT_FSIZE``. The parent never runs untrusted code: it is non-dumpable (so the child
cannot reach its descriptors through /proc), waits for the child, and only then writes the
verdict on its own stdout, which the child does not hold (the child's is replaced before
it runs anything): a line ``passed`` or ``failed``, a line of reason, then the head of the
child's output. The verdict passes only if the child exited with status 0 after reporting
every listed test, in order, as passed: exit codes and output of the candidate count for
nothing.

Standard library only, and only cheap modules (no json, ast, re or tempfile): the
runner's start-up is paid once per completion.
"""

import _ast
import marshal
import os
import resource
import sys

OUTPUT_HEAD_BYTES = 2048
REPORT_MAX_BYTES = 1 << 20


def parse_confinement(text):
    limits, uid = text.split(";")
    pairs = [item.split("=") for item in limits.split(",") if item]
    return {name: int(value) for name, value in pairs}, None if uid == "-" else int(uid)


def confine(limits, uid):
    """Apply rlimits; drop to ``uid`` if root. True if it dropped (which also makes us non-dumpable)."""
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (value, value))
    if uid is None or os.getuid() != 0:
        return False
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    return True


def listed_tests(source):
    """Names of the top-level ``test_*`` functions, in file order."""
    tree = compile(source, "test_candidate.py", "exec", _ast.PyCF_ONLY_AST)
    return [
        node.name
        for node in tree.body
        if isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef)) and node.name.startswith("test_")
    ]


def describe(error):
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]


def run_tests(workdir, expected, report_fd):
    """The child: import the tests, call each one, report; never returns."""
    sys.dont_write_bytecode = True
    sys.path.insert(0, workdir)
    report = os.fdopen(report_fd, "w", buffering=1)
    try:
        module = __import__("test_candidate")
    except BaseException as error:  # the candidate may raise anything, SystemExit included
        report.write(f"fail import: {describe(error)}\n")
        os._exit(1)
    for name in expected:
        try:
            getattr(module, name)()
            report.write(f"ok {name}\n")
        except BaseException as error:
            report.write(f"fail {name}: {describe(error)}\n")
    report.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def read_reports(fd):
    """The child's report lines, at most REPORT_MAX_BYTES of them; reads to EOF."""
    chunks, size = [], 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if size < REPORT_MAX_BYTES:
            chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:REPORT_MAX_BYTES].decode("utf-8", "replace").splitlines()


def judge(expected, reports, status):
    """(passed, reason) from the listed tests, the child's reports and its wait status."""
    passed_names = [line[3:] for line in reports if line.startswith("ok ")]
    failures = [
        line[5:] if line.startswith("fail ") else f"with an unexpected report line {line[:80]!r}"
        for line in reports
        if not line.startswith("ok ")
    ]
    if os.WIFSIGNALED(status):
        exit_reason = f"killed by signal {os.WTERMSIG(status)}"
    else:
        exit_reason = f"exit status {os.WEXITSTATUS(status)}"
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and passed_names == expected and not failures:
        return True, f"{len(expected)} tests passed"
    if failures:
        return False, f"failed {failures[0]}"
    return False, f"tests passed {len(passed_names)} of {len(expected)} ({exit_reason})"


def make_undumpable():
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def private_directory():
    """A fresh directory in $TMPDIR, else in /tmp: behind a user-given prefix the caller's $TMPDIR
    (nox sets one inside its venv) may be hidden or read-only."""
    error = None
    for base in dict.fromkeys((os.environ.get("TMPDIR") or "/tmp", "/tmp")):
        path = os.path.join(base, f"grpo-bench-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o755)
            return path
        except OSError as failed:
            error = failed
    raise error


def run_job(candidate, tests, limits, uid):
    """The verdict ``(passed, reason, output head)`` of one job."""
    try:
        expected = listed_tests(tests)
    except SyntaxError as error:
        return False, f"test code does not parse: {describe(error)}", ""
    if not expected:
        return False, "test code defines no test_* function", ""
    workdir = private_directory()
    for name, text in (("candidate.py", candidate), ("test_candidate.py", tests)):
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
    output = os.open(os.path.join(workdir, "output.log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    dropped = confine(limits, uid)
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
        os.chdir(os.path.dirname(workdir))
        run_tests(workdir, expected, write_end)
    os.close(write_end)
    if not dropped:
        make_undumpable()
    reports = read_reports(read_end)
    _, status = os.waitpid(pid, 0)
    passed, reason = judge(expected, reports, status)
    return passed, reason, os.pread(output, OUTPUT_HEAD_BYTES, 0).decode("utf-8", "replace")


def main(argv):
    limits, uid = parse_confinement(argv[1])
    if len(argv) > 2:
        confine(limits, uid)
        os.execvp(argv[2], argv[2:])
    candidate, tests = marshal.loads(sys.stdin.buffer.read())
    passed, reason, output_head = run_job(candidate, tests, limits, uid)
    sys.stdout.write(f"{'passed' if passed else 'failed'}\n{reason}\n{output_head}")


if __name__ == "__main__":
    main(sys.argv)
