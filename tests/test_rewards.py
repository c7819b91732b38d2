"""The pure reward functions on both completion formats, their errors, and their pickling."""

import asyncio
import inspect
import pickle

import pytest

from rewards import (
    correctness_reward,
    format_reward,
    make_async_rubric_judge_reward,
    make_rubric_judge_reward,
    schema_reward,
    with_length_penalty,
)


def as_format(texts, fmt):
    return list(texts) if fmt == "str" else [[{"role": "assistant", "content": t}] for t in texts]


@pytest.fixture(params=["str", "conversational"])
def fmt(request):
    return request.param


FORMAT_CASES = [
    ("<reasoning>r</reasoning><answer>4</answer>", 1.0),  # both blocks, in order
    ("  <reasoning>r\nmore</reasoning>\n\n<answer>4</answer>\n", 1.0),  # whitespace around and between
    ("<answer>4</answer><reasoning>r</reasoning>", 0.0),  # wrong order
    ("<reasoning>r</reasoning><answer>4", 0.0),  # no closing </answer>
    ("<reasoning>r</reasoning><answer>4</answer> trailing", 0.0),  # text after the answer
    ("", 0.0),  # empty
]


def test_format_reward(fmt):
    texts, expected = zip(*FORMAT_CASES)
    assert format_reward(as_format(texts, fmt)) == list(expected)


def test_correctness_reward(fmt):
    texts = [
        "<reasoning>r</reasoning><answer> 42 </answer>",  # match after stripping
        "<answer>41</answer>",  # wrong answer
        "42",  # no answer block
        "<answer>42</answer><answer>7</answer>",  # the first block counts
        "<answer>3</answer>",  # integer gold compares as text
        "<answer>x</answer>",  # gold None: skipped
    ]
    answers = ["42", "42", "42", "42", 3, None]
    assert correctness_reward(as_format(texts, fmt), answer=answers) == [2.0, 0.0, 0.0, 2.0, 2.0, None]


def test_schema_reward_constant_schema(fmt):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    texts = ['{"n": 1}', '{"n": "1"}', '{"m": 1}', "not json", '  {"n": 2}  ', "[" * 100_000]
    # valid; wrong type; missing key; unparsable; whitespace is fine; nested past recursion
    assert schema_reward(as_format(texts, fmt), output_schema=schema) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_schema_reward_per_example_schemas(fmt):
    schemas = [{"type": "integer"}, {"type": "string"}, None, True]
    texts = ["1", "1", "1", '{"anything": []}']
    assert schema_reward(as_format(texts, fmt), output_schema=schemas) == [1.0, 0.0, None, 1.0]


def test_schema_reward_rejects_an_invalid_schema_naming_its_index():
    with pytest.raises(ValueError, match=r"output_schema\[1\] is not a valid JSON Schema"):
        schema_reward(["1", "1"], output_schema=[{"type": "integer"}, {"type": 12}])


@pytest.mark.parametrize(
    "call, lengths",
    [
        (lambda c: correctness_reward(c, answer=["1", "2", "3"]), "3 answers for 2 completions"),
        (lambda c: schema_reward(c, output_schema=[{}, {}, {}]), "3 schemas for 2 completions"),
        (lambda c: make_rubric_judge_reward(PassIfShort(), "r")(c, prompts=["p"]), "1 prompts for 2 completions"),
    ],
)
def test_misaligned_columns_raise_naming_both_lengths(call, lengths):
    with pytest.raises(ValueError, match=lengths):
        call(["a", "b"])


@pytest.mark.parametrize(
    "fn",
    [
        format_reward,
        lambda c: correctness_reward(c, answer=["1", "1"]),
        lambda c: schema_reward(c, output_schema={}),
        with_length_penalty(format_reward),
    ],
)
@pytest.mark.parametrize(
    "bad, what",
    [
        (None, r"completions\[1\] is NoneType"),
        ([{"role": "assistant", "content": None}], r"completions\[1\]: message content is NoneType"),
        (b"bytes", r"completions\[1\] is bytes"),
    ],
)
def test_non_text_completion_raises_type_error_naming_its_index(fn, bad, what):
    with pytest.raises(TypeError, match=what):
        fn(["<answer>1</answer>", bad])


def test_conversational_text_is_the_last_message():
    completion = [
        {"role": "assistant", "content": "calling a tool"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "<reasoning>r</reasoning><answer>4</answer>"},
    ]
    assert format_reward([completion]) == [1.0]


def constant(value):
    return lambda completions, **kwargs: [value] * len(completions)


@pytest.mark.parametrize(
    "base, words, expected",
    [
        (2.0, 3, 2.0),  # at target: no penalty
        (2.0, 13, 1.0),  # 10 tokens over at 0.1 each
        (0.5, 103, 0.0),  # the penalty floors a positive reward at 0.0
        (-1.0, 103, -1.0),  # a negative reward is never raised (the guide's defect)
        (0.0, 103, 0.0),  # zero stays zero
        (None, 103, None),  # a skipped example stays skipped
    ],
)
def test_length_penalty(fmt, base, words, expected):
    wrapped = with_length_penalty(constant(base), target_len=3, penalty_per_token=0.1)
    [reward] = wrapped(as_format([" ".join(["w"] * words)], fmt))
    assert reward == pytest.approx(expected) if expected is not None else reward is None


class CharTokenizer:
    """Counts one token per character, like a Hugging Face tokenizer's batch call."""

    def __call__(self, texts, add_special_tokens=True):
        assert add_special_tokens is False
        return {"input_ids": [list(t) for t in texts]}


def test_length_penalty_counts_tokens_with_a_tokenizer():
    wrapped = with_length_penalty(constant(1.0), target_len=5, penalty_per_token=0.1, tokenizer=CharTokenizer())
    assert wrapped(["abcdefg", "abc"]) == pytest.approx([0.8, 1.0])  # 2 tokens over; 2 words would be none


def test_length_penalty_keeps_the_base_name_and_asyncness():
    assert with_length_penalty(correctness_reward).__name__ == "correctness_reward_length_penalized"

    async def slow_reward(completions, **kwargs):
        return [1.0] * len(completions)

    wrapped = with_length_penalty(slow_reward, target_len=1, penalty_per_token=0.25)
    assert inspect.iscoroutinefunction(wrapped.__call__)
    assert asyncio.run(wrapped(["one two three"])) == [0.5]


class PassIfShort:
    """A judge client: passes responses under 10 characters; records what it was asked."""

    def __init__(self):
        self.requests = []

    def judge(self, rubric, prompt, response, output_format):
        self.requests.append((rubric, prompt, response, output_format))
        return "pass" if len(response) < 10 else "fail"


class AsyncPassIfShort(PassIfShort):
    async def ajudge(self, **request):
        await asyncio.sleep(0)
        return self.judge(**request)


def test_rubric_judge_reward(fmt):
    client = PassIfShort()
    reward = make_rubric_judge_reward(client, rubric="on topic")
    prompts = [[{"role": "user", "content": "q1"}], "q2"]
    assert reward(as_format(["short", "a long response"], fmt), prompts=prompts) == [1.0, 0.0]
    assert client.requests[0] == ("on topic", prompts[0], "short", "pass_fail")


@pytest.mark.parametrize("client_cls", [PassIfShort, AsyncPassIfShort])  # judge in threads; native ajudge
def test_async_rubric_judge_reward(fmt, client_cls):
    reward = make_async_rubric_judge_reward(client_cls(), rubric="r", max_concurrency=2)
    assert inspect.iscoroutinefunction(reward.__call__)
    texts = ["ok", "far too long to pass", "fine"]
    assert asyncio.run(reward(as_format(texts, fmt), prompts=["p"] * 3)) == [1.0, 0.0, 1.0]


def test_parametrised_rewards_round_trip_through_pickle():
    penalized = pickle.loads(pickle.dumps(with_length_penalty(correctness_reward, target_len=1, penalty_per_token=0.5)))
    assert penalized.__name__ == "correctness_reward_length_penalized"
    assert penalized(["one <answer>4</answer>"], answer=["4"]) == [1.5]

    judge = pickle.loads(pickle.dumps(make_rubric_judge_reward(PassIfShort(), "r")))
    assert judge.__name__ == "rubric_judge_reward"
    assert judge(["ok", "much too long"], prompts=["p", "p"]) == [1.0, 0.0]

    async_judge = pickle.loads(pickle.dumps(make_async_rubric_judge_reward(PassIfShort(), "r")))
    assert asyncio.run(async_judge(["ok"], prompts=["p"])) == [1.0]


def random_tag_soup(rng, pieces, count):
    """Strings built from the tags and separators the regexes care about."""
    return ["".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12))) for _ in range(count)]


def test_format_check_answers_as_the_seed_regex_does():
    import random
    import re

    from rewards.format import reasoning_then_answer

    seed_pattern = re.compile(r"^<reasoning>.*?</reasoning>\s*<answer>.*?</answer>$", re.DOTALL)
    pieces = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", " ", "\n", "\u2003", "x", "<", "</answer"]
    soup = random_tag_soup(random.Random(0), pieces, 40_000)
    texts = soup[:20_000] + [f"<reasoning>{middle}</answer>" for middle in soup[20_000:]]  # half framed right
    texts += ["<reasoning></reasoning><answer></answer>", "<reasoning></reasoning><answer>", "<reasoning></answer>"]
    mismatches = [t for t in texts if reasoning_then_answer(t) != bool(seed_pattern.match(t.strip()))]
    assert mismatches == []
    assert sum(reasoning_then_answer(t) for t in texts) > 100  # the sample holds matches too


def test_length_penalty_counts_exactly_around_the_short_text_shortcut():
    # 'a a a': 5 characters hold at most 3 words, so at target 3 no split is needed; at target 2 one is.
    for target, expected in [(3, 1.0), (2, 0.9)]:
        wrapped = with_length_penalty(constant(1.0), target_len=target, penalty_per_token=0.1)
        assert wrapped(["a a a"]) == pytest.approx([expected])


PORTABLE_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "minimum": 0},
            "steps": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["answer"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": [1, "a", None, True]}, "minItems": 1, "uniqueItems": True},
    {"anyOf": [{"type": "string", "pattern": "^a", "maxLength": 3}, {"type": "number", "exclusiveMaximum": 2}]},
    {
        "type": "object",
        "patternProperties": {"^x": {"const": 1}},
        "propertyNames": {"maxLength": 2},
        "minProperties": 1,
    },
    {"if": {"type": "object", "required": ["a"]}, "then": {"required": ["b"]}, "else": {"not": {"type": "null"}}},
    {"type": ["integer", "boolean"], "format": "email"},  # format is an annotation in both
]


def random_json(rng, depth=0):
    kind = rng.randrange(9 if depth < 3 else 6)
    return [
        lambda: None,
        lambda: rng.choice([True, False]),
        lambda: rng.randrange(-3, 4),
        lambda: rng.choice([1.0, 1.5, -0.0, 2.0]),
        lambda: rng.choice(["", "a", "ab", "abc", "abcd", "b", "x@y.z"]),
        lambda: rng.choice(["x", "xy", "xyz"]),
        lambda: [random_json(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: {rng.choice(["a", "b", "x", "xy", "answer", "steps"]): random_json(rng, depth + 1) for _ in range(3)},
        lambda: {"answer": rng.randrange(-1, 3), "steps": [rng.choice(["s", 1]) for _ in range(rng.randrange(3))]},
    ][kind]()


@pytest.mark.parametrize("schema", PORTABLE_SCHEMAS)
def test_compiled_schema_checks_agree_with_jsonschema(schema):
    import random

    from jsonschema.validators import validator_for

    from rewards.correctness import _compiled, portable

    assert portable(schema)  # these take the fastjsonschema path
    reference, compiled = validator_for(schema)(schema), _compiled(schema, "schema")
    rng = random.Random(2)
    instances = [random_json(rng) for _ in range(5_000)]
    assert [compiled(i) for i in instances] == [reference.is_valid(i) for i in instances]
    assert any(compiled(i) for i in instances) and not all(compiled(i) for i in instances)


def test_a_schema_outside_the_portable_subset_goes_to_jsonschema():
    from rewards.correctness import portable

    assert not portable({"type": "object", "unevaluatedProperties": False})  # 2019-09+ only
    assert not portable({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"})
    assert not portable({"type": "array", "prefixItems": [{"type": "integer"}]})
    only_jsonschema = {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}
    assert schema_reward(['{"a": 1}', '{"a": 1, "b": 2}'], output_schema=only_jsonschema) == [1.0, 0.0]
