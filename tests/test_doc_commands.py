"""Every `estimate` and `plan` command the README and the docs show runs, and its verdict agrees with the
sizing table's cell it illustrates: one answer from the command line and the tables."""

import re
import shlex
from dataclasses import fields, replace
from pathlib import Path

import pytest

from benchmarks.catalog.profiles import Levers, load_hardware
from benchmarks.cli import main
from benchmarks.commands.estimate import parse_levers
from benchmarks.model import guide
from benchmarks.report.markdown import sizing

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:python -m benchmarks|nox -s ask --) ((?:estimate|plan)\b[^`\n]*)")


def shown_commands() -> list[tuple[str, str]]:
    """(document, the command's arguments) for each one shown: in code blocks, and inline, wrapped or not."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        inline = re.findall(r"`([^`]+)`", text)
        spans = [" ".join(s.split()) for s in inline] + re.sub(r"`[^`]+`", "", text).splitlines()
        for span in spans:
            found += [(doc.name, m.group(1).strip()) for m in COMMAND.finditer(span)]
    return sorted(set(found))


def test_the_docs_show_estimate_and_plan():
    commands = [c for _, c in shown_commands()]
    assert any(c.startswith("estimate") for c in commands) and any(c.startswith("plan") for c in commands)


def ladder_index(levers: Levers) -> int:
    """The rung of the sizing ladder a command's levers are, or a test failure naming them."""
    for index, (_, change) in enumerate(guide.LADDER):
        if replace(guide.GUIDE_BASE, **change) == levers:
            return index
    differing = guide.differing(levers, guide.GUIDE_BASE)
    raise AssertionError(f"levers {differing}: no lever set of the sizing table, so no cell to agree with")


@pytest.mark.parametrize("doc,command", shown_commands())
def test_a_shown_command_runs_and_agrees_with_its_sizing_cell(doc, command, capsys):
    argv = shlex.split(command)
    status = main(argv)
    out = capsys.readouterr().out
    option = dict(zip(argv[1::2], argv[2::2]))  # --flag value pairs (flags without a value pair off harmlessly)
    card = load_hardware()
    if argv[0] == "plan":
        assert status == 0 and "* the Pareto front" in out
        return
    hardware = card[option["--hardware"]]
    levers, given = parse_levers([v for k, v in zip(argv, argv[1:]) if k == "--levers"])
    cell = sizing.predicted_cell(option["--shape"], hardware)
    rung = ladder_index(replace(levers, **{f.name: getattr(guide.GUIDE_BASE, f.name) for f in fields(Levers)
                                           if f.name not in given}))  # fmt: skip
    cell_rung = next(i for i, (label, _) in enumerate(guide.LADDER) if cell.label.startswith(label + ",") or
                     cell.label == label)  # fmt: skip
    fits = "\nfits (predicted)" in out
    assert status == (0 if fits else 1), f"{doc}: {command}"
    if "--min-gpus" in argv:
        count = int(re.search(r" on (\d+) x ", out).group(1))
        assert count >= cell.count and (rung != cell_rung or count == cell.count), f"{doc}: {command}: {out}"
    elif rung == cell_rung:
        assert fits == (cell.count == 1), f"{doc}: {command}"
    elif rung < cell_rung:
        assert not fits, f"{doc}: {command}: lighter than the cell's lever set, yet it fits"
