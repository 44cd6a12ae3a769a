"""The simulators against the GPU: the traces loom recorded on an NVIDIA
H200 (bench/data/traces/gpu/h200_2026-11-26/) replayed by `loom_tool
compare`, each simulated peak beside the peak the H200 measured for that
allocator (measured.json, copied from the run's results).

Tolerance: 0.1% of the measured peak, for every row. Nothing here is
loosened per model: PyTorch's caching allocator on llama1b, 1.03% off with
the simulator's former address order (new segments above the earlier
ones), matches to the byte with the default one (below them); the last test
pins that dependence down (bench/results/whatif.md explains it)."""

import functools
import json
import subprocess

import pytest

from loom import _paths

RUN = _paths.REPO_ROOT / "bench" / "data" / "traces" / "gpu" / "h200_2026-11-26"
MEASURED = json.loads((RUN / "measured.json").read_text())
MODELS = sorted(MEASURED["models"])
TOLERANCE = 0.001  # relative, of the H200's figure


@functools.lru_cache(maxsize=None)
def compare(tool, model, *extra):
    spec = MEASURED["models"][model]
    done = subprocess.run(
        [str(tool), "compare", str(RUN / spec["trace"]), "--json",
         "--plan-from", spec["plan_from"], "--loom-time-limit", "5", *extra],
        capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    return {row["allocator"]: row for row in json.loads(done.stdout)}


def test_the_run_is_complete():
    assert MODELS == ["gpt2_interleaved", "llama1b", "llama1b_recompute",
                      "moe"]
    for model in MODELS:
        spec = MEASURED["models"][model]
        assert (RUN / spec["trace"]).stat().st_size > 10_000
        assert set(spec["measured"]) == {"pytorch", "pytorch_expandable",
                                         "loom_unplanned"}


@pytest.mark.parametrize("model", MODELS)
def test_simulated_peaks_match_the_h200(model, loom_tool):
    # loom's arena as the H200 ran it: it did not stitch idle chunks yet.
    rows = compare(loom_tool, model, "--no-stitch")
    measured = MEASURED["models"][model]["measured"]
    for allocator, real in measured.items():
        row = rows[allocator]
        reserved = real["reserved_bytes.all.peak"]
        simulated = row["peak_reserved_bytes"]
        assert abs(simulated - reserved) <= TOLERANCE * reserved, (
            f"{model} {allocator}: peak reserved {simulated} simulated, "
            f"{reserved} on the H200 ({(simulated - reserved) / reserved:+.3%})")
        # The trace holds the requests the GPU run made: the allocator's
        # own allocated_bytes peak (rounding included) agrees too.
        allocated = real["allocated_bytes.all.peak"]
        own = row["allocator_peak_allocated_bytes"]
        assert abs(own - allocated) <= TOLERANCE * allocated, (
            f"{model} {allocator}: allocated peak {own} vs {allocated}")
        assert not row["oom"]


@pytest.mark.parametrize("model", MODELS)
def test_planned_loom_holds_less_than_expandable_segments(model, loom_tool):
    rows = compare(loom_tool, model)
    loom = rows["loom"]
    # Planned from the first iterations, measured on the whole trace;
    # served, or declined by its check where loom's stitching dynamic space
    # holds less on the recording (moe: then loom is its unplanned self).
    assert loom["plan_from"].startswith("first ")
    assert loom["counters"]["plan_hits"] > 0 or (
        loom["counters"]["plan_not_served"] == 1 and
        loom["peak_reserved_bytes"] ==
        rows["loom_unplanned"]["peak_reserved_bytes"])
    expandable = rows["pytorch_expandable"]["peak_reserved_bytes"]
    real = MEASURED["models"][model]["measured"]["pytorch_expandable"]
    assert loom["peak_reserved_bytes"] < expandable
    assert loom["peak_reserved_bytes"] < real["reserved_bytes.all.peak"]


def test_torch_peak_depends_on_the_address_order(loom_tool):
    """PyTorch's best fit takes the lowest address among free blocks of one
    size, so where the driver puts segments matters; the traces do not say.
    On llama1b, segments placed above the earlier ones (ascending) leave the
    simulated peak 1.03% below the H200's; placed below (the default), it is
    exact. Expandable segments do not depend on it."""
    real = MEASURED["models"]["llama1b"]["measured"]
    ascending = compare(loom_tool, "llama1b", "--allocators",
                        "pytorch,pytorch_expandable",
                        "--address-order", "ascending")
    torch_real = real["pytorch"]["reserved_bytes.all.peak"]
    error = (ascending["pytorch"]["peak_reserved_bytes"] - torch_real) / \
        torch_real
    assert error < -0.005, error
    assert ascending["pytorch_expandable"]["peak_reserved_bytes"] == \
        real["pytorch_expandable"]["reserved_bytes.all.peak"]
