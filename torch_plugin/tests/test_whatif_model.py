"""`loom what-if --model` (loom.tools.whatif_model) and the API behind it
(loom.tools.predict) on the real torch and transformers: a tiny llama
recorded on the CPU, every allocator's predicted peak reserved memory, and
the largest micro-batch that fits a small device, checked against
independent recordings (`loom record-cpu`) replayed by `loom_tool compare`.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import loom
from loom.tools import predict
from loom.tools import record_cpu_cli

PLUGIN = Path(__file__).resolve().parent.parent
ALLOCATORS = ["pytorch", "pytorch_expandable", "gmlake", "loom",
              "loom_unplanned"]
STEP = ["--model", "llama", "--tiny", "--set",
        "hidden_size=64,num_hidden_layers=2", "--seq", "32", "--steps", "3"]
# cuBLAS's two workspaces (32 MiB each, recorded as a CUDA run on Hopper
# allocates them; expandable segments hold 88 MiB at batch 1) and more:
# small enough that the answer lies strictly
# between batch 1 and the bound.
DEVICE = 100 << 20
MAX_BATCH = 32


def _what_if(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "loom", "what-if", *map(str, args)],
        cwd=tmp_path, env={"PYTHONPATH": str(PLUGIN), "PATH": "/usr/bin:/bin",
                           "HOME": str(tmp_path)},
        capture_output=True, text=True, check=False, timeout=600)


@pytest.fixture(scope="module", name="found")
def fixture_found(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("what-if")
    result = _what_if(tmp_path, *STEP, "--device-memory", "100MiB",
                      "--max-batch", MAX_BATCH, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_json_result_has_every_allocator_and_the_search(found,
                                                            loom_tool):
    del loom_tool
    assert found["model"] == "llama" and found["batch"] == 2
    assert found["seq"] == 32 and found["steps"] == 3
    assert found["device_memory_bytes"] == DEVICE
    assert found["workload"]["iterations"] == 3
    assert [r["allocator"] for r in found["allocators"]] == ALLOCATORS
    for row in found["allocators"]:
        assert row["peak_reserved_bytes"] >= row["peak_allocated_bytes"] > 0
        assert 0 < row["efficiency"] <= 1
        assert row["oom"] is False  # the table's replay has no capacity
        assert 1 < row["largest_batch"] < MAX_BATCH, row
        assert row["at_max_batch"] is False
    # loom plans: at least as large a batch as PyTorch's allocator.
    largest = {r["allocator"]: r["largest_batch"] for r in found["allocators"]}
    assert largest["loom"] >= largest["pytorch"]
    search = found["search"]
    assert search["max_batch"] == MAX_BATCH
    batches = [b["batch"] for b in search["batches"]]
    assert batches[:4] == [1, 2, 4, 8]  # doubling while anything fits
    assert len(set(batches)) == len(batches) == found["recordings"]
    for entry in search["batches"]:
        assert [a["allocator"] for a in entry["allocators"]] == ALLOCATORS
    # Every answer is bracketed by the recordings: fits at it, not above.
    for name, n in largest.items():
        for entry in search["batches"]:
            fits = not next(a for a in entry["allocators"]
                            if a["allocator"] == name)["oom"]
            assert fits == (entry["batch"] <= n), (name, entry)


def test_larger_batches_reserve_more(found, tmp_path):
    by_batch = sorted(found["search"]["batches"], key=lambda b: b["batch"])
    live = [b["peak_allocated_bytes"] for b in by_batch]
    assert live == sorted(live) and live[-1] > live[0]
    result = _what_if(tmp_path, *STEP, "--batch", "8", "--json")
    assert result.returncode == 0, result.stderr
    at_8 = json.loads(result.stdout)
    assert at_8["search"] is None and at_8["recordings"] == 1
    for small, large in zip(found["allocators"], at_8["allocators"]):
        assert small["allocator"] == large["allocator"]
        assert large["peak_reserved_bytes"] > small["peak_reserved_bytes"]
        assert large["peak_allocated_bytes"] > small["peak_allocated_bytes"]


def _fits(loom_tool, trace, allocator):
    """Whether `allocator`'s replay of `trace` fits DEVICE, by loom_tool
    compare alone (an allocator that cannot start within the capacity fails
    the comparison)."""
    result = subprocess.run(
        [loom_tool, "compare", trace, "--capacity", str(DEVICE),
         "--allocators", allocator, "--json"],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        assert "cannot create" in result.stderr, result.stderr
        return False
    (row,) = json.loads(result.stdout)
    return not row["oom"]


def test_the_largest_batch_fits_and_one_more_does_not(found, tmp_path,
                                                      loom_tool):
    traces = {}
    for row in found["allocators"]:
        for batch in (row["largest_batch"], row["largest_batch"] + 1):
            if batch not in traces:
                traces[batch] = str(tmp_path / f"b{batch}.ltb")
                argv = [a for a in STEP if a != "--tiny"]  # record-cpu's
                argv += ["--batch", str(batch), "-o", traces[batch]]
                assert record_cpu_cli.main(argv) == 0
        name, n = row["allocator"], row["largest_batch"]
        assert _fits(loom_tool, traces[n], name), (name, n)
        assert not _fits(loom_tool, traces[n + 1], name), (name, n + 1)


def test_the_table_names_each_allocator_s_largest_batch(tmp_path):
    result = _what_if(tmp_path, *STEP, "--device-memory", "100MiB",
                      "--max-batch", "4")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "largest batch in 100.00 MiB" in lines[2]
    rows = {line.split()[0]: line for line in lines[3:8]}
    assert list(rows) == ALLOCATORS
    assert rows["loom"].endswith(">= 4 (--max-batch)")
    assert "3 replayed in 100.00 MiB (batches 1, 2, 4)" in result.stdout
    assert "3 recordings in all" in result.stdout


@pytest.mark.parametrize("args,message", [
    ([], "give a snapshot or trace, or --model TYPE"),
    (["x.pickle", "--model", "llama"], "not both"),
    (["x.pickle", "--batch", "4"], "--batch describes the step of --model"),
    (["--model", "llama", "--max-batch", "8"],
     "--max-batch needs --device-memory"),
    (["--model", "llama", "--device-memory", "12XB"], "is not a byte count"),
    (["--model", "llama", "--snapshot-device", "1"],
     "--snapshot-device needs a snapshot"),
    (["--model", "no_such_model"], "unknown model type 'no_such_model'"),
])
def test_what_if_errors_are_one_line(tmp_path, args, message):
    result = _what_if(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# ------------------------------------------------------ the API, own model


def _record_linear(torch, batch):
    """Three steps of a small MLP at `batch`, recorded without arithmetic
    (built on FakeTensors, as docs/plugin.md shows)."""
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import fake_record
    torch.manual_seed(0)
    with fake_record.building():
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024),
                                    torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 256))
        optimizer = torch.optim.AdamW(model.parameters())
    # Without cuBLAS's 64 MiB, which would dwarf this model's 10 MiB.
    with loom.record_cpu(model=model, optimizer=optimizer,
                         cuda_workspaces=False) as rec:
        for _ in range(3):
            model(torch.randn(batch, 256)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    return rec


def test_a_script_s_own_recording_through_the_api(torch, loom_tool):
    del loom_tool
    rec = _record_linear(torch, 64)
    rows = predict.compare_allocators(rec)
    assert [r["allocator"] for r in rows] == ALLOCATORS
    assert all(not r["oom"] for r in rows)
    # The same trace as a Trace object, under a device too small for it.
    tight = predict.compare_allocators(rec.trace, device_memory="1MiB",
                                       allocators=["pytorch", "loom"])
    assert [r["allocator"] for r in tight] == ["pytorch", "loom"]
    assert all(r["oom"] for r in tight)

    calls = []

    def record(batch):
        calls.append(batch)
        return _record_linear(torch, batch)

    device = 24 << 20  # about 10 MiB at batch 1; 2 KiB more per sample
    found = predict.largest_batch(record, device, max_batch=4096)
    assert len(calls) == len(set(calls)) == len(found["batches"])
    for entry in found["allocators"]:
        n = entry["largest_batch"]
        assert 1 < n < 4096 and not entry["at_max_batch"], entry
        below = predict.compare_allocators(record(n), device,
                                           allocators=[entry["allocator"]])
        above = predict.compare_allocators(record(n + 1), device,
                                           allocators=[entry["allocator"]])
        assert not below[0]["oom"] and above[0]["oom"], entry


def test_the_api_refuses_what_it_cannot_compare():
    with pytest.raises(loom.LoomError, match="expected a loom.record_cpu"):
        predict.compare_allocators(42)
    with pytest.raises(loom.LoomError, match="max_batch"):
        predict.largest_batch(lambda b: None, "1GiB", max_batch=0)
    with pytest.raises(loom.LoomError, match="not a byte count"):
        predict.compare_allocators("x.ltb", device_memory="lots")


def test_an_allocator_that_cannot_start_within_the_device_does_not_fit(
        monkeypatch, tmp_path):
    """loom_tool fails the whole comparison when an allocator cannot even
    start within the capacity (loom maps its plan's static region when it
    starts): each allocator is then replayed alone, and the one that fails
    only under the capacity gets its unlimited row, oom and the reason."""
    calls = []

    def row(name, reserved, oom=False):
        return {"allocator": name, "peak_allocated_bytes": 10,
                "peak_reserved_bytes": reserved, "oom": oom}

    def fake_tool(args):
        calls.append(args)
        names = ["pytorch", "loom"]
        if "--allocators" in args:
            names = args[args.index("--allocators") + 1].split(",")
        capped = "--capacity" in args
        if capped and "loom" in names:
            return subprocess.CompletedProcess(
                args, 1, "", "loom compare: x.ltb: loom: building the static "
                "region: fake device 0: cannot create 2097152 bytes\n")
        rows = [row(n, 100 if n == "loom" else 50, oom=False)
                for n in names]
        return subprocess.CompletedProcess(args, 0, json.dumps(rows), "")

    monkeypatch.setattr(predict, "capture_tool", fake_tool)
    trace = tmp_path / "x.ltb"
    rows = predict.compare_allocators(trace, device_memory=64)
    assert [r["allocator"] for r in rows] == ["pytorch", "loom"]
    assert rows[0] == row("pytorch", 50)
    assert rows[1]["oom"] is True and rows[1]["peak_reserved_bytes"] == 100
    assert "cannot create" in rows[1]["setup_error"]
    assert [c[-2:] for c in calls[2:]] == [["--allocators", "pytorch"],
                                          ["--allocators", "loom"]]
    # Without a capacity the same failure is an error.
    monkeypatch.setattr(predict, "capture_tool", lambda args: (
        subprocess.CompletedProcess(args, 1, "", "loom compare: broken\n")))
    with pytest.raises(loom.LoomError, match="compare failed: loom compare: "
                       "broken"):
        predict.compare_allocators(trace)
