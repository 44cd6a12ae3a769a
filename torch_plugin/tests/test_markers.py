"""watch() on real torch models, optimizers and tensors (the CPU build):
the markers reach libloom and land in the recorded trace, in the order real
autograd runs the hooks. What stays a stand-in: OldOptimizer (Megatron's
optimizers are not torch.optim.Optimizers and have no step hooks; Megatron
is not installed) and FakeNative (libloom's allocator, for models that only
need to call it)."""

import re

import pytest

from loom import markers
from loom.tools import trace as loom_trace
from loom.errors import LoomError
from loom_fakes import HOST, OldOptimizer


def _record(loom, tmp_path):
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     trace_format="text", **HOST)
    # The device's allocator (and its recording) starts at its first use.
    session.native.free(session.native.malloc(64, 0, None), 64, 0, None)
    return session


def _markers(loom, tmp_path):
    """The recorded trace's marker events as short strings."""
    loom.finish()
    trace = loom_trace.read_trace(tmp_path / "trace.rank0.ltt")
    out = []
    for e in trace.events[2:]:  # after _record's alloc and free
        if e.kind in ("iter_begin", "iter_end"):
            out.append(f"{e.kind}:{e.id}")
        elif e.kind == "phase":
            out.append(f"phase:{e.name}")
        elif e.kind == "module_enter":
            out.append(f"enter:{e.name}:{int(e.dynamic)}")
        elif e.kind == "module_exit":
            out.append(f"exit:{e.name}")
        else:
            out.append(e.kind)
    return out


def _moe_model(torch, native):
    """layers.0 (dense), layers.1.experts.{0,1}: each expert gets every
    other token, allocates through libloom in its forward and, in an
    autograd function around its output, in its backward."""

    class Allocates(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, size):  # pylint: disable=arguments-differ
            ctx.size = size
            return x.clone()

        @staticmethod
        def backward(ctx, grad):  # pylint: disable=arguments-differ
            native.free(native.malloc(ctx.size, 0, None), ctx.size, 0, None)
            return grad, None

    class Expert(torch.nn.Module):
        def __init__(self, size):
            super().__init__()
            self.size = size
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            native.free(native.malloc(self.size, 0, None), self.size, 0,
                        None)
            return Allocates.apply(self.lin(x), self.size)

    class MoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList([Expert(1000), Expert(2000)])

        def forward(self, x):
            return [expert(x[i::2]) for i, expert in enumerate(self.experts)]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), MoE()])

        def forward(self, x):
            outs = self.layers[1](self.layers[0](x))
            return {"logits": torch.cat(outs).sum(), "aux": outs}

    model = Model()
    return model, model.layers[1].experts


def test_watch_model_and_optimizer(loom_env, tmp_path, torch):
    loom = loom_env
    session = _record(loom, tmp_path)
    model, _ = _moe_model(torch, session.native)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = loom.watch(model, dynamic=[r"re:experts\.\d+$"])
    assert handle.dynamic_modules == ["layers.1.experts.0",
                                      "layers.1.experts.1"]
    loom.watch(optimizer)
    for _ in range(2):
        out = model(torch.randn(4, 4))
        out["logits"].backward()
        optimizer.step()
        optimizer.zero_grad()
    # Autograd runs the experts' backward in reverse (experts.1 first); each
    # expert's window opens when its output's gradient arrives and closes
    # when its input's is done, so its backward allocation lies inside.
    iteration = [
        "phase:forward",
        "enter:layers.1.experts.0:1", "alloc", "free",
        "exit:layers.1.experts.0",
        "enter:layers.1.experts.1:1", "alloc", "free",
        "exit:layers.1.experts.1",
        "phase:backward",
        "enter:layers.1.experts.1:1", "alloc", "free",
        "exit:layers.1.experts.1",
        "enter:layers.1.experts.0:1", "alloc", "free",
        "exit:layers.1.experts.0",
        "phase:optimizer"]
    assert _markers(loom, tmp_path) == (
        ["iter_begin:0"] + iteration + ["iter_end:0", "iter_begin:1"] +
        iteration + ["iter_end:1", "iter_begin:2", "iter_end:2"])
    assert loom.memory_stats()["loom.dynamic_requests"] == 8


def _nested_moe(torch):
    """Two MoE blocks shaped like transformers': 0.experts is one module
    with a forward (v5's fused experts) around a Linear and an act_fn;
    2.experts is a ModuleList (never called, as in v4) of two experts, each
    around a Linear and an act_fn, each given every other token. A dense
    layer between them."""

    class Expert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.act_fn = torch.nn.SiLU()

        def forward(self, x):
            return self.act_fn(self.lin(x))

    class Fused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = Expert()

        def forward(self, x):
            return self.experts(x)

    class Listed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList([Expert(), Expert()])

        def forward(self, x):
            return torch.cat([expert(x[i::2])
                              for i, expert in enumerate(self.experts)])

    return torch.nn.Sequential(Fused(), torch.nn.Linear(4, 4), Listed())


class _MarkerCalls:
    """Counts the marker calls that reach libloom through `native` (the
    session's Native), by kind and module name."""

    def __init__(self, native):
        self.calls = []
        for kind in ("module_enter", "module_exit"):
            original = getattr(native, kind)

            def counted(name, *args, _kind=kind, _original=original):
                self.calls.append((_kind, name))
                return _original(name, *args)

            setattr(native, kind, counted)


def test_only_outermost_dynamic_modules_are_marked(loom_env, tmp_path,
                                                   torch):
    loom = loom_env
    session = _record(loom, tmp_path)
    model = _nested_moe(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # models.dynamic_modules' patterns for the MoE: they match the experts
    # and every module inside them.
    handle = loom.watch(model, dynamic=["*.experts", "*.experts.*"])
    loom.watch(optimizer)
    assert handle.dynamic_modules == [
        "0.experts", "2.experts", "2.experts.0", "2.experts.1"]
    assert handle.nested_modules == [
        "0.experts.lin", "0.experts.act_fn", "2.experts.0.lin",
        "2.experts.0.act_fn", "2.experts.1.lin", "2.experts.1.act_fn"]
    # Hooks only where markers come from (the ModuleList's are never run).
    assert [name for name, *_ in _hooks(model)] == [
        "", "0.experts", "2.experts", "2.experts.0", "2.experts.1"]
    counted = _MarkerCalls(session.native)
    steps = 3
    for _ in range(steps):
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    # Per step, 4 calls into libloom per call of a marked module (enter and
    # exit, forward and backward): 3 modules, 12 calls, where marking
    # every match took 36.
    assert len(counted.calls) == steps * 12
    assert {name for _, name in counted.calls} == {
        "0.experts", "2.experts.0", "2.experts.1"}
    iteration = [
        "phase:forward",
        "enter:0.experts:1", "exit:0.experts",
        "enter:2.experts.0:1", "exit:2.experts.0",
        "enter:2.experts.1:1", "exit:2.experts.1",
        "phase:backward",
        "enter:2.experts.1:1", "exit:2.experts.1",
        "enter:2.experts.0:1", "exit:2.experts.0",
        "enter:0.experts:1", "exit:0.experts",
        "phase:optimizer"]
    assert _markers(loom, tmp_path) == (
        ["iter_begin:0"] + iteration + ["iter_end:0", "iter_begin:1"] +
        iteration + ["iter_end:1", "iter_begin:2"] + iteration +
        ["iter_end:2", "iter_begin:3", "iter_end:3"])
    handle.remove()
    assert [name for name, *_ in _hooks(model)] == []


def test_backward_markers_of_a_leaf_input(loom_env, tmp_path, torch):
    """A dynamic module whose input is a leaf that outlives the step: its
    backward exit is a tensor hook on the leaf, taken off when it fires,
    so hooks do not pile up on the leaf step after step."""
    loom = loom_env
    _record(loom, tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    leaf = torch.randn(2, 4, requires_grad=True)
    loom.watch(model, dynamic=["0"])
    for _ in range(3):
        model(leaf).sum().backward()
        assert not leaf._backward_hooks
        loom.step()
    iteration = ["phase:forward", "enter:0:1", "exit:0", "phase:backward",
                 "enter:0:1", "exit:0"]
    assert _markers(loom, tmp_path) == (
        ["iter_begin:0"] + iteration + ["iter_end:0", "iter_begin:1"] +
        iteration + ["iter_end:1", "iter_begin:2"] + iteration +
        ["iter_end:2", "iter_begin:3", "iter_end:3"])


def test_eval_and_no_grad_forward(loom_env, tmp_path, torch):
    loom = loom_env
    _record(loom, tmp_path)
    model = torch.nn.Linear(4, 4)
    loom.watch(model)
    model.eval()
    model(torch.randn(2, 4))          # eval: no iteration begins
    model.train()
    with torch.no_grad():
        out = model(torch.randn(2, 4))  # no tensor requires grad
    assert not out.requires_grad and out.grad_fn is None
    assert _markers(loom, tmp_path) == ["phase:eval", "iter_begin:0",
                                        "phase:forward", "iter_end:0"]


def _hooks(module):
    return [(name, len(m._forward_pre_hooks), len(m._forward_hooks))
            for name, m in module.named_modules()
            if m._forward_pre_hooks or m._forward_hooks]


def test_handles_remove_every_hook(loom_env, tmp_path, torch):
    loom = loom_env
    _record(loom, tmp_path)
    model, _ = _moe_model(torch, FakeNative())
    optimizer = torch.optim.AdamW(model.parameters())
    handles = [loom.watch(model, dynamic="re:experts\\.[01]$"),
               loom.watch(optimizer)]
    assert _hooks(model) == [("", 1, 1), ("layers.1.experts.0", 1, 1),
                             ("layers.1.experts.1", 1, 1)]
    assert len(optimizer._optimizer_step_pre_hooks) == 1
    assert len(optimizer._optimizer_step_post_hooks) == 1
    for handle in handles:
        handle.remove()
    assert _hooks(model) == []
    assert not optimizer._optimizer_step_pre_hooks
    assert not optimizer._optimizer_step_post_hooks


def test_optimizer_without_hooks_is_wrapped(loom_env, tmp_path):
    loom = loom_env
    _record(loom, tmp_path)
    optimizer = OldOptimizer()
    handle = loom.watch(optimizer)
    assert optimizer.step() == "stepped"
    assert optimizer.step() == "stepped"
    assert optimizer.steps == 2
    handle.remove()
    assert "step" not in optimizer.__dict__
    optimizer.step()
    assert _markers(loom, tmp_path) == [
        "phase:optimizer", "iter_begin:1", "phase:optimizer", "iter_end:1",
        "iter_begin:2", "iter_end:2"]


def test_module_exits_always_nest(loom_env, tmp_path):
    loom = loom_env
    _record(loom, tmp_path)
    loom.module_enter("a", True)
    loom.module_enter("b")
    loom.module_enter("c", True)
    loom.module_exit("b")        # c's exit never came: closed first
    loom.module_exit("zzz")      # not open: dropped
    loom.module_exit("c")        # already closed: dropped
    loom.module_exit("a")
    assert _markers(loom, tmp_path) == [
        "enter:a:1", "enter:b:0", "enter:c:1", "exit:c", "exit:b", "exit:a"]


def test_markers_without_loom_are_no_ops(no_session, torch, transformers):
    del transformers  # loom.hf_callback() imports it
    loom = no_session
    loom.step()
    loom.phase("forward")
    loom.module_enter("x", True)
    loom.module_exit("x")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    loom.watch(model, dynamic=["1"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loom.watch(optimizer)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    wrapped = loom.megatron_forward_step(lambda data, m: (m(data), None))
    wrapped(torch.randn(2, 4), model)[0].sum().backward()
    assert loom.status() is None and loom.finish() is None
    with pytest.raises(LoomError, match="loom is not enabled in this process"):
        loom.memory_stats()


def test_watch_argument_errors(torch):
    import loom
    model = torch.nn.Module()
    model.encoder = torch.nn.Module()
    model.encoder.block = torch.nn.Linear(2, 2)
    with pytest.raises(LoomError, match="takes a torch.nn.Module or a torch."
                                        "optim.Optimizer, got int"):
        loom.watch(3)
    with pytest.raises(LoomError, match="got Tensor"):
        loom.watch(torch.zeros(1))
    with pytest.raises(LoomError) as error:
        loom.watch(model, dynamic=["*.experts.*"])
    assert str(error.value) == ("dynamic pattern '*.experts.*' matches no "
                                "module of the model (names look like "
                                "'encoder', 'encoder.block')")
    assert _hooks(model) == [], "a refused watch() leaves no hook behind"
    with pytest.raises(LoomError, match="bad regex"):
        loom.watch(model, dynamic=["re:(("])
    with pytest.raises(LoomError, match="patterns are strings"):
        loom.watch(model, dynamic=["encoder", 42])
    assert _hooks(model) == []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(LoomError, match="dynamic= applies to models"):
        loom.watch(optimizer, dynamic=["x"])
    with pytest.raises(LoomError, match="expected a non-empty name"):
        loom.phase("")
    handle = loom.watch(model, dynamic=[re.compile(r"block$")])
    assert handle.dynamic_modules == ["encoder.block"]
    handle.remove()
    assert _hooks(model) == []


def test_grad_tensor_finds_outputs_in_containers(torch, transformers):
    from transformers.modeling_outputs import CausalLMOutput
    plain = torch.zeros(2)
    wanted = torch.zeros(2, requires_grad=True) * 2
    assert markers.grad_tensor(wanted) is wanted
    assert markers.grad_tensor(plain) is None
    assert markers.grad_tensor((plain, [None, {"x": wanted}])) is wanted
    assert markers.grad_tensor({"a": 1, "b": "text"}) is None
    assert markers.grad_tensor([[[[[wanted]]]]]) is None  # too deep
    # What Hugging Face models return: a ModelOutput (an OrderedDict).
    output = CausalLMOutput(loss=wanted.sum(), logits=plain)
    assert isinstance(output, transformers.utils.ModelOutput)
    assert markers.grad_tensor(output) is output.loss
    assert markers.grad_tensor(CausalLMOutput(logits=wanted)) is wanted


class FakeNative:
    """Just enough of _native.Native for models that allocate."""

    def malloc(self, size, device, stream):
        return 1

    def free(self, *args):
        pass
