"""BASELINE ONLY: the guide's reward functions, as published, for reference rows.

Source: the guide's "GRPO Reward Function Library" (last verified 2026-07-13; docs/claims.md). Kept byte-for-byte in behaviour, defects included (the
length penalty raises negative rewards; ``validate`` re-checks the schema on every call;
one ``python -m pytest`` start per completion), so that the benchmarks measure what the
guide's code costs. One change, marked below: ``TemporaryDirectory(dir=SEED_WORK_ROOT)``, so that
a sandbox prefix can mount the guide's work files at all (its Docker example mounts one
``workdir`` but runs a test path from another temporary directory). Never import this
from ``rewards``.
"""

import json
import logging
import re
import subprocess
import tempfile
from pathlib import Path

from jsonschema import ValidationError, validate

logger = logging.getLogger(__name__)

SEED_WORK_ROOT = None  # set by the benchmark to a directory its sandbox mounts


def format_reward(completions, **kwargs) -> list[float]:
    pattern = re.compile(
        r"^<reasoning>.*?</reasoning>\s*<answer>.*?</answer>$",
        re.DOTALL,
    )
    return [1.0 if pattern.match(c.strip()) else 0.0 for c in completions]


def correctness_reward(completions, answer, **kwargs) -> list[float]:
    rewards = []
    for completion, gold in zip(completions, answer):
        match = re.search(r"<answer>(.*?)</answer>", completion, re.DOTALL)
        predicted = match.group(1).strip() if match else None
        rewards.append(2.0 if predicted == gold.strip() else 0.0)
    return rewards


def schema_reward(completions, output_schema, **kwargs) -> list[float]:
    if isinstance(output_schema, dict):
        schemas = [output_schema] * len(completions)
    else:
        schemas = list(output_schema)
        if len(schemas) != len(completions):
            raise ValueError(f"schema_reward: {len(schemas)} schemas for {len(completions)} completions")
    rewards = []
    for completion, schema in zip(completions, schemas):
        try:
            parsed = json.loads(completion)
            validate(instance=parsed, schema=schema)
            rewards.append(1.0)
        except (json.JSONDecodeError, ValidationError):
            rewards.append(0.0)
    return rewards


def test_execution_reward(completions, test_code, sandbox_cmd, timeout_s=10, **kwargs) -> list[float]:
    if not sandbox_cmd:
        logger.warning("test_execution_reward: no sandbox boundary provided — refusing to execute model-generated code")
        return [0.0 for _ in completions]

    scrubbed_env = {"PATH": "/usr/bin:/bin"}
    rewards = []
    for completion, tests in zip(completions, test_code):
        with tempfile.TemporaryDirectory(dir=SEED_WORK_ROOT) as tmp:  # changed: dir=SEED_WORK_ROOT
            candidate_path = Path(tmp) / "candidate.py"
            test_path = Path(tmp) / "test_candidate.py"
            candidate_path.write_text(completion)
            test_path.write_text(tests)
            try:
                result = subprocess.run(
                    [*sandbox_cmd, "python", "-m", "pytest", str(test_path), "-q"],
                    cwd=tmp,
                    capture_output=True,
                    timeout=timeout_s,
                    env=scrubbed_env,
                )
                rewards.append(1.0 if result.returncode == 0 else 0.0)
            except subprocess.TimeoutExpired:
                rewards.append(0.0)
    return rewards


test_execution_reward.__test__ = False


def with_length_penalty(reward_fn, target_len=512, penalty_per_token=0.001):
    def wrapped(completions, **kwargs) -> list[float]:
        base_rewards = reward_fn(completions, **kwargs)
        adjusted = []
        for reward, completion in zip(base_rewards, completions):
            overflow = max(0, len(completion.split()) - target_len)
            penalty = min(reward, overflow * penalty_per_token)
            adjusted.append(reward - penalty)
        return adjusted

    return wrapped


def make_rubric_judge_reward(judge_client, rubric):
    def rubric_judge_reward(completions, prompts, **kwargs) -> list[float]:
        rewards = []
        for prompt, completion in zip(prompts, completions):
            verdict = judge_client.judge(
                rubric=rubric,
                prompt=prompt,
                response=completion,
                output_format="pass_fail",
            )
            rewards.append(1.0 if verdict == "pass" else 0.0)
        return rewards

    return rubric_judge_reward
