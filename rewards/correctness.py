"""Verifiable-answer rewards: exact match against a gold column, and JSON Schema conformance."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from ._completions import completion_texts, per_example

ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)  # the guide's pattern, compiled once
EXACT_MATCH_REWARD = 2.0  # the guide's value, kept so existing reward weights still hold


def correctness_reward(completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """2.0 if the first ``<answer>`` block equals the gold ``answer`` (both stripped), else 0.0.

    ``answer`` is the dataset column, aligned index for index with ``completions``; a gold
    of ``None`` returns ``None`` (TRL skips that example); other golds compare as ``str``.

    >>> correctness_reward(["<answer> 4 </answer>", "<answer>5</answer>", "4"], answer=["4", "4", "4"])
    [2.0, 0.0, 0.0]
    """
    golds = per_example("answers", answer, completions)
    search = ANSWER_BLOCK.search
    return [
        None
        if gold is None
        else EXACT_MATCH_REWARD
        if (match := search(text)) and match.group(1).strip() == (gold if type(gold) is str else str(gold)).strip()
        else 0.0
        for text, gold in zip(completion_texts(completions), golds)
    ]


# Keywords whose meaning is the same in draft-07 (fastjsonschema's newest) and in 2020-12
# (what jsonschema applies to a schema without "$schema"); "format" is an annotation in both,
# as compiled here. A schema using only these compiles to plain Python with fastjsonschema;
# any other goes to jsonschema. A test checks that both give the same verdicts.
PORTABLE_KEYWORDS = frozenset(
    "type enum const maximum exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern maxItems "
    "minItems uniqueItems maxProperties minProperties required properties patternProperties additionalProperties "
    "items contains propertyNames allOf anyOf oneOf not if then else title description default examples format "
    "$comment readOnly writeOnly".split()
)
SUBSCHEMA = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else")


def portable(schema: Any) -> bool:
    """Whether fastjsonschema gives this schema (no ``$schema``) the meaning jsonschema does."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not PORTABLE_KEYWORDS.issuperset(schema):
        return False
    children = [schema[k] for k in SUBSCHEMA if k in schema]
    children += [s for k in ("properties", "patternProperties") for s in schema.get(k, {}).values()]
    children += [s for k in ("allOf", "anyOf", "oneOf") for s in schema.get(k, [])]
    return all(portable(child) for child in children)


@functools.lru_cache(maxsize=1024)
def _validity_check(schema_json: str) -> Callable[[Any], bool]:
    # Imported where a schema is checked: the harness imports this package on machines without them (a GPU
    # image that carries only what the GRPO worker needs), where no schema reward runs.
    import fastjsonschema
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    if portable(schema):
        try:
            compiled = fastjsonschema.compile(schema, use_formats=False)
        except fastjsonschema.JsonSchemaDefinitionException:
            return cls(schema).is_valid

        def is_valid(instance: Any) -> bool:
            try:
                compiled(instance)
                return True
            except fastjsonschema.JsonSchemaValueException:
                return False

        return is_valid
    return cls(schema).is_valid


def _compiled(schema: Any, where: str) -> Callable[[Any], bool]:
    """``instance -> bool`` for ``schema``: checked against its metaschema once, compiled once,
    cached by content."""
    import jsonschema

    try:
        return _validity_check(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as error:
        raise ValueError(f"{where} is not a valid JSON Schema: {error.message}") from None
    except TypeError as error:
        raise TypeError(f"{where} is not JSON: {error}") from None


def schema_reward(completions: Sequence[Any], output_schema: Any, **kwargs: Any) -> list[float | None]:
    """1.0 if the completion parses as JSON and conforms to its schema, else 0.0.

    ``output_schema`` is one JSON Schema (a dict, or a bool) for the whole batch, or a
    per-example column of them; a per-example ``None`` returns ``None``. Each distinct
    schema is checked against its metaschema once and compiled once, not on every call
    (to plain Python with fastjsonschema where its meaning is portable, else jsonschema).

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
            rewards.append(1.0 if validator(json.loads(text)) else 0.0)
        except (ValueError, RecursionError):  # not JSON, or nested past the interpreter's limit
            rewards.append(0.0)
    return rewards
