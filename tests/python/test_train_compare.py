"""The GPU training comparison (bench/gpu/train/) without a GPU: the
interleaved schedule, the largest-micro-batch search, `run` end to end with
a fake worker (tests/python/fake_train_worker.py), the fidelity pipeline on
a real PyTorch snapshot with the real loom_tool, and the table."""

import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "bench" / "gpu" / "train"
sys.path.insert(0, str(TRAIN))
import compare  # noqa: E402  pylint: disable=wrong-import-position
import models  # noqa: E402  pylint: disable=wrong-import-position
import table  # noqa: E402  pylint: disable=wrong-import-position

FAKE_WORKER = Path(__file__).resolve().parent / "fake_train_worker.py"
SNAPSHOT = (ROOT / "bench" / "data" / "pytorch_snapshots" / "raw" /
            "magma27_small_ctx256_b32_fwd_bwd.pickle")
GiB = 1 << 30


# ------------------------------------------------------- the schedule


def check_schedule(order, microbatches, chunks):
    """Every (chunk, mb) runs forward once and backward once, in an order a
    pipeline could run: forward of a chunk after the previous chunk's
    forward, backward after its forward and after the next chunk's
    backward. Returns the most micro-batch chunks alive at once."""
    done, alive, most = set(), 0, 0
    for kind, chunk, mb in order:
        assert (kind, chunk, mb) not in done, (kind, chunk, mb)
        if kind == "F":
            if chunk > 0:
                assert ("F", chunk - 1, mb) in done
            alive += 1
        else:
            assert ("F", chunk, mb) in done
            if chunk < chunks - 1:
                assert ("B", chunk + 1, mb) in done
            alive -= 1
        most = max(most, alive)
        done.add((kind, chunk, mb))
    assert len(done) == 2 * microbatches * chunks
    return most


@pytest.mark.parametrize("microbatches,stages,chunks,rank", [
    (8, 4, 2, 0), (8, 4, 2, 3), (4, 2, 2, 0), (12, 4, 3, 1), (4, 4, 1, 0),
    (3, 1, 1, 0), (2, 2, 4, 0)])
def test_interleaved_order_is_a_valid_pipeline_schedule(microbatches, stages,
                                                       chunks, rank):
    order = models.interleaved_order(microbatches, stages, chunks, rank)
    most = check_schedule(order, microbatches, chunks)
    warmup = min(microbatches * chunks,
                 (stages - rank - 1) * 2 + (chunks - 1) * stages)
    # The warm-up forwards are all alive when the first backward runs.
    assert most >= max(1, warmup)
    assert [k for k, _, _ in order[:warmup]] == ["F"] * warmup


def test_interleaved_order_keeps_several_micro_batches_alive():
    # The default model's schedule: rank 0 of 4 stages, 2 chunks.
    # 10 warm-up forwards, then one more forward before each backward.
    order = models.interleaved_order(8, 4, 2)
    assert check_schedule(order, 8, 2) == 11
    assert order[:5] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3),
                         ("F", 1, 0)]


@pytest.mark.parametrize("args,match", [
    ((6, 4, 2), "multiple of stages"), ((0, 1, 1), "positive"),
    ((4, 2, 2, 2), "rank 2")])
def test_interleaved_order_rejects_bad_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        models.interleaved_order(*args)


def test_specs():
    assert models.spec("llama1b").dims[:3] == (32000, 2048, 22)
    assert models.spec("llama1b_recompute").recompute
    assert not models.spec("moe").dense
    tiny = models.spec("gpt2_interleaved", "tiny")
    models.interleaved_order(tiny.microbatches, tiny.stages, tiny.chunks)
    assert tiny.seq < models.spec("gpt2_interleaved").seq
    with pytest.raises(ValueError, match="unknown model"):
        models.spec("gpt5")
    with pytest.raises(ValueError, match="unknown scale"):
        models.spec("moe", "huge")
    assert models.dynamic_modules(models.spec("moe")) is not None
    assert models.dynamic_modules(models.spec("llama1b")) is None


# ------------------------------------------------------- the search


@pytest.mark.parametrize("limit", [1, 7, 64])
def test_largest_fitting_finds_the_boundary_in_few_probes(limit):
    for truth in range(0, limit + 1):
        for start in (1, 4, 8, limit):
            calls = []

            def probe(n, truth=truth, calls=calls):
                calls.append(n)
                return n <= truth
            largest, seen = compare.largest_fitting(probe, start, limit)
            assert largest == truth, (truth, start, limit)
            assert len(calls) == len(set(calls)) == len(seen)
            assert all(1 <= n <= limit for n in calls)
            assert len(calls) <= 2 * math.ceil(math.log2(limit + 1)) + 2


def test_fits_tells_oom_from_failure():
    assert compare.fits({"returncode": 0})
    assert not compare.fits({"returncode": 0, "oom": True})
    with pytest.raises(RuntimeError, match="boom"):
        compare.fits({"returncode": 1, "error": "boom", "model": "m",
                      "allocator": "a"})


# ------------------------------------------------------- run end to end


def run_compare(tmp_path, *extra, env_extra=None, expect_code=0):
    env = dict(os.environ)
    env.update(FAKE_LIMITS=json.dumps({"torch": 12, "expandable": 14,
                                       "loom": 19}))
    env.update(env_extra or {})
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(TRAIN / "compare.py"), "run", "--out", str(out),
         "--worker", str(FAKE_WORKER), "--steps", "3", "--warmup", "1",
         "--max-micro-batch", "32", *extra],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == expect_code, result.stdout + result.stderr
    if expect_code:
        assert "FAILED: " in result.stderr, result.stderr
    return out, compare.read_results([out / "results.jsonl"])


def test_run_measures_searches_and_packs_traces(tmp_path):
    out, lines = run_compare(tmp_path, "--models", "llama1b,moe", "--search",
                             "--traces")
    measured = table.latest(lines, "measure")
    assert set(measured) == {(m, a) for m in ("llama1b", "moe")
                             for a in compare.ALLOCATORS}
    assert measured[("moe", "torch")]["micro_batch"] == 8
    largest = table.latest(lines, "largest")
    assert {k: v["largest"] for k, v in largest.items()} == {
        (m, a): n for m in ("llama1b", "moe")
        for a, n in (("torch", 12), ("expandable", 14), ("loom", 19))}
    probes = [l for l in lines if l["kind"] == "probe"]
    assert all("step_seconds" not in p for p in probes)
    assert any(p["oom"] for p in probes)
    # Traces: loom's trace and fingerprint per model, in one tarball.
    with tarfile.open(out / "traces.tar.xz") as tar:
        names = sorted(tar.getnames())
    assert names == ["llama1b.loom.trace.rank0.ltb",
                     "llama1b.loom.trace.rank0.ltb.json",
                     "moe.loom.trace.rank0.ltb",
                     "moe.loom.trace.rank0.ltb.json"]
    assert not (out / "work").exists() and not (out / "traces").exists()
    text = (out / "gpu.md").read_text()
    assert "| llama1b | loom | 4 | 4.00 GiB | 4.02 GiB | 99.50% | 100.5 ms " \
           "| 1.005 | 0 | 100.0% | 19 |" in text
    assert "| llama1b | torch | 4 | 4.00 GiB | 4.44 GiB | 90.00% |" in text
    assert "| efficiency ≥ 99% | llama1b | 99.50% | yes |" in text
    assert "| efficiency ≥ 98% | moe | 99.50% | yes |" in text
    assert "| step time within 1% of torch | moe | 1.005× | yes |" in text
    assert "| peak reserved < expandable | moe |" in text
    # Driver calls are a target on the dense models only.
    assert "| 0 driver calls per step (dense) | llama1b | 0 | yes |" in text
    assert "(dense) | moe" not in text


def test_plan_mode_runs_with_the_plans_given_and_fails_without(tmp_path):
    """loom-plan: each model's worker gets --plan DIR/<model>.lplan; a model
    without a plan file there is a failed run that says so (and the run
    exits 1), never a run served without a plan as if it had one."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "llama1b.lplan").write_bytes(b"a plan")
    out, lines = run_compare(tmp_path, "--models", "llama1b,moe",
                             "--allocators", "expandable,loom-plan",
                             "--plans", str(plans), "--search",
                             "--seed", "7", expect_code=1)
    measured = table.latest(lines, "measure")
    assert {l.get("seed") for l in lines if l["kind"] in
            ("measure", "probe") and l["returncode"] == 0} == {7}
    planned = measured[("llama1b", "loom-plan")]
    assert planned["returncode"] == 0 and planned["loom_state"] == "serving"
    assert planned["plan_file"] == str(plans / "llama1b.lplan")
    assert measured[("moe", "loom-plan")]["returncode"] == 2
    # Probes of other micro-batches are served with the default's plan.
    largest = table.latest(lines, "largest")
    assert largest[("llama1b", "loom-plan")]["largest"] == 32
    failures = (out / "failures.txt").read_text().splitlines()
    assert failures == [
        f"moe/loom-plan: failed (exit 2): loom-plan: no plan file for moe "
        f"({plans / 'moe.lplan'})",
        f"moe/loom-plan: largest failed: loom-plan: no plan file for moe "
        f"({plans / 'moe.lplan'})"]
    text = (out / "gpu.md").read_text()
    assert "| llama1b | loom-plan | 4 | 4.00 GiB | 4.02 GiB | 99.50% |" \
        in text
    assert "| moe | loom-plan (failed) |" in text
    assert "| efficiency ≥ 99% (plan mode) | llama1b | 99.50% | yes |" in text
    assert "| peak reserved < expandable (plan mode) | llama1b |" in text
    assert "| loom ran (plan mode) | moe | no result | NO |" in text
    # Plan mode's state is "serving" whether or not its plan loaded: a run
    # whose plan did not load is marked and fails the run.
    assert "loom-plan (not planned" not in text
    lines.append(dict(planned, plan_loaded=False, hit_rate=None))
    assert "| llama1b | loom-plan (not planned: serving) |" in \
        table.make_table(lines)
    assert "llama1b/loom-plan: loom did not serve a plan (state serving): " \
        "None" in table.recipe_failures(lines)


def test_remember_is_measured_on_a_second_run_sharing_the_workdir(
        tmp_path):
    """loom-remember: a first run ("prime", 1 step) of each model leaves its
    plan in a workdir the measured run shares; the measured run serves it
    ("previous run"); a measured run that did not is marked and fails."""
    out, lines = run_compare(tmp_path, "--models", "llama1b",
                             "--allocators", "expandable,loom-remember")
    primes = [l for l in lines if l["kind"] == "prime"]
    assert len(primes) == 1 and primes[0]["plan_source"] == "own"
    measured = table.latest(lines, "measure")[("llama1b", "loom-remember")]
    assert measured["plan_source"] == "previous run"
    assert measured["remembered"] == "confirmed"
    assert Path(measured["workdir"]) == Path(primes[0]["workdir"])
    text = (out / "gpu.md").read_text()
    assert "| llama1b | loom-remember | 4 |" in text
    assert "| efficiency ≥ 99% (remember, second run) | llama1b | 99.50% " \
        "| yes |" in text
    lines.append(dict(measured, plan_source="own", remembered=None))
    assert "llama1b/loom-remember: loom did not serve a plan (state " \
        "planned): None" in table.recipe_failures(lines)


def test_the_worker_wants_a_plan_file_with_plan_mode_only(tmp_path):
    sys.path.insert(0, str(TRAIN))
    import worker  # pylint: disable=import-outside-toplevel
    base = ["--model", "llama1b", "--out", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit):
        worker.parse_args(base + ["--allocator", "loom-plan"])
    with pytest.raises(SystemExit):
        worker.parse_args(base + ["--allocator", "loom-plan", "--plan",
                                  str(tmp_path / "missing.lplan")])
    plan = tmp_path / "p.lplan"
    plan.write_bytes(b"x")
    with pytest.raises(SystemExit):
        worker.parse_args(base + ["--allocator", "loom", "--plan", str(plan)])
    args = worker.parse_args(base + ["--allocator", "loom-plan", "--plan",
                                     str(plan)])
    assert args.plan == str(plan)


def test_run_reports_failures_and_budget(tmp_path):
    out, lines = run_compare(tmp_path, "--models", "llama1b",
                             env_extra={"FAKE_FAIL": "llama1b/expandable"},
                             expect_code=1)
    assert (out / "failures.txt").read_text().startswith(
        "llama1b/expandable: failed (exit 1): RuntimeError: CUDA error: boom")
    measured = table.latest(lines, "measure")
    assert measured[("llama1b", "expandable")]["returncode"] == 1
    text = table.make_table(lines)
    assert "| llama1b | expandable (failed) |" in text
    assert "- measure llama1b/expandable: RuntimeError: CUDA error: boom" \
        in text
    # A loom run whose planning failed is marked, not passed off as planned.
    lines.append(dict(measured[("llama1b", "loom")], loom_state="fallback",
                      plan_error="planner crashed"))
    text = table.make_table(lines)
    assert "| llama1b | loom (not planned: fallback) |" in text
    assert "- loom did not plan llama1b: planner crashed" in text
    # A plan the referee stopped (it held more than the dynamic space alone
    # would) is marked too: its timed steps route nothing to it.
    lines.append(dict(measured[("llama1b", "loom")], hit_rate=None,
                      plan_verdict="lost"))
    text = table.make_table(lines)
    assert "| llama1b | loom (plan lost to the dynamic space) |" in text
    # A plan declined (it lost on its recording) is marked, not a failure.
    declined = dict(measured[("llama1b", "loom")], hit_rate=None,
                    loom_state="declined")
    lines.append(declined)
    assert "| llama1b | loom (plan declined: it loses on its recording) |" \
        in table.make_table(lines)
    assert table.recipe_failures([declined]) == []
    # No time left: everything is skipped, said so, and the run fails.
    out, lines = run_compare(tmp_path / "b", "--models", "moe", "--budget",
                             "1", expect_code=1)
    assert (out / "failures.txt").read_text().count("not run (time "
                                                    "budget)") == 3
    skipped = [l for l in lines if l["kind"] == "skipped"]
    assert len(skipped) == 3
    assert "skipped (time budget): measure moe/loom" in \
        table.make_table(lines)


def test_run_fails_loudly_when_loom_ran_in_fallback(tmp_path):
    """The 2026-11-26 H200 run: every loom row trained in fallback (the plan
    never installed) and the recipe said nothing. Now it fails and says
    which model and why."""
    out, lines = run_compare(tmp_path, "--models", "llama1b,moe",
                             env_extra={"FAKE_FALLBACK": "moe"},
                             expect_code=1)
    assert (out / "failures.txt").read_text().splitlines() == [
        "moe/loom: loom did not serve a plan (state fallback): cannot "
        "install plan.rank0.lplan: INTERNAL: cuCtxSynchronize(device 0): "
        "CUDA_ERROR_CONTEXT_IS_DESTROYED"]
    assert "| moe | loom (not planned: fallback) |" in \
        (out / "gpu.md").read_text()
    # Every failure kind, from result lines alone.
    measured = table.latest(lines, "measure")
    assert table.recipe_failures(lines) == [
        (out / "failures.txt").read_text().strip()]
    planned = dict(measured[("llama1b", "loom")])
    assert planned["loom_state"] == "planned"
    assert table.recipe_failures([planned]) == []
    planning = dict(planned, loom_state="planning", plan_error=None)
    assert table.recipe_failures([planning]) == [
        "llama1b/loom: loom did not serve a plan (state planning): None"]
    oom = dict(measured[("llama1b", "torch")], oom=True,
               error="CUDA out of memory. Tried to allocate 2.00 GiB")
    assert table.recipe_failures([oom]) == [
        "llama1b/torch: out of memory at micro-batch 4: CUDA out of memory. "
        "Tried to allocate 2.00 GiB"]
    timed_out = dict(measured[("llama1b", "torch")], returncode=None,
                     error="timed out after 120 s")
    assert table.recipe_failures([timed_out]) == [
        "llama1b/torch: failed (exit None): timed out after 120 s"]


def test_fidelity_on_a_real_snapshot(tmp_path, loom_tool):
    real_reserved = 14_180_941_824  # PyTorch's, at the dump (README)
    _, lines = run_compare(
        tmp_path, "--models", "gpt2_interleaved", "--allocators", "torch",
        "--fidelity", "--traces",
        env_extra={"FAKE_SNAPSHOT": str(SNAPSHOT),
                   "FAKE_SNAPSHOT_RESERVED": str(real_reserved)})
    (fidelity,) = [l for l in lines if l["kind"] == "fidelity"]
    assert "error" not in fidelity, fidelity
    assert fidelity["real_peak_reserved"] == real_reserved
    simulated = fidelity["simulated_peak_reserved"]
    # The caching-allocator simulator reproduces this snapshot closely.
    assert abs(simulated - real_reserved) / real_reserved < 0.05
    assert fidelity["relative_error"] == pytest.approx(
        (simulated - real_reserved) / real_reserved)
    assert set(fidelity["simulated"]) == {"pytorch", "pytorch_expandable",
                                          "loom"}
    assert fidelity["simulated"]["loom"]["peak_reserved"] <= simulated
    text = table.make_table(lines)
    assert "## Simulator fidelity" in text
    assert f"| gpt2_interleaved | torch | {real_reserved / GiB:.2f} GiB |" \
        in text


# ------------------------------------------------------- table, unpack


def test_table_with_driver_costs(tmp_path):
    costs = {"device": "NVIDIA H100", "driver_version": 13000,
             "granularity_minimum": 2097152,
             "granularity_recommended": 2097152, "rounds": 50,
             "sizes": [{"bytes": 2097152,
                        "cuMemCreate": {"median_us": 12.25, "p99_us": 40.5},
                        "cuMemMap": {"median_us": 3.0, "p99_us": 9.0}}]}
    (tmp_path / "costs.json").write_text(json.dumps(costs))
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps({"kind": "run", "argv": ["run"],
                                   "date": "2026-11-22T10:00Z",
                                   "host": "x"}) + "\n")
    done = subprocess.run(
        [sys.executable, str(TRAIN / "compare.py"), "table", str(results),
         "--driver-costs", str(tmp_path / "costs.json"), "--command",
         "tests/gpu/run_gpu.sh train $OUT"],
        capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "- driver version: 13000" in done.stdout
    assert "| 2,097,152 | cuMemCreate | 12.2 | 40.5 |" in done.stdout
    assert "Granularity: 2097152 bytes minimum" in done.stdout
    assert "- date: 2026-11-22T10:00Z" in done.stdout


def test_table_refuses_a_corrupt_results_file(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text('{"kind": "run"}\n{"kind": "meas\n')
    with pytest.raises(SystemExit, match="r.jsonl:2: not JSON"):
        compare.read_results([results])


def test_unpack_traces_refuses_paths_outside(tmp_path):
    good = tmp_path / "good.tar.xz"
    (tmp_path / "a.ltb").write_bytes(b"trace")
    with tarfile.open(good, "w:xz") as tar:
        tar.add(tmp_path / "a.ltb", arcname="a.ltb")
    into = tmp_path / "into"
    assert compare.main(["unpack-traces", str(good), "--into",
                         str(into)]) == 0
    assert (into / "a.ltb").read_bytes() == b"trace"
    bad = tmp_path / "bad.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        tar.add(tmp_path / "a.ltb", arcname="../escape.ltb")
    with pytest.raises(SystemExit, match="unexpected member"):
        compare.main(["unpack-traces", str(bad), "--into", str(into)])
    assert not (tmp_path / "escape.ltb").exists()


def test_pack_traces_leaves_out_the_largest_to_fit(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "small").write_bytes(b"x" * 100)
    (traces / "big").write_bytes(os.urandom(200_000))  # incompressible
    left_out = compare.pack_traces(traces, tmp_path / "t.tar.xz",
                                   limit=50_000)
    assert left_out == ["big"]
    with tarfile.open(tmp_path / "t.tar.xz") as tar:
        assert tar.getnames() == ["small"]


def test_markers_host_runs_the_moe_on_the_cpu(tmp_path, loom_tool):
    """bench/gpu/train/markers_host.py (issue 21): the moe model of the
    comparison, built on the CPU, watched as worker.py watches it; the
    marker calls it counts are the watched modules' (timings not checked:
    they are the benchmark's)."""
    del loom_tool  # built with libloom; libloom is what the script loads
    out = tmp_path / "markers.json"
    done = subprocess.run(
        [sys.executable, str(TRAIN / "markers_host.py"), "--layers", "2",
         "--rounds", "1", "--steps", "1", "--warmup", "1",
         "--micro-iterations", "20", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    counted = report["markers_per_step"]
    # Each layer's experts, called once per step (grouped_mm), marked in
    # forward and backward; their act_fn matches "*.experts.*" but is
    # inside them: not marked.
    assert counted["dynamic_modules"] == [
        f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert counted["nested_modules"] == [
        f"model.layers.{i}.mlp.experts.act_fn" for i in range(2)]
    assert counted["by_kind"] == {
        "iteration_begin": 1, "iteration_end": 1, "phase": 3,
        "module_enter": 4, "module_exit": 4}
    assert report["median_step_ms"]["plain"]["cpu"] > 0
