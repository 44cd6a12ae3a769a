"""`loom what-if` / `loom record-cpu`'s multi-GPU shapes and answers
(loom.tools.parallel_shapes, loom.tools.peak_modules) on a tiny Llama:
--tp shards exactly the dimensions Megatron shards, --pp/--rank records one
rank's layers in 1F1B order, --dp/--zero shrink exactly the optimizer
state, gradients and parameters, --config loads a config.json, --json's
keys, and --snapshot's pickle read by PyTorch's own memory_viz code."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from loom.tools import cpu_models  # noqa: E402
from loom.tools import fake_record  # noqa: E402
from loom.tools import record_cpu_cli  # noqa: E402
from loom.tools import trace as loom_trace  # noqa: E402

PLUGIN = Path(__file__).resolve().parents[2] / "torch_plugin"
SIZES = "hidden_size=64,num_hidden_layers=2"
NORM_BYTES = 64 * 4  # an RMSNorm's weight: hidden_size fp32, replicated


def _record(*options, steps=2):
    args = record_cpu_cli.parser().parse_args(
        ["--model", "llama", "--set", SIZES, "--seq", "16", "-o", "unused",
         *options])
    spec, parallel = record_cpu_cli.rank_spec_from_args(args)
    return spec, record_cpu_cli.record_rank(spec, parallel, steps)


def _setup_sizes(trace):
    sizes = []
    for event in trace.events:
        if event.kind == loom_trace.ITER_BEGIN:
            break
        if event.kind == loom_trace.ALLOC:
            sizes.append(event.size)
    return sizes


def _param_bytes(spec):
    _, model = cpu_models.build_model(spec)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _cli(tmp_path, command, *args):
    return subprocess.run(
        [sys.executable, "-m", "loom", command, *map(str, args)],
        cwd=tmp_path, env={"PYTHONPATH": str(PLUGIN), "PATH": "/usr/bin:/bin",
                           "HOME": str(tmp_path)},
        capture_output=True, text=True, check=False, timeout=600)


def test_tp_halves_every_sharded_weight_and_keeps_the_norms():
    spec, whole = _record()
    spec2, half = _record("--tp", "2")
    config = cpu_models.build_config(spec2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)
    assert config.intermediate_size == 128 and config.vocab_size == 1024
    assert config.head_dim == 32 and config.hidden_size == 64
    one, two = _setup_sizes(whole.trace), _setup_sizes(half.trace)
    buffers = len(one) - len(list(cpu_models.build_model(spec)[1]
                                  .parameters()))
    params_one, params_two = one[:len(one) - buffers], two[:len(two) - buffers]
    # Parameters first, in model order: q/k/v/o, gate/up/down, embedding
    # and head are exactly half; the norms (hidden_size) are whole.
    assert params_two == [s if s == NORM_BYTES else s // 2
                          for s in params_one]
    assert sum(params_two) * 2 < sum(params_one) + 5 * NORM_BYTES + 1
    # The peak halves too, but for cuBLAS's two workspaces (forward and
    # backward), which a rank holds whole.
    workspaces = 2 * fake_record.CUBLAS_WORKSPACE_BYTES
    assert half.summary()["peak_live_bytes"] - workspaces < \
        0.55 * (whole.summary()["peak_live_bytes"] - workspaces)


def test_tp_pads_the_vocabulary_as_megatron_does():
    args = record_cpu_cli.parser().parse_args(
        ["--model", "llama", "--set", "vocab_size=1000,num_attention_heads=8,"
         "num_key_value_heads=8", "--tp", "4", "-o", "x"])
    spec, _ = record_cpu_cli.rank_spec_from_args(args)
    # 1000 padded to a multiple of 128 x 4 = 1024, 256 per rank.
    assert cpu_models.build_config(spec).vocab_size == 256


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "--tp 3: num_attention_heads 4 is not a multiple of 3"),
    (["--tp", "4"], "--tp 4: num_key_value_heads 2 is not a multiple of 4"),
    (["--zero", "2"], "--zero 2 shards over the data-parallel ranks"),
])
def test_bad_parallel_options_are_one_line_and_exit_2(tmp_path, args,
                                                      message, capsys):
    result = _cli(tmp_path, "what-if", "--model", "llama", "--tiny", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert record_cpu_cli.main(["--model", "llama", *args, "-o",
                                str(tmp_path / "x.ltb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loom record-cpu: ") and message in err
    assert err.count("\n") == 1 and not (tmp_path / "x.ltb").exists()


@pytest.mark.parametrize("model, message", [
    ("gpt2", "gpt2's config has no num_key_value_heads"),
    ("olmoe", "olmoe is not sharded: its q/k norms span every head"),
])
def test_tp_refuses_models_it_cannot_shard(tmp_path, model, message,
                                           capsys):
    assert record_cpu_cli.main(["--model", model, "--tp", "2", "-o",
                                str(tmp_path / "x.ltb")]) == 2
    assert message in capsys.readouterr().err


def test_pp_records_one_rank_s_layers_in_1f1b_order():
    for rank, layers, phases in (
            (0, {"model.layers.0", "model.layers.1"},
             ["forward", "forward", "backward", "forward", "backward",
              "forward", "backward", "backward", "optimizer"]),
            (1, {"model.layers.2", "model.layers.3"},
             ["forward", "backward"] * 4 + ["optimizer"])):
        _, rec = _record("--set", "num_hidden_layers=4", "--pp", "2",
                         "--rank", str(rank), steps=1)
        entered = {e.name for e in rec.trace.events
                   if e.kind == loom_trace.MODULE_ENTER}
        assert {n for n in entered if n.startswith("model.layers.")
                and n.count(".") == 2} == layers
        assert ("model.embed_tokens" in entered) == (rank == 0)
        assert ("lm_head" in entered) == (rank == 1)
        assert [e.name for e in rec.trace.events
                if e.kind == loom_trace.PHASE] == phases


def _live_at_phase(trace, iteration, phase):
    """Live bytes just before `phase` of `iteration`, and at the end."""
    live, sizes, current, found = 0, {}, None, None
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            sizes[event.id] = event.size
            live += event.size
        elif event.kind == loom_trace.FREE:
            live -= sizes.pop(event.id)
        elif event.kind == loom_trace.ITER_BEGIN:
            current = event.id
        elif event.kind == loom_trace.PHASE and current == iteration and \
                event.name == phase and found is None:
            found = live
    return found, live


def test_zero_shrinks_exactly_the_state_the_gradients_and_the_parameters():
    spec, plain = _record()
    params = _param_bytes(spec)
    # The buffers, and cuBLAS's two workspaces (live from the first matmul
    # on, never freed: they count with the buffers here).
    buffers = plain.summary()["setup_bytes"] - params + \
        2 * fake_record.CUBLAS_WORKSPACE_BYTES
    live = {}
    for stage in (0, 1, 2, 3):
        _, rec = _record("--dp", "4", "--zero", str(stage)) if stage else \
            (spec, plain)
        live[stage] = _live_at_phase(rec.trace, 1, "optimizer")
        if stage == 3:
            # The largest FSDP unit here: embedding + head + final norm.
            gathered = 2 * 2048 * 64 * 4 + NORM_BYTES
            assert rec.gathered_bytes == gathered
            first = [e for e in rec.trace.events
                     if e.kind in (loom_trace.ITER_BEGIN, loom_trace.ALLOC)]
            begins = [i for i, e in enumerate(first)
                      if e.kind == loom_trace.ITER_BEGIN]
            assert [first[i + 1].size for i in begins] == [gathered] * 2
    # Before iteration 1's optimizer: parameters P, AdamW's state 2P (from
    # iteration 0) and the gradients P; at the end P + 2P.
    assert live[0] == (4 * params + buffers, 3 * params + buffers)
    assert live[1] == (2 * params + params // 2 + buffers,
                       params + params // 2 + buffers)
    assert live[2] == (params + 3 * params // 4 + buffers,
                       params + params // 2 + buffers)
    # ZeRO-3: P/4 + 2P/4 + P/4 (the gathered layer is freed before the
    # optimizer phase).
    assert live[3] == (params + buffers, 3 * params // 4 + buffers)


def test_sgd_keeps_one_momentum_buffer_per_parameter():
    spec, rec = _record("--optimizer", "sgd")
    params = _param_bytes(spec)
    buffers = rec.summary()["setup_bytes"] - params + \
        2 * fake_record.CUBLAS_WORKSPACE_BYTES
    assert _live_at_phase(rec.trace, 1, "optimizer")[1] == \
        2 * params + buffers


@pytest.fixture(scope="module", name="what_if")
def fixture_what_if(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("shapes")
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "torch_dtype": "bfloat16", "transformers_version": "4.0",
              "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 512,
              "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = _cli(tmp_path, "what-if", "--config", "config.json", "--seq",
                  "16", "--steps", "2", "--tp", "2", "--json",
                  "--snapshot", "step.pickle", "--device-memory", "1GiB",
                  "--max-batch", "2")
    assert result.returncode == 0, result.stderr
    # Progress on stderr: the search's recordings.
    assert "recording batch 1" in result.stderr
    assert "batch 2 recorded on the CPU: " in result.stderr
    assert "batch 1: peak allocated" in result.stderr
    return tmp_path, json.loads(result.stdout)


def test_config_loads_a_config_file(what_if, tmp_path):
    folder, found = what_if
    assert found["model"] == "llama" and found["config"] == "config.json"
    same = _cli(tmp_path, "record-cpu", "--model", "llama", "--full-size",
                "--set", "hidden_size=64,num_hidden_layers=2,"
                "num_attention_heads=4,num_key_value_heads=2,"
                "intermediate_size=128,vocab_size=512", "--seq", "16",
                "--steps", "2", "--tp", "2", "--json", "-o", "x.ltb")
    assert same.returncode == 0, same.stderr
    same = json.loads(same.stdout)
    assert found["workload"]["setup_bytes"] == same["setup_bytes"]
    assert found["workload"]["peak_live_bytes"] == same["peak_live_bytes"]
    del folder


def test_json_schema(what_if):
    _, found = what_if
    assert found["parallel"] == {"tp": 2, "pp": 1, "rank": 0, "dp": 1,
                                 "zero": 0}
    assert found["optimizer"] == "adamw" and found["sharded"] == {}
    assert found["snapshot"] == "step.pickle"
    for key in ("model", "batch", "seq", "steps", "microbatches", "schedule",
                "dtype", "recompute", "workload", "device_memory_bytes",
                "allocators", "search", "recordings"):
        assert key in found
    for row in found["allocators"]:
        assert row["peak_reserved_bytes"] >= row["peak_allocated_bytes"] > 0
    peak = found["peak"]
    assert peak["peak_live_bytes"] == found["workload"]["peak_live_bytes"]
    assert set(peak) == {"peak_live_bytes", "iteration", "phase", "modules",
                         "others_bytes", "layers"}
    # A layer's row holds at least the modules shown inside it.
    assert sum(r["bytes"] for r in peak["layers"]) <= \
        peak["peak_live_bytes"]
    for layer in peak["layers"]:
        inside = sum(r["bytes"] for r in peak["modules"]
                     if r["module"] == layer["module"]
                     or r["module"].startswith(layer["module"] + "."))
        assert layer["bytes"] >= inside
    assert sum(r["bytes"] for r in peak["modules"]) + \
        peak["others_bytes"] == peak["peak_live_bytes"]
    assert all(set(r) == {"module", "bytes", "requests"}
               for r in peak["modules"])


def test_snapshot_is_read_by_pytorch_s_memory_viz(what_if):
    folder, found = what_if
    with open(folder / "step.pickle", "rb") as source:
        snapshot = pickle.load(source)
    assert set(snapshot) == {"segments", "device_traces"}
    # pylint: disable-next=import-outside-toplevel
    from torch.cuda import _memory_viz
    assert "Summary of segments" in _memory_viz.segsum(snapshot)
    _memory_viz.trace(snapshot)
    # The live blocks at the end: parameters and the optimizer's state.
    assert "optimizer:0:(optimizer)" in _memory_viz.memory(
        snapshot, format_flamegraph=str)
    allocs = [e for e in snapshot["device_traces"][0]
              if e["action"] == "alloc"]
    assert len(allocs) == found["workload"]["requests"]
    names = {f["name"] for e in allocs for f in e["frames"]}
    assert "model.layers.0.mlp.up_proj" in names and "(set-up)" in names
    assert all(e["frames"] for e in allocs)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 256))


MLP_PARAM_BYTES = (256 * 1024 + 1024 + 1024 * 256 + 256) * 4


def test_predict_answers_for_a_factory_of_one_s_own(loom_tool):
    del loom_tool
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import predict
    found = predict.what_if(_mlp, lambda b: torch.randn(b, 256), batch=2,
                            device_memory="192MiB", max_batch=4, steps=3)
    assert found["workload"]["iterations"] == 3
    assert found["workload"]["setup_bytes"] == MLP_PARAM_BYTES
    for row in found["allocators"]:
        assert row["largest_batch"] == 4 and row["at_max_batch"]
    assert [b["batch"] for b in found["search"]["batches"]] == [1, 2, 4]
    held = {r["module"] for r in found["peak"]["modules"]}
    assert {"(set-up)", "(optimizer)"} <= held  # AdamW's first step
    # ZeRO-1 over 2 ranks: AdamW's 2P of state becomes P.
    ends = []
    for zero, dp in ((0, 1), (1, 2)):
        rec = predict.record_module(_mlp, lambda b: torch.randn(b, 256), 2,
                                    steps=2, zero=zero, dp=dp)
        ends.append(_live_at_phase(rec.trace, 1, "optimizer")[1])
    workspaces = 2 * fake_record.CUBLAS_WORKSPACE_BYTES  # cuBLAS's
    assert ends == [3 * MLP_PARAM_BYTES + workspaces,
                    2 * MLP_PARAM_BYTES + workspaces]


def test_record_cpu_reports_what_zero_sharded(tmp_path, capsys):
    """`loom record-cpu --json` says, as what-if --json does, how many bytes
    of each kind ZeRO shrank to each rank's shard (issue 22, item 4)."""
    spec, rec = _record("--dp", "2", "--zero", "1")
    params = _param_bytes(spec)
    out = tmp_path / "zero.ltb"
    assert record_cpu_cli.main(
        ["--model", "llama", "--set", SIZES, "--seq", "16", "--steps", "2",
         "--dp", "2", "--zero", "1", "--json", "-o", str(out)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["sharded"] == {k: {"bytes": v[0], "shard_bytes": v[1]}
                                for k, v in rec.sharded.items()}
    # ZeRO-1 over 2 ranks: the optimizer phase's requests (summed over the
    # steps: its state and its foreach temporaries), halved, nothing else.
    optimizer = found["sharded"]["optimizer"]
    assert optimizer["bytes"] >= 2 * params
    assert optimizer["shard_bytes"] == optimizer["bytes"] // 2
    assert set(found["sharded"]) == {"optimizer"}
    assert record_cpu_cli.main(
        ["--model", "llama", "--set", SIZES, "--seq", "16", "--steps", "2",
         "-o", str(out)]) == 0
    line = capsys.readouterr().out
    assert "per rank" not in line and "requests" in line
    assert record_cpu_cli.main(
        ["--model", "llama", "--set", SIZES, "--seq", "16", "--steps", "2",
         "--dp", "2", "--zero", "1", "-o", str(out)]) == 0
    line = capsys.readouterr().out
    assert (f"optimizer {optimizer['bytes']} -> "
            f"{optimizer['shard_bytes']} bytes per rank") in line
