"""The steptime recipe without a GPU (issue 21): profile_steps.py's reading
of torch.profiler's Chrome trace (GPU busy and idle time per step, time per
kernel name), steptime.py's tables and targets, and `compare.py run
--profile-steps` end to end with the fake worker and loom's layout
variants."""

import gzip
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu" / "train"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  pylint: disable=wrong-import-position
import profile_steps  # noqa: E402  pylint: disable=wrong-import-position
import steptime  # noqa: E402  pylint: disable=wrong-import-position
from test_train_compare import run_compare  # noqa: E402  pylint: disable=wrong-import-position


def annotation(ts, dur, name=profile_steps.STEP_LABEL):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts,
            "dur": dur, "pid": 1, "tid": 1}


def gpu(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
            "pid": 0, "tid": 7, "args": {"correlation": 1}}


def recorded_trace():
    """Two steps shaped like Kineto's export: kernels on two streams that
    overlap, a memcpy, a memset, CPU ops and launches (ignored), a kernel
    after the last step (ignored) and an unrelated annotation."""
    return {"traceEvents": [
        annotation(1000, 1000),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1001,
         "dur": 30},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
         "ts": 1002, "dur": 4},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1003},
        gpu("kernel", "gemm", 1100, 300),           # [1100, 1400)
        gpu("kernel", "softmax", 1350, 100),        # overlaps: to 1450
        gpu("gpu_memset", "Memset (Device)", 1500, 10),
        gpu("gpu_memcpy", "Memcpy DtoH", 1600, 40),  # span 1100..1640
        annotation(3000, 1000),
        annotation(3100, 50, name="other"),
        gpu("kernel", "gemm", 3100, 300),
        gpu("kernel", "gemm", 3500, 300),            # span 3100..3800
        gpu("kernel", "late", 5000, 10),             # in no step
    ]}


def test_summarize_reads_busy_and_idle_time_per_step():
    prof = profile_steps.summarize(recorded_trace())
    assert prof["steps"] == 2
    first, second = prof["per_step"]
    assert first == {"wall_us": 1000, "busy_us": 400.0, "span_us": 540.0,
                     "idle_us": 140.0, "activities": 4,
                     "gpu_time_us": 450.0}
    assert second["busy_us"] == 600.0 and second["span_us"] == 700.0
    assert second["idle_us"] == 100.0
    assert prof["names"] == {"gemm": [3, 900.0], "softmax": [1, 100.0],
                             "Memcpy DtoH": [1, 40.0],
                             "Memset (Device)": [1, 10.0]}
    assert profile_steps.per_step(prof, "idle_us") == 120.0
    # Only the largest names are kept; the rest are summed.
    short = profile_steps.summarize(recorded_trace(), keep=1)
    assert list(short["names"]) == ["gemm"]
    assert short["other_names"] == 3 and short["other_us"] == 150.0


def test_summarize_refuses_a_trace_without_steps_or_gpu_activity():
    trace = recorded_trace()
    no_steps = {"traceEvents": [e for e in trace["traceEvents"]
                                if e["cat"] != "user_annotation"]}
    with pytest.raises(ValueError, match="no 'loom.profiled_step'"):
        profile_steps.summarize(no_steps)
    cpu_only = {"traceEvents": [e for e in trace["traceEvents"]
                                if e["cat"] not in profile_steps.GPU_CATEGORIES]}
    with pytest.raises(ValueError, match="no GPU activity"):
        profile_steps.summarize(cpu_only)


def test_kept_events_are_enough_to_summarize():
    trace = recorded_trace()
    kept = profile_steps.kept_events(trace)
    assert len(kept["traceEvents"]) == 9  # 2 steps, 7 GPU activities
    assert profile_steps.summarize(kept) == profile_steps.summarize(trace)


def test_profile_drives_the_real_torch_profiler(tmp_path):
    """On the CPU build of torch: the steps run inside their annotations and
    the export is read; with no CUDA activity to read, it says so."""
    import torch  # pylint: disable=import-outside-toplevel
    ran = []

    def step(index):
        a = torch.ones(32, 32)
        (a @ a).sum().item()
        ran.append(index)

    with pytest.raises(ValueError, match="no GPU activity"):
        profile_steps.profile(torch, step, 5, 2, tmp_path / "trace.json",
                              keep=tmp_path / "kept.json.gz")
    assert ran == [5, 6]
    assert not (tmp_path / "trace.json").exists()


@pytest.mark.parametrize("intervals,length", [
    ([], 0), ([(0, 1)], 1), ([(0, 2), (1, 3)], 3), ([(0, 5), (1, 2)], 5),
    ([(4, 6), (0, 1), (1, 2)], 4)])
def test_union_length(intervals, length):
    assert profile_steps.union_length(intervals) == length


def measure_line(allocator, step_s, names, busy=1000.0, loom=None):
    prof = {"steps": 2, "per_step": [
        {"wall_us": 2000, "busy_us": busy, "span_us": busy + 100,
         "idle_us": 100.0, "activities": 10, "gpu_time_us": busy}] * 2,
        "names": names}
    if loom is not None:
        prof["loom"] = loom
    return {"kind": "measure", "model": "gpt2_interleaved",
            "allocator": allocator, "median_step_s": step_s,
            "loom_state": "planned" if models.is_loom(allocator) else None,
            "profile": prof}


def test_steptime_tables_and_targets():
    loom_counters = {"loom.layout.handles": 3, "loom.layout.mappings": 4,
                     "loom.layout.handle_size.1GiB.handles": 2,
                     "loom.layout.handle_size.2MiB.handles": 1,
                     "loom.waits.free.events": 6,
                     "loom.waits.empty_cache.device_syncs": 0,
                     "loom.host.malloc.samples": 4,
                     "loom.host.malloc.sampled_ns": 560,
                     "loom.host.free.samples": 4,
                     "loom.host.free.sampled_ns": 380}
    lines = [
        {"kind": "run", "argv": ["run"], "date": "2026-11-26T18:00Z",
         "host": "h"},
        measure_line("torch", 0.300, {"gemm": [4, 1600.0], "copy": [2, 200.0]}),
        measure_line("expandable", 0.310, {"gemm": [4, 1700.0],
                                           "copy": [2, 200.0]}),
        measure_line("loom", 0.302, {"gemm": [4, 1610.0], "copy": [2, 260.0],
                                     "new": [2, 20.0]}, busy=1010.0,
                     loom=loom_counters),
    ]
    text = steptime.make_steptime(lines, command="run_gpu.sh steptime")
    assert "| torch | 300.0 ms | 1.000 | 1.0 ms | 1.000 | 0.1 ms | 10 |" in text
    assert ("| loom | 302.0 ms | 1.007 | 1.0 ms | 1.010 | 0.1 ms | 10 | "
            "3 handles, 4 mappings (2×1GiB, 1×2MiB) | free.events 3 | "
            "140 / 95 ns |") in text
    assert "| loom's median step within 1% of torch | gpt2_interleaved | " \
           "1.007x | yes |" in text
    assert "| loom at or below expandable segments | gpt2_interleaved | " \
           "0.974x expandable's | yes |" in text
    # Changed kernels, largest change first: copy +30 us/step, then gemm +5,
    # then the new one +10 ... sorted by |change|.
    section = text[text.index("#### gpt2_interleaved: loom"):]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    assert rows[0] == "| `copy` | 1 | 1 | 100.0 | 130.0 | +30.0 |"
    assert rows[1] == "| `new` | 0 | 1 | 0.0 | 10.0 | +10.0 |"
    assert rows[2] == "| `gemm` | 2 | 2 | 800.0 | 805.0 | +5.0 |"
    slow = [dict(lines[3], median_step_s=0.320)]
    text = steptime.make_steptime(lines[:3] + slow)
    assert "1.067x | NO |" in text and "1.032x expandable's | NO |" in text


def test_run_with_profiled_steps_and_layout_variants(tmp_path):
    out, lines = run_compare(
        tmp_path, "--models", "gpt2_interleaved", "--allocators",
        "torch,expandable,loom,loom-chunk1,loom-chunk10",
        "--profile-steps", "2")
    measured = {l["allocator"]: l for l in lines if l["kind"] == "measure"}
    assert set(measured) == {"torch", "expandable", "loom", "loom-chunk1",
                             "loom-chunk10"}
    assert measured["loom-chunk1"]["profile"]["steps"] == 2
    text = (out / "steptime.md").read_text()
    assert "| loom-chunk1 | 100.5 ms | 1.005 |" in text
    # The synthetic GEMM is 200 us slower per step with 2 MiB handles.
    assert "| `ampere_sgemm_128x64_tn` | 1 | 1 | 1000.0 | 1200.0 | +200.0 |" \
        in text
    with tarfile.open(out / "profiles.tar.xz") as tar:
        names = sorted(tar.getnames())
        assert names == sorted(f"gpt2_interleaved.{a}.json.gz"
                               for a in measured)
        kept = json.loads(gzip.decompress(
            tar.extractfile("gpt2_interleaved.loom.json.gz").read()))
    assert profile_steps.summarize(kept)["steps"] == 2
    assert not (out / "profiles").exists()
    assert "| gpt2_interleaved | loom-chunk1 | 4 |" in \
        (out / "gpu.md").read_text()


def test_unknown_allocator_is_refused(tmp_path):
    out = tmp_path / "out"
    import subprocess  # pylint: disable=import-outside-toplevel
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "train" / "compare.py"),
         "run", "--out", str(out), "--allocators", "torch,loom-chunk3"],
        capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "unknown allocator 'loom-chunk3'" in done.stderr


def test_worker_counts_loom_over_the_profiled_steps_only():
    import worker  # pylint: disable=import-outside-toplevel
    before = {"loom.waits.free.events": 10, "loom.host.malloc.samples": 100,
              "loom.host.malloc.sampled_ns": 900_000,
              "loom.host.malloc.mean_ns": 9000, "loom.layout.handles": 5,
              "loom.host.sample_every": 256}
    after = {"loom.waits.free.events": 10, "loom.host.malloc.samples": 104,
             "loom.host.malloc.sampled_ns": 902_000,
             "loom.host.malloc.mean_ns": 8673, "loom.layout.handles": 7,
             "loom.host.sample_every": 256}
    assert worker.counter_delta(before, after) == {
        "loom.waits.free.events": 0, "loom.host.malloc.samples": 4,
        "loom.host.malloc.sampled_ns": 2000, "loom.host.malloc.mean_ns": 500,
        "loom.layout.handles": 7, "loom.host.sample_every": 256}
