"""Published GPU figures as cited data (``results/published/<source>.toml``): one file per source, each entry the
setup as its source states it, the figures as stated with their units, how it maps to the suite's shapes, cards
and levers (or why it cannot), and its role: ``calibration`` entries may tune the models' GPU constants,
``held-out`` entries only score them. Checked on load: a bad entry is an error naming the file, the entry and the
key."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.catalog import profiles, toml_tables
from benchmarks.catalog.levers import ProfileError

PUBLISHED = REPO / "results" / "published"
ROLES = ("calibration", "held-out")
# What a figure measures, the units it may be stated in, and what the models predict for it.
KINDS = {
    "memory": ("GB", "GiB"),  # peak memory per GPU
    "min_gpus": ("GPUs",),  # the fewest GPUs that run the setup
    "time": ("s", "seconds"),  # seconds an optimizer step
    "throughput": ("tokens/s/GPU",),  # tokens a second per GPU
    # an inference engine's batch: its output tokens a second, its whole time, or its requests a second
    "decode": ("tokens/s", "ms", "requests/s"),
    # a training run's tokens a second per GPU (pretraining or fine-tuning: forward, backward and optimizer, no rollout)
    "training": ("tokens/s/GPU",),
    "context": ("tokens", "K tokens"),  # the longest context a setup trains at
    "relative": ("%", "x", "GB"),  # a saving or a ratio against another setup (sleep mode's, a loss's)
}
# the kinds the models predict: only these are mapped
SCORED = ("memory", "min_gpus", "time", "throughput", "decode", "training")
UNIT_BYTES = {"GB": 1e9, "GiB": 2**30}


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    words: str = ""  # the source's own words around the figure, where the unit alone does not say it


@dataclass(frozen=True)
class Setup:
    """The setup as the source states it; what it does not state stays None."""

    framework: str
    model: str
    gpu: str
    gpus: int | None = None
    precision: str | None = None
    method: str | None = None
    algorithm: str | None = None
    generation: str | None = None
    prompts_per_step: int | None = None
    generations_per_prompt: int | None = None
    max_prompt_tokens: int | None = None
    max_completion_tokens: int | None = None
    parallelism: str | None = None
    stated: dict[str, Any] = field(default_factory=dict)  # other settings, in the source's words


@dataclass(frozen=True)
class Mapping:
    """The suite's own terms for the setup: a shape, a card, the levers over the guide's defaults, one rank's
    prompt length; and what the suite approximates (tensor parallelism by ZeRO-3, ...)."""

    shape: str
    card: str
    levers: dict  # a partial table of levers, checked as a profile's are
    prompt_tokens: int
    gpus: int
    approximations: str = ""
    mean_completion: float = 0.0  # the completions' mean length where the source states it (0: all at the longest)
    sequences: int = 0  # decode: the engine's batch, over ``gpus`` GPUs in tensor parallel
    completion_tokens: int = 0  # decode: the tokens each sequence generates
    max_num_seqs: int = 0  # decode: the sequences the engine runs at once where it is given more (0: all at once)
    sequence_tokens: int = 0  # training: each trained sequence's length (no prompt: every token is trained)
    packed: bool = False  # the framework packs each micro-batch's sequences without padding (verl, NeMo RL)
    counts_prompts: bool = False  # throughput: the stated tokens are prompts' and completions' (verl's perf/throughput)
    dtype: str = "bfloat16"  # the policy's weights as the framework loads them


@dataclass(frozen=True)
class Entry:
    id: str
    role: str
    kind: str
    figure: str  # the key of ``figures`` the models are scored on
    quote: str  # the source's words the figures are copied from
    setup: Setup
    figures: dict[str, Figure]
    mapping: Mapping | None = None
    unmapped: str = ""  # why no mapping, where there is none
    source: str = ""  # the file's stem, set on load

    @property
    def stated(self) -> Figure:
        return self.figures[self.figure]


@dataclass(frozen=True)
class Source:
    project: str
    document: str
    locator: str  # a page address, or github:OWNER/REPO/PATH@COMMIT
    read: datetime.date
    entries: tuple[Entry, ...]


def load(directory: Path = PUBLISHED) -> list[Source]:
    """Every source under ``directory``, checked."""
    return [load_source(path) for path in sorted(directory.glob("*.toml"))]


def entries(directory: Path = PUBLISHED) -> list[Entry]:
    return [e for source in load(directory) for e in source.entries]


def load_source(path: Path) -> Source:
    data = toml_tables.read_table(path)
    file = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    head = {k: v for k, v in data.items() if k != "entry"}
    for key in ("project", "document", "locator", "read"):
        if not head.get(key):
            raise ProfileError(f"{file}: missing key {key}")
    if not isinstance(head["read"], datetime.date):
        raise ProfileError(f"{file}: read: {head['read']!r} is not a date (YYYY-MM-DD)")
    unknown = set(head) - {"project", "document", "locator", "read"}
    if unknown:
        raise ProfileError(f"{file}: unknown key {sorted(unknown)[0]}")
    found = tuple(_entry(item, f"{file}: entry {i} ({item.get('id', 'no id')})", path.stem)
                  for i, item in enumerate(data.get("entry", [])))  # fmt: skip
    if not found:
        raise ProfileError(f"{file}: no [[entry]]")
    ids = [e.id for e in found]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ProfileError(f"{file}: entry id {twice[0]!r} given twice")
    return Source(head["project"], head["document"], head["locator"], head["read"], found)


ENTRY_TEXT = ("id", "role", "kind", "figure", "quote")  # required, each a string


def _entry(item: dict, where: str, source: str) -> Entry:
    data = dict(item)
    allowed = {f.name for f in dataclasses.fields(Entry)} - {"source"}
    for key in data:
        if key not in allowed:
            raise ProfileError(f"{where}: unknown key {key}")
    for key in (*ENTRY_TEXT, "setup", "figures"):
        if key not in data:
            raise ProfileError(f"{where}: missing key {key}")
    for key in (*ENTRY_TEXT, "unmapped"):
        if not isinstance(data.get(key, ""), str):
            raise ProfileError(f"{where}: {key}: expected a string, got {data[key]!r}")
    setup = dict(data["setup"])
    stated = setup.pop("stated", {})
    entry = Entry(
        **{key: data[key] for key in ENTRY_TEXT},
        setup=dataclasses.replace(toml_tables.build(Setup, setup, where, "setup."), stated=stated),
        figures={k: toml_tables.build(Figure, v, where, f"figures.{k}.") for k, v in data["figures"].items()},
        mapping=toml_tables.build(Mapping, data["mapping"], where, "mapping.") if "mapping" in data else None,
        unmapped=data.get("unmapped", ""),
        source=source,
    )
    _check(entry, where)
    return entry


def _check(entry: Entry, where: str) -> None:
    if entry.role not in ROLES:
        raise ProfileError(f"{where}: role: {entry.role!r} is not one of {', '.join(ROLES)}")
    if entry.kind not in KINDS:
        raise ProfileError(f"{where}: kind: {entry.kind!r} is not one of {', '.join(KINDS)}")
    if entry.mapping is not None and entry.kind not in SCORED:
        raise ProfileError(f"{where}: mapping: a {entry.kind} figure is not scored; say why under unmapped")
    if entry.figure not in entry.figures:
        raise ProfileError(f"{where}: figure: {entry.figure!r} is not a key of figures ({', '.join(entry.figures)})")
    if entry.stated.unit not in KINDS[entry.kind]:
        raise ProfileError(
            f"{where}: figures.{entry.figure}.unit: {entry.stated.unit!r} is not a unit of {entry.kind} "
            f"({', '.join(KINDS[entry.kind])})"
        )
    if not entry.quote.strip():
        raise ProfileError(f"{where}: quote: empty; copy the source's words the figures come from")
    if (entry.mapping is None) == (not entry.unmapped):
        raise ProfileError(f"{where}: give a mapping or, where none is possible, unmapped with the reason")
    if entry.mapping is not None:
        _check_mapping(entry.mapping, where)
        if entry.kind == "decode" and not (entry.mapping.sequences > 0 and entry.mapping.completion_tokens > 0):
            raise ProfileError(f"{where}: mapping: a decode figure needs its sequences and completion_tokens")
        if (entry.kind == "training") != (entry.mapping.sequence_tokens > 0):
            raise ProfileError(f"{where}: mapping: sequence_tokens is a training figure's, and one it needs")
        if entry.mapping.counts_prompts and entry.kind != "throughput":
            raise ProfileError(f"{where}: mapping: counts_prompts says what a throughput figure's tokens are")


def _check_mapping(mapping: Mapping, where: str) -> None:
    if mapping.shape not in profiles.load_shapes():
        raise ProfileError(f"{where}: mapping.shape: {mapping.shape!r} is not in profiles/shapes.toml")
    if mapping.card not in profiles.load_hardware():
        raise ProfileError(f"{where}: mapping.card: {mapping.card!r} is not in profiles/hardware.toml")
    if mapping.gpus <= 0 or mapping.prompt_tokens + mapping.sequence_tokens <= 0:
        raise ProfileError(
            f"{where}: mapping.gpus and mapping.prompt_tokens (training: sequence_tokens) must be positive"
        )
    if mapping.dtype not in profiles.DTYPES:
        raise ProfileError(f"{where}: mapping.dtype: {mapping.dtype!r} is not one of {', '.join(profiles.DTYPES)}")
    # each lever as the command line checks it: a name it knows, a value it accepts
    toml_tables.build(profiles.Levers, mapping.levers, where, "mapping.levers.", partial=True)
    for name, value in mapping.levers.items():
        profiles.check_lever(name, value, where, f"mapping.levers.{name}")
