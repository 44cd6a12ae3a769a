"""The CPU recorder (loom.record_cpu, loom.tools.record_cpu), CUDA's autocast
policy on the CPU (loom.tools.cpu_autocast), models by name and pipeline
orders (loom.tools.cpu_models) and `loom record-cpu`, on the real torch and
transformers (the CPU build in .venv), with libloom reading and checking
every trace."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loom
from loom.tools import cpu_autocast
from loom.tools import cpu_models
from loom.tools import record_cpu
from loom.tools import record_cpu_cli
from loom.tools import trace as loom_trace

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "torch_plugin"


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


def _live_requests(events):
    live = {}
    for event in events:
        if event.kind == loom_trace.ALLOC:
            live[event.id] = event.size
        elif event.kind == loom_trace.FREE:
            del live[event.id]
    return live


def _iterations(trace):
    """[(begin index, end index)] of the complete iterations."""
    spans, begin = [], None
    for index, event in enumerate(trace.events):
        if event.kind == loom_trace.ITER_BEGIN:
            begin = index
        elif event.kind == loom_trace.ITER_END:
            spans.append((begin, index))
    return spans


def _live_bytes_at(trace, index):
    return sum(_live_requests(trace.events[:index]).values())


def _check(trace, tmp_path, name="t.ltb"):
    """Written and read back by libloom (its checker runs both ways)."""
    path = tmp_path / name
    loom_trace.write_trace(trace, path)
    back = loom_trace.read_trace(path)
    assert back == trace
    return back


# ------------------------------------------------------------- requests


def test_known_ops_record_exactly_their_storage_bytes(tmp_path, libloom):
    del libloom
    with loom.record_cpu(real=True) as rec:
        a = torch.empty(1000)                        # 4000 B
        view = a.view(10, 100)                       # a view: nothing
        half = torch.zeros(3, dtype=torch.float16)   # 6 B, as requested
        odd = a[::2].clone()                         # 2000 B
        del odd                                      # its free
        a.resize_(2000)                              # new 8000 B, old freed
        empty = torch.empty(0)                       # no request
        pair = torch.randn(4, 8).split(4, dim=1)     # one storage: 128 B
    trace = _check(rec.trace, tmp_path)
    got = [(e.kind, e.id, e.size) for e in trace.events]
    assert got == [("alloc", 1, 4000), ("alloc", 2, 6), ("alloc", 3, 2000),
                   ("free", 3, 0), ("alloc", 4, 8000), ("free", 1, 0),
                   ("alloc", 5, 128)]
    assert rec.request_of(a) == 4 and rec.request_of(view) == 4
    assert rec.request_of(half) == 2 and rec.request_of(empty) is None
    assert rec.request_of(pair[1]) == 5
    # the resize holds both blocks for a moment (a new block, a copy, the
    # old one freed), as on CUDA
    assert rec.peak_live_bytes == 4000 + 6 + 8000


def test_a_storage_is_freed_when_its_last_view_dies():
    """The free is the storage's death (PyTorch keeps one Python object per
    storage while the storage lives), not the death of the tensor that made
    it."""
    with loom.record_cpu(real=True) as rec:
        base = torch.arange(100.)
        assert base.untyped_storage() is base.untyped_storage()
        view = base[10:20]
        del base
        assert [e.kind for e in rec.events] == ["alloc"]
        kept = view.t()  # one more view
        del view
        assert [e.kind for e in rec.events] == ["alloc"]
        del kept
        assert [e.kind for e in rec.events] == ["alloc", "free"]


def test_tensors_made_before_recording_are_not_requests_unless_tracked():
    before = torch.ones(256)
    tracked = torch.ones(64)
    with loom.record_cpu(real=True, tensors=[tracked]) as rec:
        before.mul_(2)                  # in place: no request
        alias = before[:10]             # a view of an unknown storage
        before.resize_(512)             # grows: a new request on CUDA
        fresh = before + 1
    kinds = [(e.kind, e.size) for e in rec.events]
    assert kinds == [("alloc", 256), ("alloc", 2048), ("alloc", 2048)]
    assert rec.request_of(tracked) == 1 and rec.request_of(before) == 2
    assert rec.setup_bytes == 256
    del alias, fresh


def test_frees_are_exact_the_live_requests_are_what_autograd_keeps():
    """After a forward, the live requests are exactly the storages autograd
    saved for the backward plus the ones the program still names."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16))
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with loom.record_cpu(real=True, model=model) as rec:
        x = torch.randn(8, 32)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = model(x)
            loss = y.pow(2).mean()
        live = set(_live_requests(rec.events))
        first = [e.kind for e in rec.events].index(loom_trace.ITER_BEGIN)
        setup = {e.id for e in rec.events[:first]}
        assert len(setup) == 4
        expected = {rec.request_of(t) for t in saved + [x, y, loss]}
        expected.discard(None)
        assert live - setup == expected - setup
        saved.clear()
        loss.backward()
        del x, y, loss
        # Only the set-up and the gradients (one per parameter) remain.
        remaining = _live_requests(rec.events)
        grads = {rec.request_of(p.grad) for p in model.parameters()}
        assert set(remaining) == setup | grads


def test_backward_runs_where_the_recorder_sees_it(tmp_path, libloom):
    del libloom
    model = torch.nn.Linear(16, 16)
    with loom.record_cpu(real=True, model=model) as rec:
        loss = model(torch.randn(4, 16)).sum()
        loss.backward()
    trace = _check(rec.trace, tmp_path)
    phases = [(i, e.name) for i, e in enumerate(trace.events)
              if e.kind == loom_trace.PHASE]
    assert [name for _, name in phases] == ["forward", "backward"]
    after = trace.events[phases[1][0]:]
    # ones_like of the root is made before the engine starts; the weight and
    # bias gradients (and the mm/sum of the backward) come after the marker
    grads = {rec.request_of(model.weight.grad), rec.request_of(
        model.bias.grad)}
    assert grads <= {e.id for e in after if e.kind == loom_trace.ALLOC}


def test_runs_of_frees_are_written_in_request_order():
    event = loom_trace.Event
    events = [event.alloc(1, 8), event.alloc(2, 8), event.alloc(3, 8),
              event.free(3), event.free(1), event("phase", name="x"),
              event.free(2), event.alloc(4, 8), event.free(4)]
    assert [(e.kind, e.id) for e in record_cpu.canonical_frees(events)] == [
        ("alloc", 1), ("alloc", 2), ("alloc", 3), ("free", 1), ("free", 3),
        ("phase", 0), ("free", 2), ("alloc", 4), ("free", 4)]
    with loom.record_cpu(real=True) as rec:
        tensors = [torch.ones(4) for _ in range(3)]
        tensors.reverse()
        del tensors  # the list drops them last-made first
    assert [e.id for e in rec.events if e.kind == "free"] == [1, 2, 3]


def test_host_tensors_are_not_requests():
    with loom.record_cpu(real=True) as rec:
        with rec.host():
            kept = torch.ones(100)       # e.g. a host-side batch
        device = kept + 1
        kept.resize_(1000)               # host memory stays unrecorded
        del kept
    assert [(e.kind, e.size) for e in rec.events] == [("alloc", 400)]
    del device


def test_a_recorder_records_once_and_nothing_after_stop():
    rec = record_cpu.Recorder(real=True)
    with rec:
        a = torch.ones(10)
    del a
    b = torch.ones(10)
    assert [e.kind for e in rec.events] == ["alloc"]
    with pytest.raises(loom.LoomError, match="records once"):
        rec.start()
    del b


# -------------------------------------------------- markers, iterations


class _Experts(torch.nn.Module):
    """A stand-in MoE block: tokens routed to the argmax expert."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(16, 4)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(16, 16)
                                           for _ in range(4))

    def forward(self, x):
        route = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for number, expert in enumerate(self.experts):
            rows = (route == number).nonzero().squeeze(-1)
            if rows.numel():
                out = out.index_add(0, rows, expert(x[rows]))
        return out


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 16)
        self.moe = _Experts()
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.relu(self.moe(self.inp(x)))).pow(2).mean()


def _train(model, optimizer, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(32, 16, generator=generator))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss  # else it lives on into the next iteration's start


def test_model_and_optimizer_give_iterations_phases_and_modules(tmp_path,
                                                                  libloom):
    del libloom
    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    params = len(list(model.parameters()))
    with loom.record_cpu(tmp_path / "net.ltt", real=True, model=model,
                         optimizer=optimizer, dynamic=["out"]) as rec:
        _train(model, optimizer, 4)
    trace = loom_trace.read_trace(tmp_path / "net.ltt")  # checked by libloom
    assert trace.events == rec.events
    assert [e.id for e in _events(trace, loom_trace.ITER_BEGIN)] == \
        [0, 1, 2, 3]
    assert len(_events(trace, loom_trace.ITER_END)) == 4
    # the set-up: every parameter, before the first iteration
    head = trace.events[:trace.events.index(_events(
        trace, loom_trace.ITER_BEGIN)[0])]
    assert len(head) == params and rec.setup_bytes == sum(
        p.numel() * 4 for p in model.parameters())
    spans = _iterations(trace)
    for begin, end in spans:
        phases = [e.name for e in trace.events[begin:end]
                  if e.kind == loom_trace.PHASE]
        assert phases == ["forward", "backward", "optimizer"]
    # modules: every module in the forward; the dynamic ones (the MoE
    # block by its class name, `out` by pattern) also in the backward
    enters = _events(trace, loom_trace.MODULE_ENTER)
    names = {e.name for e in enters}
    assert {"_Net", "inp", "moe", "moe.gate", "moe.experts.0",
            "out"} <= names
    dynamic = {e.name for e in enters if e.dynamic}
    assert dynamic == {"moe", "out"}
    assert rec.dynamic_modules == ["moe", "out"]
    begin, end = spans[1]
    backward = trace.events[begin:end]
    start = [e.name for e in backward].index("backward")
    in_backward = [e.name for e in backward[start:]
                   if e.kind == loom_trace.MODULE_ENTER]
    assert in_backward == ["out", "moe"]
    # every iteration frees what it made: the live bytes at the end of each
    # are the set-up plus the optimizer state made so far (AdamW makes a
    # parameter's state at its first gradient: experts the router left
    # idle get theirs later)
    # (zero_grad's frees follow the iteration's end: measured where the
    # next iteration begins, and at the end)
    state = sum(t.numel() * 4 for p in model.parameters()
                for key, t in optimizer.state[p].items() if key != "step")
    boundaries = [begin for begin, _ in spans[1:]] + [len(trace.events)]
    for index in boundaries:
        assert rec.setup_bytes < _live_bytes_at(trace, index) <= \
            rec.setup_bytes + state
    assert _live_bytes_at(trace, len(trace.events)) == rec.setup_bytes + state
    del params


def test_optimizer_step_counts_stay_on_the_host():
    """torch.optim keeps `step` (and foreach AdamW's increment) on the
    host: a steady optimizer phase requests only foreach sqrt's outputs,
    one per parameter, and nothing of 4 bytes."""
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    with loom.record_cpu(real=True, model=model, optimizer=optimizer) as rec:
        for _ in range(3):
            model(torch.randn(4, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    spans = _iterations(rec.trace)
    for begin, end in spans:
        events = rec.events[begin:end]
        start = [e.name for e in events].index("optimizer")
        sizes = [e.size for e in events[start:] if e.kind == loom_trace.ALLOC]
        state = [16 * 8 * 4, 8 * 4] * 2 if begin == spans[0][0] else []
        assert sorted(sizes) == sorted(state + [16 * 8 * 4, 8 * 4])
    assert optimizer.state[model.weight]["step"].item() == 3


def test_dense_iterations_repeat():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    with loom.record_cpu(real=True, model=model, optimizer=optimizer) as dense:
        for _ in range(5):
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    counts = dense.summary()["requests_per_iteration"]
    assert len(counts) == 5 and len(set(counts[1:])) == 1
    assert counts[0] > counts[1]  # the optimizer state, made once


def test_stop_closes_open_modules_and_iterations(tmp_path, libloom):
    del libloom
    rec = record_cpu.Recorder(real=True)
    with rec:
        rec.begin_iteration()
        rec.module_enter("outer")
        rec.module_enter("inner", dynamic=True)
        rec.module_exit("nowhere")       # not open: dropped
        keep = torch.ones(4)
        rec.module_exit("outer")         # closes inner first
        rec.module_enter("left-open")
        rec.step()                       # ends iteration 0
        rec.phase("forward")             # begins iteration 1
        rec.step()
        rec.step()                       # iteration 2 would be empty
    trace = _check(rec.trace, tmp_path)
    got = [(e.kind, e.name or e.id) for e in trace.events
           if e.kind != loom_trace.ALLOC]
    assert got == [("iter_begin", 0), ("module_enter", "outer"),
                   ("module_enter", "inner"), ("module_exit", "inner"),
                   ("module_exit", "outer"), ("module_enter", "left-open"),
                   ("module_exit", "left-open"), ("iter_end", 0),
                   ("iter_begin", 1), ("phase", "forward"), ("iter_end", 1)]
    with pytest.raises(loom.LoomError, match="non-empty name"):
        rec.phase("")
    del keep


def test_a_dynamic_pattern_that_matches_nothing_is_an_error():
    with pytest.raises(loom.LoomError, match="matches no module"):
        with loom.record_cpu(real=True, model=torch.nn.Linear(2, 2),
                             dynamic=["experts"]):
            pass
    assert record_cpu.dynamic_modules(_Net(), (), "Experts") == ["moe"]
    assert record_cpu.dynamic_modules(_Net(), ("re:^moe\\.experts\\.\\d$",),
                                      None) == [f"moe.experts.{i}"
                                                for i in range(4)]


# --------------------------------------------------- autocast on the CPU


def _autocast_cases(device):
    def bf(*shape):
        if device == "cpu":
            return torch.randn(*shape).to(torch.bfloat16)
        return torch.empty(*shape, device=device, dtype=torch.bfloat16)

    def fp(*shape):
        if device == "cpu":
            return torch.randn(*shape)
        return torch.empty(*shape, device=device)

    def ints(*shape):
        return torch.zeros(*shape, dtype=torch.long, device=device)

    functional = torch.nn.functional
    return {
        "exp": lambda: bf(4, 4).exp(),
        "log": lambda: bf(4, 4).log(),
        "rsqrt": lambda: bf(4, 4).rsqrt(),
        "pow": lambda: bf(4, 4).pow(2),
        "softmax": lambda: torch.softmax(bf(4, 4), -1),
        "softmax dtype": lambda: torch.softmax(bf(4, 4), -1,
                                               dtype=torch.bfloat16),
        "log_softmax": lambda: torch.log_softmax(bf(4, 4), -1),
        "sum": lambda: bf(4, 4).sum(),
        "sum dim": lambda: bf(4, 4).sum(0),
        "sum ints": lambda: ints(4).sum(),
        "cumsum": lambda: bf(4, 4).cumsum(0),
        "layer_norm": lambda: functional.layer_norm(bf(4, 4), (4,)),
        "rms_norm": lambda: functional.rms_norm(bf(4, 4), (4,)),
        "einsum": lambda: torch.einsum("ij,jk->ik", fp(4, 4), fp(4, 4)),
        "mv": lambda: torch.mv(fp(4, 4), fp(4)),
        "addcmul mixed": lambda: torch.addcmul(bf(4), bf(4), fp(4)),
        "addcmul bf16": lambda: torch.addcmul(bf(4), bf(4), bf(4)),
        "cat": lambda: torch.cat([bf(4), fp(4)]),
        "mm": lambda: fp(4, 4) @ fp(4, 4),
        "linear": lambda: functional.linear(fp(4, 4), fp(4, 4)),
        "prod": lambda: bf(4).prod(),
        "norm": lambda: bf(4).norm(),
        "norm dim": lambda: bf(4, 4).norm(dim=0),
        "cross_entropy": lambda: functional.cross_entropy(bf(4, 4), ints(4)),
        "logsumexp": lambda: bf(4, 4).logsumexp(0),
        "silu": lambda: functional.silu(bf(4)),
        "sdpa": lambda: functional.scaled_dot_product_attention(
            fp(1, 2, 4, 8), fp(1, 2, 4, 8), fp(1, 2, 4, 8)),
        "mse_loss": lambda: functional.mse_loss(bf(4), bf(4)),
        "softplus": lambda: functional.softplus(bf(4)),
    }


def test_cpu_autocast_follows_cuda_autocast():
    """Each op's result dtype under CPU autocast with the policy installed
    equals CUDA autocast's, asked of the installed torch itself with fake
    CUDA tensors (FakeTensorMode: no GPU needed)."""
    # pylint: disable-next=import-outside-toplevel
    from torch._subclasses.fake_tensor import FakeTensorMode
    assert cpu_autocast.check_tables() == {"missing": [], "stale": []}
    ours = {}
    policy = cpu_autocast.install()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for name, run in _autocast_cases("cpu").items():
                ours[name] = run().dtype
    finally:
        policy.remove()
    cuda = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        try:
            for name, run in _autocast_cases("cuda").items():
                cuda[name] = run().dtype
        finally:
            torch.set_autocast_enabled("cuda", False)
    assert ours == cuda
    # the CPU's own policy differs (what the recorder corrects), and is
    # back once the policy is removed
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = {name: run().dtype for name, run in
                 _autocast_cases("cpu").items()}
    assert plain["softmax"] == torch.bfloat16 != ours["softmax"]
    assert plain["mv"] == torch.float32 != ours["mv"]


def test_recorded_sizes_under_autocast_are_cuda_sizes():
    x = torch.randn(64, 32)
    w = torch.randn(32, 32, requires_grad=True)
    for cuda_policy, softmax_bytes in ((True, 64 * 32 * 4),
                                       (False, 64 * 32 * 2)):
        with loom.record_cpu(real=True, cuda_autocast=cuda_policy) as rec:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = x @ w
                p = torch.softmax(y, -1)
        sizes = {rec.request_of(t): None for t in (y, p)}
        got = {e.id: e.size for e in rec.events if e.id in sizes}
        assert got[rec.request_of(y)] == 64 * 32 * 2       # bf16 matmul
        assert got[rec.request_of(p)] == softmax_bytes     # float32 on CUDA


# --------------------------------------------------------------- models


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
    enters = _events(trace, loom_trace.MODULE_ENTER)
    dynamic = {e.name for e in enters if e.dynamic}
    assert dynamic == {"model.layers.0.mlp", "model.layers.0.mlp.experts",
                       "model.layers.1.mlp", "model.layers.1.mlp.experts"}
    assert not any(e.dynamic for e in enters if "attn" in e.name)
    # the routing is real: the experts' requests change size with the steps
    spans = _iterations(trace)
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
    begin, end = _iterations(recompute)[1]
    events = recompute.events[begin:end]
    start = [e.name for e in events].index("backward")
    assert "model.layers.3.self_attn" in {
        e.name for e in events[start:] if e.kind == loom_trace.MODULE_ENTER}
    # rank 0 of 2 stages x 2 chunks holds global chunks 0 and 2
    chunks = [e.name for e in _events(interleaved, loom_trace.MODULE_ENTER)
              if e.name.startswith("chunk")]
    assert set(chunks) == {"chunk0", "chunk2"}
    counts = peak(interleaved.events)["requests_per_iteration"]
    assert len(counts) == 4 and len(set(counts[1:])) == 1
    # the layers it holds: 0 (chunk 0) and 2 (chunk 2) of 4
    layers = {e.name.split(".")[2] for e in _events(
        interleaved, loom_trace.MODULE_ENTER)
        if e.name.startswith("model.layers.")}
    assert layers == {"0", "2"}
    # Megatron's deallocation of sent outputs: one-element tensors
    assert any(e.size == 4 for e in _events(interleaved, loom_trace.ALLOC))


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
    assert len(_events(reference, loom_trace.ITER_END)) == 4
    assert len(_events(reference, loom_trace.ALLOC)) == 4
