"""watch() on fake models and optimizers (torch's hook API, no torch): the
markers reach libloom and land in the recorded trace."""

import re

import pytest

from loom import markers
from loom.tools import trace as loom_trace
from loom.errors import LoomError
from loom_fakes import HOST, FakeModule, FakeOptimizer, FakeTensor, OldOptimizer


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


def _moe_model(native):
    """root -> layers.0 (dense), layers.1.experts.{0,1} (allocating)."""
    def expert_body(module, x):
        pointer = native.malloc(module.size, 0, None)
        native.free(pointer, module.size, 0, None)
        out = FakeTensor(name="expert_out")
        module.outputs.append((x, out))
        return out

    root = FakeModule()
    layers = root.child("layers", FakeModule())
    layers.child("0", FakeModule())
    moe = layers.child("1", FakeModule())
    experts = moe.child("experts", FakeModule())
    for index, size in enumerate((1000, 2000)):
        expert = experts.child(str(index), FakeModule(body=expert_body))
        expert.size, expert.outputs = size, []

    def moe_body(module, x):
        return [experts.children[0](x), experts.children[1](x)]

    moe.body = moe_body

    def root_body(module, x):
        layers.children[0](x)
        outs = moe(FakeTensor(name="moe_in"))
        return {"logits": FakeTensor(requires_grad=True), "aux": outs}

    root.body = root_body
    return root, experts


def test_watch_model_and_optimizer(loom_env, tmp_path):
    loom = loom_env
    session = _record(loom, tmp_path)
    model, experts = _moe_model(session.native)
    optimizer = FakeOptimizer()
    handle = loom.watch(model, dynamic=["layers.*.experts.*"])
    assert handle.dynamic_modules == ["layers.1.experts.0",
                                      "layers.1.experts.1"]
    loom.watch(optimizer)
    for _ in range(2):
        out = model(FakeTensor())
        out["logits"].grad_arrives()          # backward reaches the model
        for expert in experts.children:        # and the experts, inner first
            x, y = expert.outputs.pop()
            y.grad_arrives()
            x.grad_arrives()
        optimizer.step()
    assert _markers(loom, tmp_path) == [
        "iter_begin:0", "phase:forward",
        "enter:layers.1.experts.0:1", "alloc", "free",
        "exit:layers.1.experts.0",
        "enter:layers.1.experts.1:1", "alloc", "free",
        "exit:layers.1.experts.1",
        "phase:backward",
        "enter:layers.1.experts.0:1", "exit:layers.1.experts.0",
        "enter:layers.1.experts.1:1", "exit:layers.1.experts.1",
        "phase:optimizer", "iter_end:0", "iter_begin:1",
        "phase:forward",
        "enter:layers.1.experts.0:1", "alloc", "free",
        "exit:layers.1.experts.0",
        "enter:layers.1.experts.1:1", "alloc", "free",
        "exit:layers.1.experts.1",
        "phase:backward",
        "enter:layers.1.experts.0:1", "exit:layers.1.experts.0",
        "enter:layers.1.experts.1:1", "exit:layers.1.experts.1",
        "phase:optimizer", "iter_end:1", "iter_begin:2", "iter_end:2"]
    assert loom.memory_stats()["loom.dynamic_requests"] == 4


def test_eval_and_no_grad_forward(loom_env, tmp_path):
    loom = loom_env
    _record(loom, tmp_path)
    model = FakeModule(body=lambda m, x: FakeTensor(requires_grad=False))
    loom.watch(model)
    model.training = False
    model(FakeTensor())               # eval: no iteration begins
    model.training = True
    out = model(FakeTensor())         # no tensor requires grad: no backward
    assert out.hooks == []
    assert _markers(loom, tmp_path) == ["phase:eval", "iter_begin:0",
                                        "phase:forward", "iter_end:0"]


def test_handles_remove_every_hook(loom_env, tmp_path):
    loom = loom_env
    _record(loom, tmp_path)
    model, experts = _moe_model(FakeNative())
    optimizer = FakeOptimizer()
    handles = [loom.watch(model, dynamic="re:experts\\.[01]$"),
               loom.watch(optimizer)]
    assert model.pre_hooks and experts.children[0].pre_hooks
    for handle in handles:
        handle.remove()
    assert not model.pre_hooks and not model.post_hooks
    assert not experts.children[1].pre_hooks
    assert not experts.children[1].post_hooks
    assert not optimizer.pre and not optimizer.post


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


def test_markers_without_loom_are_no_ops(no_session):
    loom = no_session
    loom.step()
    loom.phase("forward")
    loom.module_enter("x", True)
    loom.module_exit("x")
    model = FakeModule(body=lambda m, x: FakeTensor())
    loom.watch(model, dynamic=None)
    model(FakeTensor()).grad_arrives()
    optimizer = FakeOptimizer()
    loom.watch(optimizer)
    optimizer.step()
    assert loom.status() is None and loom.finish() is None
    with pytest.raises(LoomError, match="loom is not enabled in this process"):
        loom.memory_stats()


def test_watch_argument_errors():
    import loom
    model = FakeModule()
    model.child("encoder", FakeModule()).child("block", FakeModule())
    with pytest.raises(LoomError, match="takes a torch.nn.Module or a torch."
                                        "optim.Optimizer, got int"):
        loom.watch(3)
    with pytest.raises(LoomError) as error:
        loom.watch(model, dynamic=["*.experts.*"])
    assert str(error.value) == ("dynamic pattern '*.experts.*' matches no "
                                "module of the model (names look like "
                                "'encoder', 'encoder.block')")
    with pytest.raises(LoomError, match="bad regex"):
        loom.watch(model, dynamic=["re:(("])
    with pytest.raises(LoomError, match="patterns are strings"):
        loom.watch(model, dynamic=[42])
    with pytest.raises(LoomError, match="dynamic= applies to models"):
        loom.watch(FakeOptimizer(), dynamic=["x"])
    with pytest.raises(LoomError, match="expected a non-empty name"):
        loom.phase("")
    handle = loom.watch(model, dynamic=[re.compile(r"block$")])
    assert handle.dynamic_modules == ["encoder.block"]
    handle.remove()


def test_grad_tensor_finds_outputs_in_containers():
    plain = FakeTensor(requires_grad=False)
    wanted = FakeTensor()
    assert markers.grad_tensor(wanted) is wanted
    assert markers.grad_tensor(plain) is None
    assert markers.grad_tensor((plain, [None, {"x": wanted}])) is wanted
    assert markers.grad_tensor({"a": 1, "b": "text"}) is None
    assert markers.grad_tensor([[[[[wanted]]]]]) is None  # too deep


class FakeNative:
    """Just enough of _native.Native for models that allocate."""

    def malloc(self, size, device, stream):
        return 1

    def free(self, *args):
        pass
