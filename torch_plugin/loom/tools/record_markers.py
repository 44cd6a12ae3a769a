"""The markers and hooks of loom.tools.record_cpu's Recorder: iterations,
phases and modules put into the recorded trace (by hand, or by hooks on a
watched model and optimizer), as loom's own markers put them in a GPU
recording. A mixin: the Recorder holds the state (`events`, `_lock`,
`_recording`, `_iteration`, `_pending`, `_stack`, ...) and records
requests; this part only appends marker events (docs/plugin.md,
"Recording on the CPU", Markers).
"""

from loom.errors import LoomError
from loom.tools import trace as loom_trace
from loom.tools.record_modules import hook_modules, hook_root
from loom.tools.trace import Event


class RecorderMarkers:
    """Marker events and the hooks that send them (mixed into Recorder)."""

    # --------------------------------------------------------------- markers

    def _emit(self, event):
        self._ensure_iteration()
        self.events.append(event)

    def _ensure_iteration(self):
        if self._pending:
            self._pending = False
            self._begin()

    def _begin(self):
        if self._iteration is None:
            self._iteration = self._next_iteration
            self._next_iteration += 1
            self.events.append(Event(loom_trace.ITER_BEGIN,
                                     id=self._iteration))

    def _close_modules(self):
        while self._stack:
            self.events.append(Event(loom_trace.MODULE_EXIT,
                                     name=self._stack.pop()))

    def begin_iteration(self):
        """Begins an iteration unless one is open."""
        with self._lock:
            if self._recording:
                self._pending = False
                self._begin()

    def end_iteration(self):
        """Ends the open iteration (open modules are closed first)."""
        with self._lock:
            self._pending = False
            if self._recording and self._iteration is not None:
                self._close_modules()
                self.events.append(Event(loom_trace.ITER_END,
                                         id=self._iteration))
                self._iteration = None

    def step(self):
        """Ends the iteration; the next begins with the next forward,
        phase, module or allocation (frees alone do not begin one)."""
        with self._lock:
            self.end_iteration()
            self._pending = self._recording

    def phase(self, name):
        """Marks the start of phase `name` (forward, backward, optimizer,
        eval, or any name)."""
        if not isinstance(name, str) or not name:
            raise LoomError(f"record_cpu: a phase needs a non-empty name, "
                            f"got {name!r}")
        with self._lock:
            if self._recording:
                self._emit(Event(loom_trace.PHASE, name=name))

    def module_enter(self, name, dynamic=False):
        with self._lock:
            if self._recording:
                self._emit(Event(loom_trace.MODULE_ENTER, name=name,
                                 dynamic=bool(dynamic)))
                self._stack.append(name)

    def module_exit(self, name):
        """Leaves module `name`, closing the modules opened inside it; an
        exit of a module that is not open is dropped."""
        with self._lock:
            if not self._recording or name not in self._stack:
                return
            while self._stack:
                inner = self._stack.pop()
                self.events.append(Event(loom_trace.MODULE_EXIT, name=inner))
                if inner == name:
                    break

    class _HostBlock:
        def __init__(self, recorder):
            self.recorder = recorder

        def __enter__(self):
            with self.recorder._lock:
                self.recorder._host += 1

        def __exit__(self, *_):
            with self.recorder._lock:
                self.recorder._host -= 1

    def host(self):
        """`with rec.host():` tensors created inside are host memory on
        CUDA too: not recorded (nor their frees)."""
        return self._HostBlock(self)

    # ----------------------------------------------------------------- hooks

    def watch(self, model, dynamic=(), modules=True):
        """Marks iterations and phases from `model`'s forward and its
        output's gradient (record_modules.hook_root), and its modules
        (`watch_modules`)."""
        names = self.watch_modules(model, dynamic, modules)
        # After watch_modules: the root's module enter follows the phase.
        self._removers.extend(hook_root(model, self))
        return names

    def watch_modules(self, model, dynamic=(), modules=True):
        """Module enter/exit markers around the forward of every module of
        `model` (`modules=False`: of the dynamic ones only), and around the
        backward of the dynamic ones. Returns the dynamic modules' names."""
        found, removers = hook_modules(model, self, dynamic,
                                       self.dynamic_classes, modules)
        self.dynamic_modules.extend(found)
        self._removers.extend(removers)
        return found

    @staticmethod
    def _steps_on_host(optimizer):
        """torch.optim keeps `step` on the host unless capturable or fused."""
        if not type(optimizer).__module__.startswith("torch.optim"):
            return False
        return not any(group.get("capturable") or group.get("fused")
                       for group in optimizer.param_groups)

    def watch_optimizer(self, optimizer):
        """`optimizer.step()` marks "optimizer" and ends the iteration."""
        if not self.real:
            # pylint: disable-next=import-outside-toplevel
            from loom.tools import fake_record
            fake_record.cuda_optimizer(optimizer)
        host_steps = self._steps_on_host(optimizer)

        def pre(*_):
            self.phase("optimizer")
            if host_steps:
                with self._lock:
                    self._host_fresh += 1

        def post(*_):
            if host_steps:
                with self._lock:
                    self._host_fresh -= 1
            self.step()

        if not hasattr(optimizer, "register_step_pre_hook"):
            raise LoomError("record_cpu: the optimizer has no step hooks "
                            "(register_step_pre_hook); mark iterations with "
                            "rec.step() instead")
        self._removers.append(optimizer.register_step_pre_hook(pre).remove)
        self._removers.append(optimizer.register_step_post_hook(post).remove)
