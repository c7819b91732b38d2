"""vLLM's own memory beside weights and KV cache, against its start-up logs: llm-d-planner's vLLM 0.19.0 logs on
H100 80GB, at vLLM's defaults there (max_num_seqs 1024, max_num_batched_tokens 8192, CUDA graphs), each log's
line 'Actual usage is W GiB for weight, A GiB for peak activation, N GiB for non-torch memory, and G GiB for
CUDAGraph memory', quoted as (N, A, G). The dense rows are the calibration (with Qwen3-8B's and phi-4's, whose
shapes the suite lacks): they hold the model to what it was fitted on; the MoE and 80-layer rows were not fitted."""

import pytest

from benchmarks.catalog.profiles import Levers, load_shapes
from benchmarks.model.memory.vllm_engine import GIB, TRL_BATCHED_TOKENS, engine_overheads, overheads

LOGS = (
    "github:llm-d-incubation/llm-d-planner/accuracy/results/v0.19.0/logs/"
    "{}--h100-80gb--tp{}pp1dp1--8192.log@d3121e059da88662db39a926a3ead964be97359b"
)
# shape, its model's log name, tensor parallel size, (non-torch, activation peak, CUDA graphs) GiB as logged
PROFILED = [
    ("7b", "qwen-qwen2-5-7b-instruct", 1, (0.24, 2.21, 0.87)),
    ("7b", "qwen-qwen2-5-7b-instruct", 2, (2.06, 2.21, 0.71)),
    ("7b", "qwen-qwen2-5-7b-instruct", 4, (2.13, 2.21, 0.64)),
    ("8b", "meta-llama-llama-3-1-8b-", 1, (0.25, 1.89, 0.91)),
    ("8b", "meta-llama-llama-3-1-8b-", 2, (2.07, 1.89, 0.76)),
    ("8b", "meta-llama-llama-3-1-8b-", 4, (2.13, 1.89, 0.67)),
]
# where the model is known to read low: a MoE's router and experts in its profile run and graphs, 80 layers'
# graphs under TP 2 (logged: 2.68 and 1.41 GiB; 1.61 GiB)
WIDER = [("qwen3-30b-a3b", 1, (0.27, 2.68, 1.41)), ("72b", 2, (2.09, 2.29, 1.61))]


@pytest.mark.parametrize("shape, model, tp, logged", PROFILED)
def test_vllm_s_own_memory_follows_its_start_up_logs_for_dense_models(shape, model, tp, logged):
    found = overheads(load_shapes()[shape], 2, tp, 1024, 8192)
    non_torch, activations, graphs = (value / GIB for value in (found.non_torch, found.activations, found.graphs))
    log = LOGS.format(model, tp)  # the log each row quotes
    assert non_torch == pytest.approx(logged[0], abs=0.1), log
    assert activations == pytest.approx(logged[1], rel=0.05), log  # the sampler's fp32 logits over 1024 rows
    assert graphs == pytest.approx(logged[2], abs=0.05), log


@pytest.mark.parametrize("shape, tp, logged", WIDER)
def test_a_moe_and_eighty_layers_under_tensor_parallelism_read_low_within_a_fifth(shape, tp, logged):
    found = overheads(load_shapes()[shape], 2, tp, 1024, 8192)
    assert found.non_torch / GIB == pytest.approx(logged[0], abs=0.1)
    assert 0.8 < found.activations / GIB / logged[1] <= 1.0 and 0.8 < found.graphs / GIB / logged[2] <= 1.0


def test_trl_s_colocated_engine_samples_few_rows_so_its_forward_binds_and_a_server_keeps_vllm_s_defaults():
    shape = load_shapes()["7b"]
    colocated = engine_overheads(shape, 2, Levers(use_vllm=True, per_device_train_batch_size=8))
    forward = TRL_BATCHED_TOKENS * 3 * shape.intermediate_size * 2  # gate, up and the activation, a token
    assert colocated.activations == pytest.approx(forward, rel=0.01) and colocated.non_torch / GIB == 0.25
    server = engine_overheads(shape, 2, Levers(use_vllm=True, vllm_mode="server"))
    assert server.activations / GIB == pytest.approx(2.21, rel=0.05)  # vLLM's own 1024 rows sampled
    parallel = engine_overheads(shape, 2, Levers(use_vllm=True, vllm_tensor_parallel_size=2))
    assert parallel.non_torch > 8 * colocated.non_torch and parallel.graphs < colocated.graphs  # NCCL; split graphs
