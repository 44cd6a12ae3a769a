"""The CPU recorder (loom.record_cpu, loom.tools.record_cpu) and CUDA's
autocast policy on the CPU (loom.tools.cpu_autocast), on the real torch
(the CPU build in .venv), with libloom reading and checking every trace.
Models by name, pipeline orders and `loom record-cpu`:
test_record_cpu_models.py."""

import pytest
import torch

import loom
from loom.tools import cpu_autocast
from loom.tools import record_cpu
from loom.tools import trace as loom_trace
from trace_reading import events_of, iteration_spans


def _live_requests(events):
    live = {}
    for event in events:
        if event.kind == loom_trace.ALLOC:
            live[event.id] = event.size
        elif event.kind == loom_trace.FREE:
            del live[event.id]
    return live


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
    assert [e.id for e in events_of(trace, loom_trace.ITER_BEGIN)] == \
        [0, 1, 2, 3]
    assert len(events_of(trace, loom_trace.ITER_END)) == 4
    # the set-up: every parameter, before the first iteration
    head = trace.events[:trace.events.index(events_of(
        trace, loom_trace.ITER_BEGIN)[0])]
    assert len(head) == params and rec.setup_bytes == sum(
        p.numel() * 4 for p in model.parameters())
    spans = iteration_spans(trace)
    for begin, end in spans:
        phases = [e.name for e in trace.events[begin:end]
                  if e.kind == loom_trace.PHASE]
        assert phases == ["forward", "backward", "optimizer"]
    # modules: every module in the forward; the dynamic ones (the MoE
    # block by its class name, `out` by pattern) also in the backward
    enters = events_of(trace, loom_trace.MODULE_ENTER)
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
    spans = iteration_spans(rec.trace)
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
