"""Models by name and pipeline orders (loom.tools.cpu_models) and `loom
record-cpu` (loom.tools.record_cpu_cli), on the real torch and transformers
(the CPU build in .venv), with libloom reading and checking every trace."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loom
from loom.tools import cpu_models
from loom.tools import record_cpu
from loom.tools import record_cpu_cli
from loom.tools import trace as loom_trace
from trace_reading import events_of, iteration_spans

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "torch_plugin"


def _bench_models():
    path = ROOT / "bench" / "gpu" / "train" / "models.py"
    spec = importlib.util.spec_from_file_location("bench_train_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_orders_are_megatron_s():
    order = cpu_models.schedule_order
    assert order("plain", 2) == [("F", 0, 0), ("B", 0, 0), ("F", 0, 1),
                                 ("B", 0, 1)]
    # 1F1B, 4 stages, 6 micro-batches: rank 0 warms up with 3 forwards
    assert order("1f1b", 6, stages=4, rank=0) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3), ("B", 0, 0),
        ("F", 0, 4), ("B", 0, 1), ("F", 0, 5), ("B", 0, 2), ("B", 0, 3),
        ("B", 0, 4), ("B", 0, 5)]
    last = order("1f1b", 3, stages=4, rank=3)
    assert last == [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1),
                    ("F", 0, 2), ("B", 0, 2)]
    # interleaved: the same as the GPU comparison's (bench/gpu/train)
    bench = _bench_models()
    for microbatches, stages, chunks in ((8, 4, 2), (4, 2, 2), (6, 3, 3),
                                         (8, 2, 4)):
        for rank in range(stages):
            assert order("interleaved", microbatches, stages, chunks,
                         rank) == bench.interleaved_order(
                             microbatches, stages, chunks, rank)
    # microbatches == stages: Megatron runs every forward first
    all_warm = order("interleaved", 2, stages=2, chunks=2, rank=1)
    assert [k for k, _, _ in all_warm] == ["F"] * 4 + ["B"] * 4
    for args in (("interleaved", 4, 2, 3, 0), ("1f1b", 5, 3, 1, 2),
                 ("interleaved", 6, 3, 2, 2)):
        work = order(*args)
        seen = set()
        for kind, chunk, mb in work:  # dependencies within the rank
            if kind == "F":
                assert chunk == 0 or ("F", chunk - 1, mb) in seen
            else:
                assert ("F", chunk, mb) in seen
                assert chunk == args[3] - 1 or ("B", chunk + 1, mb) in seen
            seen.add((kind, chunk, mb))
        assert len(work) == 2 * args[1] * args[3]
    with pytest.raises(cpu_models.ModelError, match="multiple"):
        order("interleaved", 3, stages=2, chunks=2)


def test_overrides_parse_json_values():
    assert cpu_models.parse_overrides(
        ["hidden_size=64,num_hidden_layers=2", "mlp_only_layers=[0,1]",
         "hidden_act=gelu,tie_word_embeddings=true,rope_scaling=null",
         "x=1.5"]) == {
        "hidden_size": 64, "num_hidden_layers": 2, "mlp_only_layers": [0, 1],
        "hidden_act": "gelu", "tie_word_embeddings": True,
        "rope_scaling": None, "x": 1.5}
    with pytest.raises(cpu_models.ModelError, match="key=value"):
        cpu_models.parse_overrides(["hidden_size"])


def _record_model(tmp_path, name, *args):
    argv = list(args) + ["-o", str(tmp_path / name)]
    assert record_cpu_cli.main(argv) == 0
    return loom_trace.read_trace(tmp_path / name)


def test_moe_model_blocks_are_dynamic_with_real_routing(tmp_path, libloom,
                                                         capsys):
    del libloom
    trace = _record_model(tmp_path, "moe.ltb", "--model", "mixtral",
                          "--experts", "eager", "--steps", "4", "--set",
                          "num_hidden_layers=2", "--real")
    assert "4 iterations" in capsys.readouterr().out
    enters = events_of(trace, loom_trace.MODULE_ENTER)
    dynamic = {e.name for e in enters if e.dynamic}
    assert dynamic == {"model.layers.0.mlp", "model.layers.0.mlp.experts",
                       "model.layers.1.mlp", "model.layers.1.mlp.experts"}
    assert not any(e.dynamic for e in enters if "attn" in e.name)
    # the routing is real: the experts' requests change size with the steps
    spans = iteration_spans(trace)
    sizes = []
    for begin, end in spans[1:]:
        inside, depth = [], 0
        for event in trace.events[begin:end]:
            if event.kind == loom_trace.MODULE_ENTER and event.dynamic:
                depth += 1
            elif event.kind == loom_trace.MODULE_EXIT and \
                    event.name.endswith("mlp"):
                depth = 0
            elif event.kind == loom_trace.ALLOC and depth:
                inside.append(event.size)
        sizes.append(sorted(inside))
    assert sizes[0] and len({tuple(s) for s in sizes}) > 1


def test_pipeline_chunks_and_recompute(tmp_path, libloom, capsys):
    del libloom
    plain = _record_model(tmp_path, "plain.ltb", "--model", "llama",
                          "--steps", "4")
    recompute = _record_model(tmp_path, "re.ltb", "--model", "llama",
                              "--steps", "4", "--recompute")
    interleaved = _record_model(tmp_path, "vp.ltb", "--model", "llama",
                                "--steps", "4", "--schedule",
                                "interleaved:2", "--microbatches", "4")
    capsys.readouterr()
    peak = record_cpu.summarize
    assert peak(recompute.events)["peak_live_bytes"] < \
        peak(plain.events)["peak_live_bytes"]
    # recomputation: the layers' forward runs again inside the backward
    begin, end = iteration_spans(recompute)[1]
    events = recompute.events[begin:end]
    start = [e.name for e in events].index("backward")
    assert "model.layers.3.self_attn" in {
        e.name for e in events[start:] if e.kind == loom_trace.MODULE_ENTER}
    # rank 0 of 2 stages x 2 chunks holds global chunks 0 and 2
    chunks = [e.name for e in events_of(interleaved, loom_trace.MODULE_ENTER)
              if e.name.startswith("chunk")]
    assert set(chunks) == {"chunk0", "chunk2"}
    counts = peak(interleaved.events)["requests_per_iteration"]
    assert len(counts) == 4 and len(set(counts[1:])) == 1
    # the layers it holds: 0 (chunk 0) and 2 (chunk 2) of 4
    layers = {e.name.split(".")[2] for e in events_of(
        interleaved, loom_trace.MODULE_ENTER)
        if e.name.startswith("model.layers.")}
    assert layers == {"0", "2"}
    # Megatron's deallocation of sent outputs: one-element tensors
    assert any(e.size == 4 for e in events_of(interleaved, loom_trace.ALLOC))


# --------------------------------------------------------- command line


def _run_cli(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "loom", "record-cpu", *args], cwd=tmp_path,
        env={"PYTHONPATH": str(PLUGIN), "PATH": "/usr/bin:/bin",
             "HOME": str(tmp_path)},
        capture_output=True, text=True, check=False, timeout=600)


def test_record_cpu_command_end_to_end(tmp_path, loom_tool):
    result = _run_cli(tmp_path, "--model", "llama", "--steps", "4", "--set",
                      "num_hidden_layers=2,hidden_size=64", "--seq", "64",
                      "-o", "llama.ltt")
    assert result.returncode == 0, result.stderr
    assert "llama.ltt:" in result.stdout and "4 iterations" in result.stdout
    trace = loom_trace.read_trace(tmp_path / "llama.ltt")
    assert trace.provenance.startswith(
        "./loom record-cpu --model llama --steps 4 --set "
        "num_hidden_layers=2,hidden_size=64")
    assert "torch 2." in trace.provenance and "transformers" in \
        trace.provenance
    counts = record_cpu.summarize(trace.events)["requests_per_iteration"]
    assert len(counts) == 4 and counts[1] == counts[2] == counts[3]
    analysis = subprocess.run([loom_tool, "analyze", "--json",
                               str(tmp_path / "llama.ltt")],
                              capture_output=True, text=True, check=True)
    assert '"iterations":4' in analysis.stdout.replace(" ", "")


def test_record_cpu_json_is_the_summary(tmp_path, loom_tool):
    del loom_tool
    result = _run_cli(tmp_path, "--model", "llama", "--steps", "2", "--set",
                      "num_hidden_layers=1,hidden_size=64", "--seq", "32",
                      "-o", "llama.ltb", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    trace = loom_trace.read_trace(tmp_path / "llama.ltb")
    expected = record_cpu.summarize(trace.events)
    assert summary["output"] == "llama.ltb"
    assert summary["model"] == "llama" and summary["device"] == "cpu"
    for key in ("requests", "iterations", "requests_per_iteration",
                "peak_live_bytes"):
        assert summary[key] == expected[key], key
    assert summary["iterations"] == 2 and summary["seconds"] > 0
    assert summary["setup_bytes"] > 0  # the recorder's; the file lacks it


@pytest.mark.parametrize("args,message", [
    (["--model", "no_such_model"], "unknown model type 'no_such_model'"),
    (["--model", "llama", "--set", "hidden_sise=64"],
     "--set hidden_sise: llama's config has no key 'hidden_sise'"),
    (["--model", "llama", "--schedule", "zigzag"], "--schedule zigzag"),
    (["--model", "llama", "--schedule", "interleaved:2", "--stages", "3"],
     "do not split into 3 stages x 2 chunks"),
    (["--model", "llama", "--rank", "1"], "need a pipeline schedule"),
    (["--model", "llama", "--steps", "0"], "positive integer"),
])
def test_record_cpu_command_errors_are_one_line(tmp_path, args, message):
    result = _run_cli(tmp_path, *args, "-o", "x.ltb")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("loom record-cpu: ")
    assert not (tmp_path / "x.ltb").exists()


def test_record_cpu_is_listed_and_lazy():
    from loom.tools import cli  # pylint: disable=import-outside-toplevel
    assert "record-cpu" in cli.usage()
    assert loom.record_cpu.__module__ == "loom"
    assert isinstance(loom.record_cpu(), record_cpu.Recorder)


def test_compare_traces_names_what_one_side_lacks(tmp_path):
    """compare_traces (the GPU measurement of compare_gpu.py) on a trace
    and a copy with an extra 4 MiB workspace in every iteration."""
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    with loom.record_cpu(real=True, model=model, optimizer=optimizer) as rec:
        for _ in range(4):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    cpu = rec.trace
    same = record_cpu.compare_traces(cpu, cpu)
    assert same["cpu_only_sizes"] == same["gpu_only_sizes"] == []
    assert same["cpu"] == same["gpu"]
    events, next_id = [], 10_000
    for event in cpu.events:
        events.append(event)
        if event.kind == loom_trace.PHASE and event.name == "backward":
            events += [loom_trace.Event.alloc(next_id, 4 << 20),
                       loom_trace.Event.free(next_id)]
            next_id += 1
    gpu = loom_trace.Trace(events=events)
    loom_trace.write_trace(gpu, tmp_path / "gpu.ltb")
    result = record_cpu.compare_traces(cpu, tmp_path / "gpu.ltb")
    assert result["gpu_only_sizes"] == [(4 << 20, 1.0)]
    assert result["cpu_only_sizes"] == []
    steady = cpu_steady = result["cpu"]["requests_per_iteration"]
    assert result["gpu"]["requests_per_iteration"] == [n + 1 for n in steady]
    assert len(cpu_steady) == 3
    assert result["gpu"]["peak_live_bytes"] >= result["cpu"][
        "peak_live_bytes"] + (4 << 20) - 1024


def test_the_gpu_reference_path_puts_the_same_markers_in_loom_s_trace(
        tmp_path, libloom, no_session, capsys, monkeypatch):
    """`--device cuda` records with loom.enable(mode="record"); run here on
    the CPU with the host backend (PyTorch keeps its own allocator, so only
    the markers arrive, plus one request per iteration made here through
    libloom): the same iterations, phases and modules as the CPU recording
    of the same step."""
    del libloom
    from loom import _state  # pylint: disable=import-outside-toplevel
    begin = record_cpu_cli._LoomMarkers.begin_iteration

    def begin_with_a_request(self):
        begin(self)
        native = _state.current().native
        native.free(native.malloc(512), 512)

    monkeypatch.setattr(record_cpu_cli._LoomMarkers, "begin_iteration",
                        begin_with_a_request)
    argv = ["--model", "qwen3_moe", "--steps", "4", "--set",
            "num_hidden_layers=2", "-o", str(tmp_path / "ref.ltt")]
    args = record_cpu_cli.parser().parse_args(argv)
    spec = record_cpu_cli.spec_from_args(args)
    try:
        # pylint: disable-next=protected-access
        assert record_cpu_cli._record_with_loom(args, spec, argv, "cpu",
                                                backend="host") == 0
    finally:
        no_session._reset()
    reference = loom_trace.read_trace(tmp_path / "ref.ltt")
    assert "recorded on cpu by loom (record mode)" in reference.provenance
    argv[-1] = str(tmp_path / "cpu.ltt")
    cpu = _record_model(tmp_path, "cpu.ltt", *argv[:-2])
    capsys.readouterr()

    def markers(trace):
        return [(e.kind, e.id, e.name, e.dynamic) for e in trace.events
                if e.kind not in (loom_trace.ALLOC, loom_trace.FREE)]
    assert markers(reference) == markers(cpu)
    assert len(events_of(reference, loom_trace.ITER_END)) == 4
    assert len(events_of(reference, loom_trace.ALLOC)) == 4
