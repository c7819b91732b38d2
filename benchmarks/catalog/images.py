"""The GPU images the device scripts run in (``profiles/images.toml``), and the guard that makes an interpreter here
see only what an image holds: every top-level module of an installed distribution outside the image's packages and
the wheels its script carries is made absent (``sys.modules[name] = None``: its import fails, ``find_spec`` finds
nothing), as it is there. Standard library only: it runs at an interpreter's start.

    python -m benchmarks.catalog.images check h200   # this environment against the image: exit 1 naming the extras
"""

from __future__ import annotations

import functools
import platform
import re
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata

from benchmarks import REPO


@dataclass(frozen=True)
class Image:
    name: str
    source: str
    python: str
    versions: dict[str, str]
    packages: tuple[str, ...]  # distribution names, as the image lists them
    carried: tuple[str, ...]  # the wheels its script carries: pinned requirements
    rehearsed: tuple[str, ...]  # what a rehearsal installs of ``packages``

    @property
    def allowed(self) -> set[str]:
        """Every distribution an interpreter on the image can import, names normalised."""
        return {normalise(name) for name in self.packages} | {normalise(r.split("==")[0]) for r in self.carried}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def load_images() -> dict[str, Image]:
    with (REPO / "profiles" / "images.toml").open("rb") as file:
        tables = tomllib.load(file)
    listed = {"packages", "carried", "rehearsed"}
    return {
        name: Image(name=name, **{k: tuple(v) if k in listed else v for k, v in table.items()})
        for name, table in tables.items()
    }


def reachable(image: Image) -> set[str]:
    """The image's distributions and everything those installed here require, transitively: a newer release here
    may need a dependency the image's own release does not (``check`` names them)."""
    found, todo = set(image.allowed), list(image.allowed)
    while todo:
        try:
            requires = metadata.requires(todo.pop()) or []
        except metadata.PackageNotFoundError:  # listed by the image, not installed here
            continue
        for requirement in requires:
            if "extra ==" not in requirement:
                name = normalise(re.match(r"[A-Za-z0-9._-]+", requirement).group())
                todo += [] if name in found else [name]
                found.add(name)
    return found


def refused_modules(image: Image) -> set[str]:
    """Top-level modules that only distributions outside ``image`` provide."""
    allowed = reachable(image)
    refused = set()
    for module, distributions in metadata.packages_distributions().items():
        if all(normalise(d) not in allowed for d in distributions) and module not in sys.stdlib_module_names:
            refused.add(module)
    return refused - {"benchmarks", "rewards"}


def install(name: str) -> None:
    """From here on, this interpreter imports only what image ``name`` holds."""
    for module in refused_modules(load_images()[name]):
        sys.modules.setdefault(module, None)  # a module already imported stays


def main(argv: list[str]) -> int:
    """``check IMAGE``: this environment's distributions against the image's; exit 1 naming those outside it."""
    if len(argv) != 2 or argv[0] != "check" or argv[1] not in load_images():
        print(f"usage: python -m benchmarks.catalog.images check {{{','.join(load_images())}}}", file=sys.stderr)
        return 2
    image = load_images()[argv[1]]
    installed, allowed = _installed(), reachable(image)
    extra = {name: v for name, v in installed.items() if name not in allowed and name != "grpo-bench"}
    for name, version in sorted(extra.items()):
        print(f"{name} {version}: not on the {image.name} image ({image.source})")
    pulled = sorted(set(installed) & allowed - image.allowed)
    if pulled:
        print(f"not in the image's list, required here by a newer release of one of its packages: {', '.join(pulled)}")
    here = {**installed, "python": platform.python_version()}
    for name, version in sorted({**image.versions, "python": image.python}.items()):
        if name in here and not here[name].startswith(version):
            print(f"{name}: {here[name]} here, {version} on the {image.name} image (the nearest build here)")
    return 1 if extra else 0


def _installed() -> dict[str, str]:
    return {normalise(d.metadata["Name"]): d.version for d in metadata.distributions()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
