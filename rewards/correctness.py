"""Verifiable-answer rewards: exact match against a gold column, and JSON Schema conformance."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import jsonschema
from jsonschema.validators import validator_for

from ._completions import completion_texts, per_example

EXACT_MATCH_REWARD = 2.0  # the seed library's value, kept so existing reward weights still hold


def answer_block(text: str) -> str | None:
    """The first ``<answer>...</answer>`` block's inside: what the seed's
    ``re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)`` captures, found with ``str.find``."""
    start = text.find("<answer>")
    if start == -1:
        return None
    end = text.find("</answer>", start + len("<answer>"))
    return None if end == -1 else text[start + len("<answer>") : end]


def correctness_reward(completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """2.0 if the first ``<answer>`` block equals the gold ``answer`` (both stripped), else 0.0.

    ``answer`` is the dataset column, aligned index for index with ``completions``; a gold
    of ``None`` returns ``None`` (TRL skips that example); other golds compare as ``str``.

    >>> correctness_reward(["<answer> 4 </answer>", "<answer>5</answer>", "4"], answer=["4", "4", "4"])
    [2.0, 0.0, 0.0]
    """
    golds = per_example("answers", answer, completions)
    rewards: list[float | None] = []
    for text, gold in zip(completion_texts(completions), golds):
        if gold is None:
            rewards.append(None)
            continue
        predicted = answer_block(text)
        rewards.append(EXACT_MATCH_REWARD if predicted is not None and predicted.strip() == str(gold).strip() else 0.0)
    return rewards


@functools.lru_cache(maxsize=1024)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _compiled(schema: Any, where: str) -> jsonschema.protocols.Validator:
    """A validator for ``schema``, checked against its metaschema once and cached by content."""
    try:
        return _validator(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as error:
        raise ValueError(f"{where} is not a valid JSON Schema: {error.message}") from None
    except TypeError as error:
        raise TypeError(f"{where} is not JSON: {error}") from None


def schema_reward(completions: Sequence[Any], output_schema: Any, **kwargs: Any) -> list[float | None]:
    """1.0 if the completion parses as JSON and conforms to its schema, else 0.0.

    ``output_schema`` is one JSON Schema (a dict, or a bool) for the whole batch, or a
    per-example column of them; a per-example ``None`` returns ``None``. Each distinct
    schema is checked against its metaschema once and compiled once, not on every call.

    >>> schema = {"type": "object", "required": ["x"]}
    >>> schema_reward(['{"x": 1}', '{"y": 1}', "not json"], output_schema=schema)
    [1.0, 0.0, 0.0]
    """
    texts = completion_texts(completions)
    if isinstance(output_schema, (dict, bool)):
        validator = _compiled(output_schema, "output_schema")
        validators: list[Any] = [validator] * len(texts)
    else:
        schemas = per_example("schemas", output_schema, completions)
        by_identity: dict[int, Any] = {}
        validators = []
        for index, schema in enumerate(schemas):
            if schema is not None and id(schema) not in by_identity:
                by_identity[id(schema)] = _compiled(schema, f"output_schema[{index}]")
            validators.append(None if schema is None else by_identity[id(schema)])
    rewards: list[float | None] = []
    for text, validator in zip(texts, validators):
        if validator is None:
            rewards.append(None)
            continue
        try:
            rewards.append(1.0 if validator.is_valid(json.loads(text)) else 0.0)
        except (ValueError, RecursionError):  # not JSON, or nested past the interpreter's limit
            rewards.append(0.0)
    return rewards
