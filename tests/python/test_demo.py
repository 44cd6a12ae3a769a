"""`loom demo` and `loom what-if` end to end (they need the built loom_tool:
the `loom_tool` fixture fails the test when it is not built)."""

import json
import subprocess
import sys

from loom import _paths


H200_RUN = (_paths.REPO_ROOT / "bench" / "data" / "traces" / "gpu" /
            "h200_2026-11-26")


def _demo(tmp_path, *extra):
    env = {"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "loom", "demo", "--out", str(tmp_path),
         "--time-limit", "2", *extra],
        capture_output=True, text=True, check=False, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _gib(n):
    return f"{n / 2**30:.2f} GiB"


def test_demo_prints_every_allocator_and_writes_pictures(tmp_path, loom_tool):
    out = _demo(tmp_path)
    for allocator in ("pytorch", "pytorch_expandable", "gmlake", "loom"):
        assert f"llama1b_h200           {allocator}" in out
        assert f"gpt2small_train_step   {allocator}" in out
        assert f"moe                    {allocator}" in out
    for name in ("llama1b_h200", "gpt2small_train_step", "moe"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 50_000
    # On the MoE run the plan holds more than loom with no plan on the trace
    # it was made from (whatif/loom/plan_check.h): it is declined, and a
    # note under that table says why; under no other table.
    sections = {s.split(":")[0]: s for s in out.split("=== ")[1:-1]}
    assert "why loom's plan is declined" in sections["moe"]
    assert "would be served beside the plan's region" in \
        " ".join(sections["moe"].split())
    for name in ("llama1b_h200", "gpt2small_train_step"):
        assert "why loom" not in sections[name]
    # The table explains its "own alloc peak" column.
    assert "own alloc peak = " in sections["moe"]
    # The summary: a loom row planned from the very trace it is measured on
    # (its table says "oracle") says so; no other does.
    planned_from = {}
    for section in out.split("=== ")[1:-1]:
        name = section.split(":")[0]
        planned_from[name] = next(
            line for line in section.splitlines()
            if line.startswith("loom planned from: "))
    assert any("oracle" in line for line in planned_from.values())
    summary = out[out.index("=== summary"):].splitlines()[2:]
    loom_rows = {line.split()[0]: line for line in summary
                 if line.split()[1] == "loom"}
    assert set(loom_rows) == set(planned_from)
    for name, line in loom_rows.items():
        assert ("oracle" in line) == ("oracle" in planned_from[name]), line
    # The declined plan is said so in the summary too; the others served.
    assert "declined (it lost on that trace): no plan" in loom_rows["moe"]
    for name in ("llama1b_h200", "gpt2small_train_step"):
        assert "declined" not in loom_rows[name]


def test_demo_leads_with_the_h200_trace_and_its_measured_peaks(tmp_path,
                                                               loom_tool):
    measured = json.loads((H200_RUN / "measured.json").read_text())
    model = measured["models"]["llama1b"]
    out = _demo(tmp_path)
    sections = out.split("=== ")
    lead = sections[1]
    assert lead.startswith("llama1b_h200: ")
    assert measured["gpu"] in lead.splitlines()[0]
    assert str(H200_RUN / model["trace"]) in lead
    # Planned from its first iterations, measured on all of them.
    assert f"loom planned from: first {model['plan_from'][6:]} iterations" \
        in lead
    rows = {r["allocator"]: r for r in json.loads(
        _demo(tmp_path / "json", "--json"))["llama1b_h200"]}
    block = lead[lead.index("simulated vs measured"):].splitlines()
    for allocator, row in rows.items():
        line = next(l for l in block if l.split()[:1] == [allocator])
        fields = line.split()
        assert fields[1:3] == _gib(row["peak_reserved_bytes"]).split()
        real = model["measured"].get(allocator)
        if real is None:  # gmlake and planned loom never ran on the GPU
            assert fields[3] == "-"
            continue
        reserved = real["reserved_bytes.all.peak"]
        assert fields[3:5] == _gib(reserved).split()
        error = (row["peak_reserved_bytes"] - reserved) / reserved
        assert fields[5] == f"{100 * error:+.2f}%"
        assert abs(error) <= 0.001
    # Summary rows of the lead carry the measured peak beside the simulated.
    summary = out[out.index("=== summary"):]
    for allocator, real in model["measured"].items():
        line = next(l for l in summary.splitlines()
                    if l.split()[:2] == ["llama1b_h200", allocator])
        assert _gib(real["reserved_bytes.all.peak"]) in line
    # loom planned holds less than every allocator the H200 measured.
    assert all(rows["loom"]["peak_reserved_bytes"] <
               real["reserved_bytes.all.peak"]
               for real in model["measured"].values())


def test_demo_json_rows(tmp_path, loom_tool):
    rows = json.loads(_demo(tmp_path, "--json"))
    assert list(rows) == ["llama1b_h200", "llama1b_h200_measured",
                          "gpt2small_train_step", "moe"]
    loom = next(r for r in rows["gpt2small_train_step"] if r["allocator"] == "loom")
    pytorch = next(r for r in rows["gpt2small_train_step"]
                   if r["allocator"] == "pytorch")
    # The real trace: loom's plan is exact and holds less than PyTorch.
    assert loom["efficiency"] > 0.995
    assert loom["peak_reserved_bytes"] < pytorch["peak_reserved_bytes"]
    assert loom["counters"]["plan_misses"] == 0


def test_what_if_on_a_real_snapshot(tmp_path, loom_tool):
    snapshot = (_paths.REPO_ROOT / "bench" / "data" / "pytorch_snapshots" /
                "raw" / "magma27_small_ctx256_b32_fwd_bwd.pickle")
    env = {"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "loom", "what-if", str(snapshot), "--json"],
        capture_output=True, text=True, check=False, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {r["allocator"]: r for r in json.loads(result.stdout)}
    assert set(rows) >= {"pytorch", "pytorch_expandable", "gmlake", "loom"}
    # peak allocated = the snapshot's in-trace peak of live bytes
    assert rows["loom"]["peak_allocated_bytes"] == 13923997700
    assert rows["loom"]["peak_reserved_bytes"] <= rows["pytorch"]["peak_reserved_bytes"]
