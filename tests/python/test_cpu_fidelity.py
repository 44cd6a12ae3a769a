"""CPU recordings without arithmetic against the H200 (issue 22, item 2).

Each model the H200 trained (bench/gpu/train/models.py, scale "full", its
GPU micro-batch) is recorded on the CPU on FakeTensors (loom.record_cpu's
default mode: the build, then 3 training steps, as the GPU traces hold)
by bench/gpu/train/cpu_fidelity.py, replayed by `loom_tool compare`, and
set beside what the H200 measured (bench/data/traces/gpu/h200_2026-11-26/
measured.json). About 5-15 s per model on two cores.

Targets (issue 22): the peak of allocated bytes within 1% of the H200's,
and the simulated peak reserved of PyTorch's allocator and of expandable
segments within 2% of the H200's measured; all rows meet them (moe once
it runs the H200's transformers 5.17 experts path, cpu_fidelity.
h200_experts). KNOWN_MISSES would pin a row that misses as a strict xfail
(it fails once it is met, so the mark goes). Requests per iteration differ more (kernels that allocate for themselves
on CUDA, decompositions that differ on the CPU): they are held to their
present distance, so that a change that moves them is seen.
"""

import functools
import importlib.util
import sys

import pytest

from loom import _paths

HARNESS = _paths.REPO_ROOT / "bench" / "gpu" / "train" / "cpu_fidelity.py"
MODELS = ("gpt2_interleaved", "llama1b", "llama1b_recompute", "moe")
ALLOCATED = 0.01   # of the H200's peak allocated
RESERVED = 0.02    # of the H200's peak reserved
KNOWN_MISSES = set()
# |CPU - H200| / H200 requests per steady iteration, at most (measured
# 2026-11-26: gpt2_interleaved 14.1%, moe 9.1%, llama1b 1.5%,
# llama1b_recompute 0.4%).
REQUESTS = {"gpt2_interleaved": 0.15, "moe": 0.095, "llama1b": 0.02,
            "llama1b_recompute": 0.01}


def _harness():
    spec = importlib.util.spec_from_file_location("cpu_fidelity", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cpu_fidelity", module)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _fidelity(model, tool):
    return _harness().fidelity(model, tool)


def test_the_harness_covers_every_measured_model():
    assert sorted(_harness().measured()["models"]) == list(MODELS)


def test_the_moe_experts_run_the_h200_s_transformers_path():
    """transformers 5.18 masks expert-parallel sentinels only under expert
    parallelism; the H200's 5.17 always did (cpu_fidelity.h200_experts)."""
    import torch  # pylint: disable=import-outside-toplevel
    harness = _harness()
    models = harness._models()  # pylint: disable=protected-access
    spec = models.spec("moe", "tiny")
    model = models.build(torch, spec, 1, device="cpu").model
    experts = [m for m in model.modules() if type(m).__name__.endswith(
        "Experts")]
    assert len(experts) == spec.dims[2]
    harness.h200_experts(model)
    assert all(getattr(m, "_is_expert_parallel", True) for m in experts)


def test_a_recording_at_another_micro_batch_is_of_that_batch(loom_tool):
    """record(micro_batch=) (what --largest searches over) records that
    batch: llama1b at batch 1 holds less than at the H200's batch 4."""
    from loom.tools.record_summary import summarize  # noqa: PLC0415
    harness = _harness()
    recorder = harness.record("llama1b", steps=2, micro_batch=1)
    assert "micro-batch 1," in recorder.trace.provenance
    one = summarize(recorder.trace.events)["peak_live_bytes"]
    default = _fidelity("llama1b", str(loom_tool))
    four = default["allocators"]["pytorch"]["cpu_allocated"]
    assert 0 < one < four


@pytest.mark.parametrize("model", MODELS)
def test_peak_allocated_is_the_h200_s(model, loom_tool):
    result = _fidelity(model, str(loom_tool))
    for allocator, row in result["allocators"].items():
        mine, real = row["cpu_allocated"], row["h200_allocated"]
        assert abs(mine - real) <= ALLOCATED * real, (
            f"{model} {allocator}: peak allocated {mine} recorded on the "
            f"CPU, {real} on the H200 ({(mine - real) / real:+.2%})")


@pytest.mark.parametrize("model,allocator", [
    pytest.param(m, a, marks=pytest.mark.xfail(
        strict=True, reason="known miss, bench/results/whatif.md"))
    if (m, a) in KNOWN_MISSES else (m, a)
    for m in MODELS for a in ("pytorch", "pytorch_expandable")])
def test_simulated_peak_reserved_is_the_h200_s(model, allocator, loom_tool):
    row = _fidelity(model, str(loom_tool))["allocators"][allocator]
    mine, real = row["cpu_reserved"], row["h200_reserved"]
    assert abs(mine - real) <= RESERVED * real, (
        f"{model} {allocator}: peak reserved {mine} simulated on the CPU "
        f"recording, {real} measured on the H200 "
        f"({(mine - real) / real:+.2%})")


@pytest.mark.parametrize("model", MODELS)
def test_requests_per_iteration_stay_where_they_were(model, loom_tool):
    per = _fidelity(model, str(loom_tool))["requests_per_iteration"]
    # The steady iterations (the first holds the optimizer's lazy state).
    cpu, gpu = per["cpu"][-1], per["gpu"][-1]
    assert len(set(per["cpu"][1:])) == 1, per  # a dense step repeats
    assert abs(cpu - gpu) <= REQUESTS[model] * gpu, (
        f"{model}: {cpu} requests per iteration on the CPU, {gpu} on the "
        f"H200")
