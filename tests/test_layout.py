"""The package's rooms and floors, checked from its source: catalogs -> the memory model -> the time model -> the
search -> result files -> running (the machine, then each part) -> reports (tables, then the site) -> the commands.
A module imports only from its own floor or below, no import circle exists, no module imports the suite's own code
inside a function (the way an import circle hides), and no two modules or rooms are named for the same word."""

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "benchmarks"
# Each room (a package, or a module of the package's root) on its floor, lower floors first; a module may import
# from its own floor and from those below it.
FLOORS = {
    "benchmarks": 0,  # the package root: REPO only
    "catalog": 0,  # profiles, levers, shapes, hardware, stacks, machines, published sources
    "model.memory": 1,  # the memory model: bytes per term and phase, ranks' states, a lever set's placement
    "model.time": 2,  # the time model: work and rates, the engine's rollout, the phases' seconds, calibration
    "model": 3,  # the shared recipe and defaults, the search, a profile against both models
    "results": 4,  # the result files' schema, writer and loader
    "run": 5,  # what every part shares: offline model directories, physical ceilings
    "run.machine": 6,  # the machine at hand: NVML, preflight, provenance, pace, the bandwidth probe
    "rewardbench": 7,  # the pytest-benchmark reward suite, a runner of its own
    "run.grpo": 8,  # the GRPO chain: configuration, launch, worker, trainer, ranks, sampler, many machines
    "run.decode": 9,  # the decode sweep (its engines start as the GRPO chain starts them)
    "run.max_context": 9,  # the max-context search over the contenders' stacks
    "report": 10,  # what tables and the site share: frames, both models against measurements and published figures
    "report.markdown": 11,  # the tables, the ledger, comparisons and figures
    "report.web": 12,  # the static site
    "commands": 13,  # one module per command a user types, and what each part prints when it ends
    "cli": 14,
    "__main__": 14,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room(module: str) -> str:
    """The deepest room of FLOORS that holds ``module`` (``benchmarks.run.grpo.worker``: ``run.grpo``)."""
    parts = module.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in FLOORS:
            return ".".join(parts[:end])
    return "benchmarks"


def layer(module: str) -> int:
    return FLOORS[room(module)]


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module of the suite, line, inside a function) for every import in ``path``."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names if a.name.startswith("benchmarks")]
                found.extend((name, child.lineno, in_function) for name in names)
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("benchmarks"):
                for alias in child.names:
                    submodule = f"{child.module}.{alias.name}"
                    found.append((submodule if submodule in MODULES else child.module, child.lineno, in_function))
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def test_every_room_has_a_floor():
    packages = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    rooms = {".".join(p.split(".")[1:]) for p in packages if p != "benchmarks"}
    roots = {m.split(".")[1] for m in MODULES if m.count(".") == 1 and m not in packages}
    assert rooms | roots == set(FLOORS) - {"benchmarks"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_from_its_layer_or_below_and_never_inside_a_function(module):
    for imported, line, in_function in imports(MODULES[module]):
        where = f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {imported}"
        assert not in_function, f"{where} inside a function"
        assert layer(imported) <= layer(module), f"{where}, a layer above its own"


def test_no_import_circle():
    graph = {m: {i for i, _, _ in imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail("import circle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for imported in sorted(graph[module]):
            walk(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        walk(module, [])


def test_no_reader_indexes_a_result_by_a_record_s_key():
    """Reports and the command line read result files only through the schema's records: no string
    subscript named like a record's field (Side.files is keyed by kind, and a record's maps by phase)."""
    import dataclasses

    from benchmarks.results import schema

    records = [
        v
        for v in vars(schema).values()
        if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == schema.__name__
    ]
    keys = {f.name for record in records for f in dataclasses.fields(record)}
    readers = {
        m: p for m, p in MODULES.items() if m.startswith(("benchmarks.report", "benchmarks.commands", "benchmarks.cli"))
    }
    found = []
    for path in readers.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)  # a table's new column is not a result read
                and isinstance(node.slice, ast.Constant)
                and node.slice.value in keys
                and not (isinstance(node.value, ast.Attribute) and node.value.attr == "files")
                and not (isinstance(node.value, ast.Name) and node.value.id == "overrides")
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} [{node.slice.value!r}]")
    assert not found, "result keys indexed outside benchmarks/results/schema.py: " + ", ".join(found)


SOURCES = sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "rewards").rglob("*.py"), PACKAGE.parent / "noxfile.py"])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_is_over_400_lines_and_no_function_over_60(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name}: {len(text.splitlines())} lines; split it within its room"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= 60, f"{path.name}:{node.lineno} {node.name}: {length} lines; split it along its paragraphs"


def word(name: str) -> str:
    """A name's word without its inflection: ``estimating`` and ``estimate``, ``plan`` and ``planning``, ``machine``
    and ``machines`` read alike."""
    return re.sub(r"(ning|ing|es|e|s)$", "", name)


def test_no_two_modules_or_rooms_are_named_for_the_same_word():
    """A reader finds a room from its name: the estimate command and the memory model, the plan command and the
    search, must not read alike (pytest's and the stub files' names aside)."""
    named = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.stem not in ("__init__", "__main__", "conftest"):
            named[word(path.stem)].append(str(path.relative_to(PACKAGE.parent)))
    for folder in sorted(p for p in PACKAGE.rglob("*") if (p / "__init__.py").exists()):
        named[word(folder.name)].append(str(folder.relative_to(PACKAGE.parent)) + "/")
    alike = {w: places for w, places in named.items() if len(places) > 1}
    assert not alike, f"named for the same word: {alike}"


def test_a_word_s_inflections_read_alike():
    assert word("estimating") == word("estimate") and word("planning") == word("plan")
    assert word("machines") == word("machine") and word("timing") == word("time")
    assert word("search") != word("plan") and word("predict") != word("estimate")


def test_the_readme_s_layout_names_every_room():
    """Each room of the package has its line in the README's Layout, and the Layout names no room that is gone."""
    layout = (PACKAGE.parent / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w/.]+)` \|", layout, re.MULTILINE))
    rooms = {str(p.parent.relative_to(PACKAGE)) + "/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert listed == rooms | {"cli.py", "device/"}
