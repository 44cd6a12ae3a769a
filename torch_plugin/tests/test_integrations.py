"""Hugging Face Trainer callback and the Megatron forward-step wrapper,
driven the way those frameworks call them (no transformers, no torch)."""

import importlib.util

import pytest

from loom import integrations
from loom.tools import trace as loom_trace
from loom.errors import LoomError
from loom_fakes import HOST, FakeModule, FakeTensor


class TrainerCallback:
    """transformers.TrainerCallback's shape: every event a no-op."""

    def on_train_begin(self, args, state, control, **kwargs):
        pass


def _session(loom, tmp_path):
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     trace_format="text", **HOST)
    session.native.free(session.native.malloc(64), 64)
    return session


def _marker_names(tmp_path):
    trace = loom_trace.read_trace(tmp_path / "trace.rank0.ltt")
    out = []
    for e in trace.events[2:]:
        if e.kind in ("iter_begin", "iter_end"):
            out.append(f"{e.kind}:{e.id}")
        elif e.kind == "phase":
            out.append(e.name)
        elif e.kind in ("module_enter", "module_exit"):
            out.append(f"{e.kind}:{e.name}")
        else:
            out.append(e.kind)
    return out


def test_hf_callback_follows_the_trainer_loop(loom_env, tmp_path):
    loom = loom_env
    session = _session(loom, tmp_path)
    callback = integrations._make_hf_callback_class(TrainerCallback)(
        dynamic=["moe"])
    assert isinstance(callback, TrainerCallback)
    def root_body(module, x):
        moe(FakeTensor(requires_grad=False))
        return FakeTensor()

    model = FakeModule(body=root_body)
    moe = model.child("moe", FakeModule(body=lambda m, x: FakeTensor()))
    args = state = control = object()
    # What Trainer does: on_train_begin(model=...), then per optimizer step
    # on_step_begin, forward/backward (x2 with gradient accumulation),
    # on_pre_optimizer_step, optimizer.step(), on_step_end; evaluation in
    # between steps; on_train_end.
    callback.on_train_begin(args, state, control, model=model,
                            tokenizer=None)
    for _ in range(2):
        callback.on_step_begin(args, state, control)
        for _ in range(2):
            pointer = session.native.malloc(4096)
            model(FakeTensor()).grad_arrives()
            session.native.free(pointer, 4096)
        callback.on_pre_optimizer_step(args, state, control)
        callback.on_step_end(args, state, control)
        model.training = False
        model(FakeTensor())  # evaluation: outside iterations
        model.training = True
    callback.on_train_end(args, state, control)
    assert not model.pre_hooks and not moe.pre_hooks, "hooks removed"
    assert loom.status()["finished"]  # the trace was written
    micro = ["alloc", "forward", "module_enter:moe", "module_exit:moe",
             "backward", "free"]
    evaluation = ["eval", "module_enter:moe", "module_exit:moe"]
    assert _marker_names(tmp_path) == (
        ["iter_begin:0"] + micro * 2 + ["optimizer", "iter_end:0"] +
        evaluation +
        ["iter_begin:1"] + micro * 2 + ["optimizer", "iter_end:1"] +
        evaluation)


def test_hf_callback_needs_transformers():
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed here")
    with pytest.raises(LoomError, match="needs the transformers package"):
        integrations.hf_callback()


def test_megatron_forward_step_marks_micro_batches(loom_env, tmp_path):
    loom = loom_env
    _session(loom, tmp_path)
    outputs = []

    def forward_step(data_iterator, model):
        """Megatron's contract: (output_tensor, loss_func)."""
        out = FakeTensor()
        outputs.append(out)
        return out, (lambda t: t)

    wrapped = loom.megatron_forward_step(forward_step)
    assert wrapped.__name__ == "forward_step"
    assert wrapped.__doc__.startswith("Megatron's contract")
    # 1F1B with two micro-batches: F0 F1 B0 B1, then the optimizer.
    result = wrapped(iter(()), None)
    assert result[0] is outputs[0]
    wrapped(iter(()), None)
    outputs[0].grad_arrives()
    outputs[1].grad_arrives()
    loom.step()
    loom.finish()
    assert _marker_names(tmp_path) == [
        "forward", "forward", "backward", "backward", "iter_begin:1",
        "iter_end:1"]
    with pytest.raises(LoomError, match="is not callable"):
        loom.megatron_forward_step(None)
