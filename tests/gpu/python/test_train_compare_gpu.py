"""The training comparison harness (bench/gpu/train/) on a real GPU, at
tiny scale: every model under every allocator runs, loom's measured steps
are served from its plan, and the fidelity pipeline (snapshot from process
start -> import -> simulators) works on a real snapshot. This is the smoke
test to run before spending device time on the full-size comparison
(tests/gpu/run_gpu.sh train). Skips without torch, CUDA or transformers.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]
COMPARE = ROOT / "bench" / "gpu" / "train" / "compare.py"


def run(tmp_path, *options):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(COMPARE), "run", "--out", str(out), "--scale",
         "tiny", "--steps", "3", "--warmup", "1", "--budget", "400",
         *options], capture_output=True, text=True, env=dict(os.environ),
        timeout=480, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(l) for l in
             (out / "results.jsonl").read_text().splitlines() if l.strip()]
    return out, lines


def test_every_model_runs_under_every_allocator(tmp_path):
    _, lines = run(tmp_path)
    measured = [l for l in lines if l["kind"] == "measure"]
    assert len(measured) == 12, [l["kind"] for l in lines]
    for line in measured:
        label = f"{line['model']}/{line['allocator']}"
        assert line["returncode"] == 0 and not line["oom"], \
            f"{label}: {line.get('error')}"
        assert 0 < line["efficiency"] <= 1, label
        assert line["median_step_s"] > 0, label
        if line["allocator"] == "loom":
            assert line["loom_state"] in ("planned", "declined"), \
                f"{label}: {line['loom_state']} ({line.get('plan_error')})"
            if line["loom_state"] == "declined":
                # Not installed: on its recording it held more than loom
                # without a plan (whatif/loom/plan_check.h).
                check = line["plan_check"]
                assert check["planned_peak_reserved_bytes"] > \
                    check["unplanned_peak_reserved_bytes"] + \
                    check["slack_bytes"], (label, check)
            elif line.get("plan_verdict") == "lost":
                # The referee stopped the plan: only where it held more
                # than the dynamic space alone would have.
                referee = line["plan_referee"]
                assert referee["lost_plan_bytes"] > \
                    referee["lost_dynamic_bytes"], (label, referee)
            else:
                assert line["hit_rate"] is not None and \
                    line["hit_rate"] > 0.5, label
            assert Path(line["trace"]).name == "trace.rank0.ltb"
    # Same model, same micro-batch: every allocator saw the same peak
    # allocated bytes within a few percent (the workload did not change).
    by_model = {}
    for line in measured:
        by_model.setdefault(line["model"], []).append(
            line["allocated_bytes.all.peak"])
    for model, peaks in by_model.items():
        assert max(peaks) <= 1.1 * min(peaks), (model, peaks)


def test_fidelity_and_traces(tmp_path):
    out, lines = run(tmp_path, "--models", "gpt2_interleaved", "--allocators",
                     "torch,loom", "--fidelity", "--traces")
    (fidelity,) = [l for l in lines if l["kind"] == "fidelity"]
    assert "error" not in fidelity, fidelity
    assert fidelity["real_peak_reserved"] > 0
    assert fidelity["simulated_peak_reserved"] > 0
    assert (out / "traces.tar.xz").stat().st_size > 0
    assert "## Simulator fidelity" in (out / "gpu.md").read_text()
