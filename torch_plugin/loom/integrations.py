"""Framework integrations: Hugging Face Trainer and Megatron-style loops.

Plain PyTorch loops need nothing here: `loom.watch(optimizer)` (or
`loom.step()` at the end of each iteration) and optionally
`loom.watch(model, dynamic=[...])`.

- Hugging Face: `trainer = Trainer(..., callbacks=[loom.hf_callback()])`.
  The callback class is built on first use from transformers'
  TrainerCallback (transformers is imported only then). Iterations follow
  the Trainer's optimizer steps (on_step_begin / on_step_end, so evaluation,
  logging and checkpointing between steps stay outside iterations); phases
  and dynamic modules come from watch(model) at on_train_begin; the trace is
  written at on_train_end (record mode).
- Megatron-style schedules (forward_backward_func over micro-batches, then
  optimizer.step()): `loom.megatron_forward_step(forward_step)` wraps the
  forward-step function handed to the schedule, so every micro-batch marks
  "forward" and its output's gradient marks "backward" (this works with
  pipeline schedules that interleave micro-batches, and with virtual
  pipelines). Mark iterations with `loom.step()` right after each
  `train_step(...)` in the training loop, or `loom.watch(optimizer)`
  (Megatron's optimizers have no step hooks: watch wraps `step`).
"""

import functools

from loom import _state
from loom import markers
from loom.errors import LoomError


def _make_hf_callback_class(base):
    """A TrainerCallback subclass of `base` (transformers.TrainerCallback, or
    a stand-in with the same methods in tests)."""

    class LoomCallback(base):
        """Marks loom iterations at the Trainer's optimizer steps."""

        def __init__(self, dynamic=None, finish_on_train_end=True):
            super().__init__()
            self.dynamic = dynamic
            self.finish_on_train_end = finish_on_train_end
            self.handle = None

        def on_train_begin(self, args, state, control_, model=None, **kwargs):
            if model is not None and self.handle is None:
                self.handle = markers.watch(model, dynamic=self.dynamic,
                                            iterations=False)

        def on_step_begin(self, args, state, control_, **kwargs):
            markers.begin_iteration()

        def on_pre_optimizer_step(self, args, state, control_, **kwargs):
            if _state.current() is not None:
                markers.phase("optimizer")

        def on_step_end(self, args, state, control_, **kwargs):
            markers.end_iteration()

        def on_train_end(self, args, state, control_, **kwargs):
            if self.handle is not None:
                self.handle.remove()
                self.handle = None
            session = _state.current()
            if self.finish_on_train_end and session is not None:
                session.finish(wait=True)  # as loom.finish()

    return LoomCallback


_hf_class = None


def hf_callback(dynamic=None, finish_on_train_end=True):
    """A transformers TrainerCallback that marks loom's iterations, phases
    and dynamic modules (module-name patterns, as for loom.watch)."""
    global _hf_class  # pylint: disable=global-statement
    if _hf_class is None:
        try:
            # pylint: disable-next=import-outside-toplevel
            from transformers import TrainerCallback
        except ImportError as error:
            raise LoomError(f"loom.hf_callback() needs the transformers "
                            f"package ({error})") from None
        _hf_class = _make_hf_callback_class(TrainerCallback)
    return _hf_class(dynamic=dynamic, finish_on_train_end=finish_on_train_end)


def megatron_forward_step(forward_step_func):
    """Wraps a Megatron forward-step function `f(data_iterator, model, ...)
    -> (output_tensor, loss_func)`: marks "forward" before each micro-batch
    and "backward" when the gradient of its output arrives."""
    if not callable(forward_step_func):
        raise LoomError(f"megatron_forward_step: {forward_step_func!r} is not "
                        f"callable")

    @functools.wraps(forward_step_func)
    def forward_step(*args, **kwargs):
        if _state.current() is not None:
            markers.phase("forward")
        result = forward_step_func(*args, **kwargs)
        output = result[0] if isinstance(result, tuple) and result else result
        if _state.current() is not None:
            markers.mark_backward(output)
        return result

    return forward_step
