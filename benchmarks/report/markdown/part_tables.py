"""The tables of the other parts: decode (``decode.md``), the context search (``context.md``), reward
throughput (``rewards.md``) and ranks under ZeRO (``distributed.md``)."""

from __future__ import annotations

import pandas as pd

from benchmarks.catalog.profiles import load_hardware, load_shapes
from benchmarks.model.guide import GUIDE_BASE, GUIDE_DTYPE, GUIDE_WORKLOAD
from benchmarks.model.memory.decode_bytes import decode_step_bytes, experts_read, rollout_seconds
from benchmarks.model.memory.predict import GIB, NF4_BYTES_PER_PARAM
from benchmarks.report import frames
from benchmarks.report.markdown import time_tables
from benchmarks.results.schema import ContextFile, DecodeFile, Result, RewardsFile, RolloutShape
from benchmarks.run.max_context import contender_runs


def decode_table(results: list[Result]) -> str:
    """Rollout seconds per GRPO step: the newest decode file's projections, each machine's own
    class at its measured ceiling; then the measured decode points of each machine's newest sweep."""
    decodes = [r for r in results if isinstance(r.record, DecodeFile) and r.record.projections]
    if not decodes:
        return "No decode result yet.\n"
    newest = {r.hardware: r for r in decodes}  # each machine's newest file
    others = frames.projections(decodes[-1].record)  # the spec and budget columns: the newest file's
    others = others[others.hardware != decodes[-1].hardware].assign(column=lambda f: f.hardware + " (" + f.basis + ")")
    own = [
        frames.projections(r.record).query("hardware == @hardware").assign(column=f"{hardware} (its measured ceiling)")
        for hardware, r in newest.items()
    ]
    long = pd.concat([others, *own])
    columns, sizes = list(dict.fromkeys(long.column)), list(dict.fromkeys(long["size"]))
    table = long.pivot_table(index="size", columns="column", values="rollout_s", aggfunc="last")
    table = table.reindex(index=sizes, columns=columns).map(lambda c: f"{c:,.1f}" if c == c and c else "")
    table.insert(0, "size class", sizes)
    rollout = decodes[-1].record.projection_rollout
    lines = [
        f"Predicted rollout seconds of one GRPO step ({rollout.sequences} sequences x "
        f"{rollout.completion_tokens} tokens after {rollout.prompt_tokens}-token prompts, "
        f"{rollout.dtype_bytes:g} bytes per weight and KV element): every weight and the whole KV cache "
        "read once per decode step, at the column's bandwidth. A machine's own column uses the ceiling it "
        "measured (file named below); the others use the spec or the stated budget.",
        "",
        frames.markdown(table, numeric=tuple(columns)),
        "",
        "Measured decode (batch 1, each machine's newest sweep):",
        "",
    ]
    measured = []
    for hardware, result in {r.hardware: r for r in decodes if r.record.sweep}.items():
        points = frames.sweep(result.record).query("status == 'ok' and batch == 1")
        for point in points.itertuples():
            measured.append(
                {
                    "machine": hardware,
                    "file": result.path + ("" if result.complete else " (ended early: its points so far)"),
                    "engine": point.engine,
                    "context": str(point.context),
                    "GB/s": f"{point.achieved_gb_s:.2f}",
                    "of ceiling": f"{point.efficiency_vs_ceiling:.0%}",
                }
            )
    columns = ["machine", "file", "engine", "context", "GB/s", "of ceiling"]
    lines.append(frames.markdown(pd.DataFrame(measured, columns=columns), numeric=("context", "GB/s", "of ceiling")))
    lines += ["", *precision_rows(rollout)]
    spark_levers = GUIDE_BASE.changed(model="lora", gradient_checkpointing=True)
    lines += ["", *time_tables.spark_rows(GUIDE_WORKLOAD, spark_levers, GUIDE_DTYPE)]
    return "\n".join(lines) + "\n"


# Precisions of the engine's weights and KV cache (bytes per element), for dense and MoE shapes.
PRECISIONS = (
    ("bf16", 2.0, 2.0),
    ("FP8 weights", 1.0, 2.0),
    ("FP8 weights and KV cache", 1.0, 1.0),
    ("4-bit NF4 weights", NF4_BYTES_PER_PARAM, 2.0),
)
PRECISION_SHAPES = ("8b", "70b", "qwen3-30b-a3b", "gpt-oss-20b")
PRECISION_BANDWIDTHS = (("rtx4090", "spec"), ("h200", "spec"), ("b200", "spec"), ("spark", "sustained budget"))


def precision_rows(rollout: RolloutShape) -> list[str]:
    """Rollout seconds of the same GRPO step by the engine's precision, dense against MoE shapes (all of a
    MoE's experts resident, only those its batch routes to read), at the spec or budget bandwidths."""
    shapes, catalog = load_shapes(), load_hardware()
    rows = []
    for name in PRECISION_SHAPES:
        shape = shapes[name]
        for label, weight_bytes, kv_bytes in PRECISIONS:
            step = decode_step_bytes(shape, weight_bytes, rollout.sequences, rollout.prompt_tokens, kv_bytes)
            row = {
                "size class": name,
                "precision": label,
                "resident GiB": f"{shape.param_count() * weight_bytes / GIB:.1f}",
                "weights read a step GiB": f"{step.weights / GIB:.1f}",
                "experts read a step": (
                    f"{experts_read(shape, rollout.sequences):.0f} of {shape.num_experts}" if shape.moe else "dense"
                ),
            }
            for hardware, basis in PRECISION_BANDWIDTHS:
                entry = catalog[hardware]
                gb_s = entry.spec_bandwidth_gb_s if basis == "spec" else entry.sustained_bandwidth_gb_s[0]
                seconds = rollout_seconds(
                    shape,
                    weight_bytes,
                    rollout.sequences,
                    rollout.prompt_tokens,
                    rollout.completion_tokens,
                    gb_s,
                    kv_bytes,
                )
                row[f"{hardware} ({basis}, {gb_s:g} GB/s)"] = f"{seconds:,.1f}"
            rows.append(row)
    frame = pd.DataFrame(rows)
    return [
        f"By precision, dense and MoE (predicted, the same {rollout.sequences} x {rollout.completion_tokens}-token "
        "rollout; rollout seconds at each bandwidth): weights and KV cache in the stated bytes per element; a MoE "
        "keeps every expert resident and reads, each decode step, its attention, routers and the experts the "
        "batch routes to (uniform routing: the most a batch touches on average).",
        "",
        frames.markdown(
            frame,
            numeric=tuple(c for c in frame.columns if c not in ("size class", "precision", "experts read a step")),
        ),
    ]


def context_table(results: list[Result]) -> str:
    found = [r for r in results if isinstance(r.record, ContextFile)]
    if not found:
        return "No context result yet.\n"
    lines = []
    for result in found:
        search = result.record.search
        ratios = contender_runs.ratios(result.record.contenders)  # made again from the probes, as the verdict below
        rows = []
        for entry in frames.contenders(result.record).itertuples():
            row = ratios.get(entry.name, {})
            if entry.status != "measured":
                reason = entry.reason or ""
                short = reason if len(reason) <= 160 else reason[:157] + "..."
                rows.append([entry.name, f"{entry.status}: {short}", "", "", "", "", ""])
                continue
            best = entry.max_completion_tokens
            best_text = "none" if pd.isna(best) else f">= {best:.0f}" if entry.at_ceiling else f"{best:.0f}"
            rows.append(
                [
                    entry.name,
                    "measured",
                    best_text,
                    frames.count(entry.first_failing_tokens or None),
                    frames.count(entry.predicted_max_completion_tokens or None),
                    _ratio(row, "trl-1.14.2"),
                    _ratio(row, "trl-1.16"),
                ]
            )
        header = ["contender", "status", "max completion tokens", "first failing", "predicted max"]
        header += ["vs TRL 1.14.2", "vs TRL 1.16"]
        cuda = "cuda" in search.budget_enforced_by
        lines += [
            f"{result.hardware}, {result.shape} {search.dtype}, "
            f"budget {search.budget_gib:g} GiB, {search.completions_per_step} completions per step "
            f"({result.path}, {result.date}):",
            "",
            frames.markdown(pd.DataFrame(rows, columns=header), numeric=tuple(header[2:])),
            "",
            f"Verdict: {contender_runs.verdict(result.record.contenders, ratios, cuda).text}",
            "",
        ]
    return "\n".join(lines) + "\n"


def _ratio(row: dict[str, float | None], reference: str) -> str:
    measured, predicted = row.get(f"measured_vs_{reference}"), row.get(f"predicted_vs_{reference}")
    if measured is None:
        return ""
    return f"{measured:.2f}x (predicted {predicted:.2f}x)" if predicted else f"{measured:.2f}x"


def rewards_table(results: list[Result]) -> str:
    """Per reward of ours: the largest batch compared with the guide's code (else the largest batch),
    its completions/s beside the guide's."""
    newest = {r.hardware: r for r in results if isinstance(r.record, RewardsFile)}
    if not newest:
        return "No reward result yet.\n"
    rows = []
    for hardware, result in newest.items():
        frame = frames.reward_rows(result.record)
        case = ["reward", "batch", "words", "format"]
        seeds = frame[frame.implementation == "seed"].set_index(case).completions_per_s
        ours = frame[(frame.implementation == "grpo-bench") & (frame.format == "str")]
        for reward, mine in ours.groupby("reward", sort=True):
            paired = mine[[key in seeds.index for key in mine[case].itertuples(index=False, name=None)]]
            row = (
                (paired if len(paired) else mine)
                .sort_values(["batch", "words"], ascending=[False, True], kind="stable")
                .iloc[0]
            )
            key = (reward, row.batch, row.words, row.format)
            seed_rate = seeds.get(key) if key in seeds.index else None
            rows.append(
                {
                    "machine": hardware,
                    "reward": reward,
                    "batch": str(row.batch),
                    "words": str(row.words),
                    "completions/s": f"{row.completions_per_s:,.0f}",
                    "guide's code": f"{seed_rate:,.0f}" if seed_rate else "",
                    "ratio": f"{row.completions_per_s / seed_rate:.1f}x" if seed_rate else "",
                    "file": result.path,
                }
            )
    table = frames.markdown(pd.DataFrame(rows), numeric=("batch", "words", "completions/s", "guide's code", "ratio"))
    return "\n".join([table, "", *time_tables.reward_share_rows(results)]) + "\n"


def distributed_table(results: list[Result]) -> str:
    """Per rank of each many-ranks configuration: how it really ran (world size, accelerate's type, the
    ZeRO stage, the share of the parameters a rank held), the model states the rank held against the
    analytic model's for that rank, its headline peak and step time."""
    found = frames.ranks(results)
    if found.empty:
        return "No many-ranks result yet (`nox -s bench -- --only distributed`).\n"
    rows, notes = [], []
    for _, row in found.iterrows():
        states = row.states
        stage = f", ZeRO-{row.zero_stage:.0f}" if not pd.isna(row.zero_stage) else ""
        held = row.held_parameter_fraction
        terms = (
            " / ".join(f"{getattr(states, t) / GIB:.2f}" for t in ("parameters", "master", "optimizer", "gradients"))
            if states
            else ""
        )
        rows.append(
            {
                "file": row.file,
                "configuration": row.configuration,
                "ran as": f"{frames.count(row.world_size, '?')} x {row.distributed_type}{stage}"
                if row.status == "ok"
                else f"{row.status}: {row.reason}",
                "rank": f"{row.rank_number}",
                "params held": "" if held is None or pd.isna(held) else f"{held:.0%}",
                "model states GiB: params / master / optimizer / grads": terms,
                "model states GiB": f"{states.total / GIB:.2f}" if states else "",
                "predicted GiB": f"{row.predicted_states_bytes / GIB:.2f}",
                "error": f"{states.total / row.predicted_states_bytes - 1:+.1%}" if states else "",
                "peak GiB": "" if pd.isna(row.peak_bytes) else f"{row.peak_bytes / GIB:.2f}",
                "s/step": "" if pd.isna(row.step_s) else f"{row.step_s:.1f}",
            }
        )
        if row.peak_measure and row.peak_measure not in notes:
            notes.append(row.peak_measure)
    table = frames.markdown(pd.DataFrame(rows), numeric=("rank", "params held", "model states GiB", "predicted GiB"))
    legend = (
        "Model states are read from each rank's tensors after an optimizer step: its parameter storage (a "
        "ZeRO-3 partition where parameters are partitioned), DeepSpeed's fp32 master partition, the optimizer's "
        "states and the gradient storage still held. Predicted: `estimate.rank_model_states` for that rank, "
        "gradients included: ZeRO-2 holds its gradient partition through backward and frees it after the step, "
        "so its measured rows lack that term (ZeRO-3 keeps its flat gradient buffer). Peak: "
        + "; ".join(notes)
        + " of that rank."
    )
    return table + "\n\n" + legend + "\n"
