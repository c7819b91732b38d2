"""The package's layers, checked from its source: profiles and catalogs -> the model -> result files
-> running -> reports -> the command line. A module imports only from its own layer or below, no
import circle exists, and no module imports the suite's own code inside a function (the way an
import circle hides)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "benchmarks"
# Lower numbers first; a module may import from its own layer and from those below it.
LAYERS = {
    "benchmarks": 0,  # the package root: REPO only
    "catalog": 0,  # profiles, hardware and shape catalogs, contenders
    "model": 1,  # the analytic model: memory terms, decode bytes
    "results": 2,  # the result files' schema, writer and loader
    "run": 3,  # workers and the harness of each part
    "rewardbench": 3,  # the pytest-benchmark reward suite, a runner of its own
    "report": 4,  # tables, comparisons, figures from result files
    "cli": 5,
    "commands": 5,  # one module per command a user types, and what each part prints when it ends
    "__main__": 5,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else parts[0]]


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


def test_every_module_belongs_to_a_layer():
    assert {m.split(".")[1] for m in MODULES if "." in m} <= set(LAYERS)


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
    readers = {m: p for m, p in MODULES.items() if m.startswith("benchmarks.report") or m == "benchmarks.cli"}
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
def test_no_module_is_over_500_lines_and_no_function_over_60(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 500, f"{path.name}: {len(text.splitlines())} lines; split it within its layer"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= 60, f"{path.name}:{node.lineno} {node.name}: {length} lines; split it along its paragraphs"
