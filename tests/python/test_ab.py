"""Step-time ratios across alternated processes without a GPU (issue 21):
ab.py's bootstrap and verdicts on synthetic step times, and `compare.py
run --rounds N` end to end with the fake worker (rotated orders, one
process per round and allocator, DIR/ab.md)."""

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu" / "train"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  pylint: disable=wrong-import-position
import compare  # noqa: E402  pylint: disable=wrong-import-position
from test_train_compare import run_compare  # noqa: E402  pylint: disable=wrong-import-position


def line(model, allocator, round_, steps, **extra):
    return {"kind": "measure", "model": model, "allocator": allocator,
            "round": round_, "step_seconds": steps, "returncode": 0,
            "oom": False, **extra}


def noisy(rng, mean, spread, n):
    return [mean * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_rotated_orders_put_each_allocator_first_in_turn():
    names = ["torch", "expandable", "loom"]
    firsts = [compare.rotated(names, r)[0] for r in range(3)]
    assert firsts == names
    assert compare.rotated(names, 4) == ["expandable", "loom", "torch"]
    assert sorted(compare.rotated(names, 2)) == sorted(names)


def test_exact_ratio_and_verdicts_without_noise():
    lines = []
    for r in range(3):
        lines += [line("moe", "torch", r, [0.100] * 5),
                  line("moe", "loom", r, [0.1005] * 5),
                  line("moe", "slow", r, [0.103] * 5)]
    rows = {x["allocator"]: x for x in ab.comparisons(lines)["moe"]}
    loom = rows["loom"]
    assert abs(loom["ratio"] - 1.005) < 1e-12
    assert abs(loom["low"] - 1.005) < 1e-12
    assert abs(loom["high"] - 1.005) < 1e-12
    assert loom["verdict"] == "met" and loom["bound"] == 1.01
    assert loom["rounds"] == 3 and loom["steps"] == 15
    # No target for an allocator the issue does not name.
    assert "verdict" not in rows["slow"]
    assert ab.verdict(1.02, 1.03, 1.01) == "missed"
    assert ab.verdict(1.00, 1.02, 1.01) == "undecided"


def test_interval_covers_the_truth_and_narrows_with_more_rounds():
    rng = random.Random(7)

    def lines_for(rounds):
        out = []
        for r in range(rounds):
            # A process-level offset (each process is a little faster or
            # slower as a whole) and step-level scatter.
            for name, mean in (("torch", 0.120), ("loom", 0.1212)):
                offset = 1 + rng.uniform(-0.03, 0.03)
                out.append(line("moe", name, r,
                                noisy(rng, mean * offset, 0.15, 30)))
        return out

    few = ab.comparisons(lines_for(3))["moe"][0]
    many = ab.comparisons(lines_for(24))["moe"][0]
    for row in (few, many):
        assert row["low"] < row["ratio"] < row["high"]
    assert many["low"] <= 1.01 <= many["high"]
    assert many["high"] - many["low"] < few["high"] - few["low"]
    # Reproducible: the bootstrap's seed is fixed.
    again = ab.comparison({0: {"torch": [1.0, 1.1, 0.9], "loom": [1.0, 1.2]},
                           1: {"torch": [1.0], "loom": [0.95, 1.05]}},
                          "loom", "torch")
    assert again == ab.comparison(
        {0: {"torch": [1.0, 1.1, 0.9], "loom": [1.0, 1.2]},
         1: {"torch": [1.0], "loom": [0.95, 1.05]}}, "loom", "torch")


def test_failed_and_unrounded_runs_are_left_out():
    lines = [line("moe", "torch", 0, [0.1] * 3),
             line("moe", "loom", 0, [0.1] * 3),
             line("moe", "loom", 1, [0.5] * 3, returncode=1),
             line("moe", "torch", 1, [0.5] * 3, oom=True),
             {"kind": "measure", "model": "moe", "allocator": "loom",
              "step_seconds": [9.0], "returncode": 0}]
    assert ab.rounds_of(lines) == {"moe": {0: {"torch": [0.1] * 3,
                                               "loom": [0.1] * 3}}}
    assert "No measure runs with rounds." in ab.make_ab(lines[2:])


def test_run_with_rounds_alternates_processes_and_writes_ab(tmp_path):
    out, lines = run_compare(
        tmp_path, "--models", "moe,gpt2_interleaved", "--allocators",
        "torch,expandable,loom", "--rounds", "3", "--steps", "20",
        env_extra={"FAKE_STEP_NOISE": "0.002"})
    measured = [l for l in lines if l["kind"] == "measure"]
    assert len(measured) == 2 * 3 * 3
    order = [(l["model"], l["round"], l["allocator"]) for l in measured]
    moe = [a for m, _, a in order if m == "moe"]
    assert moe == ["torch", "expandable", "loom", "expandable", "loom",
                   "torch", "loom", "torch", "expandable"]
    text = (out / "ab.md").read_text()
    # The fake worker's loom is 0.5% slower than torch (noise 0.2%): within
    # 1%; and 0.7% faster than expandable segments on gpt2_interleaved.
    rows = ab.comparisons(lines)
    gpt2 = {(r["allocator"], r["baseline"]): r
            for r in rows["gpt2_interleaved"]}
    assert gpt2[("loom", "torch")]["verdict"] == "met"
    assert abs(gpt2[("loom", "torch")]["ratio"] - 1.005) < 0.003
    assert gpt2[("loom", "expandable")]["verdict"] == "met"
    assert gpt2[("expandable", "torch")]["low"] > 1.0
    assert "| gpt2_interleaved | loom | expandable | 3 | 60 |" in text
    assert "| moe | loom | torch | 3 | 60 |" in text


def test_rounds_below_one_are_refused(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "train" / "compare.py"),
         "run", "--out", str(tmp_path / "o"), "--rounds", "0"],
        capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "--rounds: at least 1, not 0" in done.stderr


def test_recording_an_ab_bundle_leaves_the_train_report_alone(tmp_path):
    """`run_gpu.sh record` of an A/B bundle files its ratios and its
    processes' memory table as steptime_ab.md and its raw lines as
    steptime_ab.jsonl; bench/results/gpu.md, the run/train report with its
    hand-written analysis, is not rewritten (it was, 2026-11-27)."""
    import shutil  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import tarfile  # pylint: disable=import-outside-toplevel
    root = tmp_path / "repo"
    (root / "tests" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "gpu" / "run_gpu.sh",
                root / "tests" / "gpu" / "run_gpu.sh")
    results = root / "bench" / "results"
    results.mkdir(parents=True)
    (results / "gpu.md").write_text("# the train report, by hand\n")
    step = tmp_path / "bundle" / "ab"
    step.mkdir(parents=True)
    (step / "ab.md").write_text("# Step time, allocators alternated\n"
                                "| moe | loom | torch | 3 |\n")
    (step / "gpu.md").write_text("# loom on a GPU: memory, speed\n\n"
                                 "| moe | loom | 8 | 21.84 GiB |\n")
    (step / "results.jsonl").write_text('{"kind": "run"}\n')
    bundle = tmp_path / "ab.tar"
    with tarfile.open(bundle, "w") as tar:
        tar.add(step, arcname="ab")
    done = subprocess.run(
        ["bash", str(root / "tests" / "gpu" / "run_gpu.sh"), "record",
         str(bundle)], capture_output=True, text=True, check=False,
        timeout=60)
    assert done.returncode == 0, done.stderr
    assert (results / "gpu.md").read_text() == \
        "# the train report, by hand\n"
    text = (results / "steptime_ab.md").read_text()
    assert text.startswith("# Step time, allocators alternated\n")
    assert "## The same processes: memory and speed\n" in text
    assert "| moe | loom | 8 | 21.84 GiB |" in text
    assert "# loom on a GPU" not in text
    assert (results / "steptime_ab.jsonl").read_text() == \
        '{"kind": "run"}\n'


def test_recording_a_train_run_keeps_the_previous_report(tmp_path):
    """`run_gpu.sh record` of a train bundle puts the new report on top of
    bench/results/gpu.md and keeps the previous one, hand-written reading
    included, below it."""
    import shutil  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    root = tmp_path / "repo"
    (root / "tests" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "gpu" / "run_gpu.sh",
                root / "tests" / "gpu" / "run_gpu.sh")
    shutil.copytree(ROOT / "bench" / "gpu" / "train",
                    root / "bench" / "gpu" / "train")
    results = root / "bench" / "results"
    results.mkdir(parents=True)
    (results / "gpu.md").write_text(
        "# loom on a GPU: memory, speed and driver costs\n\n- date: old\n\n"
        "## What this run shows\n\nby hand\n")
    step = tmp_path / "train"
    step.mkdir()
    (step / "results.jsonl").write_text(json.dumps(
        {"kind": "run", "argv": ["run"], "date": "2026-11-27T19:41Z",
         "host": "x"}) + "\n")
    done = subprocess.run(
        ["bash", str(root / "tests" / "gpu" / "run_gpu.sh"), "record",
         str(step)], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    text = (results / "gpu.md").read_text()
    assert text.startswith("# loom on a GPU: memory, speed and driver "
                           "costs\n")
    new, old = text.split("\n---\n\n")
    assert "- date: 2026-11-27T19:41Z" in new
    assert old == "# Earlier\n\n- date: old\n\n## What this run shows\n\n" \
        "by hand\n"
