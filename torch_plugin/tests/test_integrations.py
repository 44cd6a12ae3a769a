"""Hugging Face Trainer callback and the Megatron forward-step wrapper, on
real torch models and tensors, with transformers' own TrainerCallback and
CallbackHandler (the object through which Trainer calls its callbacks).
Trainer itself needs accelerate, which the project's Python does not have,
so the handler is driven the way Trainer's training loop drives it.
Megatron is not installed: its forward-step contract is a plain
function."""

import types

import pytest

import installed
from loom.errors import LoomError
from loom.tools import trace as loom_trace
from loom_fakes import HOST


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


def _moe_model(torch):
    class Model(torch.nn.Module):
        """A dense layer and a module "moe" fed a detached input (no
        gradient flows back into it: no backward window)."""

        def __init__(self):
            super().__init__()
            self.dense = torch.nn.Linear(4, 4)
            self.moe = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.dense(x) + self.moe(x.detach())

    return Model()


def test_hf_callback_follows_the_trainer_loop(loom_env, tmp_path, torch,
                                              transformers):
    from transformers.trainer_callback import CallbackHandler
    loom = loom_env
    session = _session(loom, tmp_path)
    callback = loom.hf_callback(dynamic=["moe"])
    assert isinstance(callback, transformers.TrainerCallback)
    model = _moe_model(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = CallbackHandler([callback], model, None, optimizer, None)
    args = types.SimpleNamespace()  # TrainingArguments needs accelerate
    state = transformers.TrainerState()
    control = transformers.TrainerControl()
    # What Trainer's loop does: on_train_begin (the handler passes model=),
    # then per optimizer step on_step_begin, forward/backward (x2 with
    # gradient accumulation), on_pre_optimizer_step, optimizer.step(),
    # on_optimizer_step, on_step_end; evaluation in between steps;
    # on_train_end.
    handler.on_train_begin(args, state, control)
    for _ in range(2):
        handler.on_step_begin(args, state, control)
        for _ in range(2):
            pointer = session.native.malloc(4096)
            model(torch.randn(2, 4)).sum().backward()
            session.native.free(pointer, 4096)
        handler.on_pre_optimizer_step(args, state, control)
        optimizer.step()
        handler.on_optimizer_step(args, state, control)
        handler.on_step_end(args, state, control)
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 4))  # evaluation: outside iterations
        model.train()
    handler.on_train_end(args, state, control)
    assert not model._forward_pre_hooks and not model.moe._forward_pre_hooks, \
        "hooks removed"
    assert not model._forward_hooks and not model.moe._forward_hooks
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
    """In a Python where transformers is not installed (it is here: the
    child makes its import fail as a missing package does)."""
    result = installed.run_python("""
        import json
        import loom
        from loom.errors import LoomError
        try:
            loom.hf_callback()
        except LoomError as error:
            print(json.dumps(str(error)))
        """, without=["transformers"])
    assert result.returncode == 0, result.stderr
    assert installed.last_json(result) == (
        "loom.hf_callback() needs the transformers package (No module named "
        "'transformers')")


def test_megatron_forward_step_marks_micro_batches(loom_env, tmp_path, torch):
    loom = loom_env
    _session(loom, tmp_path)
    model = torch.nn.Linear(4, 4)
    outputs = []

    def forward_step(data_iterator, model):
        """Megatron's contract: (output_tensor, loss_func)."""
        out = model(next(data_iterator))
        outputs.append(out)
        return out, (lambda t: t.sum())

    wrapped = loom.megatron_forward_step(forward_step)
    assert wrapped.__name__ == "forward_step"
    assert wrapped.__doc__.startswith("Megatron's contract")
    # 1F1B with two micro-batches: F0 F1 B0 B1, then the optimizer.
    data = iter([torch.randn(2, 4), torch.randn(2, 4)])
    result = wrapped(data, model)
    assert result[0] is outputs[0]
    wrapped(data, model)
    for out in outputs:
        out.sum().backward()
    loom.step()
    loom.finish()
    assert _marker_names(tmp_path) == [
        "forward", "forward", "backward", "backward", "iter_begin:1",
        "iter_end:1"]
    with pytest.raises(LoomError, match="is not callable"):
        loom.megatron_forward_step(None)
