"""Recording a training step on the CPU as a loom trace: the requests
PyTorch's CUDA caching allocator would receive, without a GPU.

    import loom
    with loom.tools.fake_record.building():   # no data: shapes only
        model, optimizer = build(), torch.optim.AdamW(...)
    with loom.record_cpu("step.ltb", model=model, optimizer=optimizer):
        for batch in batches:                 # a few iterations
            loss = model(**batch).loss        # marks iteration + "forward"
            loss.backward()                   # "backward"
            optimizer.step()                  # "optimizer", iteration ends
            optimizer.zero_grad()

Fake or real. By default the step runs on FakeTensors (PyTorch's
FakeTensorMode, entered while recording; loom.tools.fake_record): every
operation gives results of the real shapes, dtypes and storage sizes and
computes nothing, so a full-size model records in seconds. `real=True`
runs the real arithmetic on the CPU (models whose sizes depend on data:
MoE routing with data-dependent shapes).

How the requests are seen. A `TorchDispatchMode` sees the outputs of every
aten operation that runs while recording, forward and backward alike (on
the CPU, autograd runs the backward on the calling thread, and the mode is
part of the thread-local state it carries). A storage the recorder has not
seen before, which is not one of the operation's inputs, is a new
allocation of `untyped_storage().nbytes()` bytes: the exact request (the
512 B rounding is the allocator's). Views share their storage and allocate
nothing. PyTorch keeps one Python object per storage (fake tensors' meta
storages too) for as long as the storage lives, so a weak reference to it
calls back when the storage dies: that is the free, at the exact point of
the program where the last reference went (CPython frees at once; frees
with nothing between them are written in request order). A storage whose
size changes (`resize_`) is a new request followed by the free of the old
one, as on CUDA. Storages alive before recording starts are set-up
allocations, recorded at the start: the parameters, gradients and buffers
of `model`, the state of `optimizer`, and `tensors`.

Markers. Iterations, phases and modules, as loom's own markers put them in
a GPU recording (docs/plugin.md): with `model=`, its forward begins an
iteration when none is open and marks "forward", the gradient of its output
marks "backward"; with `optimizer=`, `step()` marks "optimizer" and ends
the iteration (the next one begins at the next forward, phase, module or
allocation). Every module's forward is a module enter/exit (its qualified
name; the root is named by its class); modules whose class name matches
DYNAMIC_CLASSES (MoE blocks and experts) or a `dynamic=` pattern are
flagged dynamic and also marked around their backward. By hand:
`rec.begin_iteration()`, `rec.end_iteration()`, `rec.step()`,
`rec.phase(name)`, `rec.module_enter(name, dynamic)`,
`rec.module_exit(name)`. Everything is on stream 0, device 0.

Host memory. The `step` counts of torch.optim optimizers (unless
capturable or fused) and the scalar foreach AdamW adds to them live on the
host in a CUDA run: tensors created from Python data inside a watched
torch.optim optimizer's step are not recorded; `with rec.host():` excludes
anything else.

Mixed precision. Under `torch.autocast("cpu", dtype=torch.bfloat16)` the
recorder applies CUDA's autocast policy (loom.tools.cpu_autocast), so
tensors get the dtypes, hence the sizes, they would have on CUDA.
`cuda_autocast=False` keeps the CPU's policy.

What the recorder cannot see (docs/plugin.md, "Recording on the CPU"):
memory a CUDA kernel or library allocates for itself (cuBLAS workspaces,
attention backward workspaces, CUB temporaries), operations whose CUDA
implementation returns different tensors than the CPU's, and anything the
code does differently on CUDA (`if x.is_cuda`, CUDA graphs, NCCL).

Traces are written by libloom (loom.tools.trace.write_trace). torch is
imported only when a recorder starts. Module markers and hooks are in
loom.tools.record_modules; the summary and frees' canonical order in
loom.tools.record_summary (both names are available here too).
"""

import threading
import weakref

from loom.errors import LoomError
from loom.tools import trace as loom_trace
from loom.tools.record_modules import (  # noqa: F401  (this module's API)
    DYNAMIC_CLASSES, dynamic_modules, hook_modules, hook_root, module_names)
from loom.tools.record_markers import RecorderMarkers
from loom.tools.record_summary import (  # noqa: F401  (this module's API)
    canonical_frees, compare_traces, summarize)
from loom.tools.trace import Event

_MODE_CLASS = None


def _mode_class():
    """The TorchDispatchMode subclass (built on first use: torch is
    imported only when a recorder starts)."""
    global _MODE_CLASS  # pylint: disable=global-statement
    if _MODE_CLASS is None:
        # pylint: disable-next=import-outside-toplevel
        from torch.utils._python_dispatch import TorchDispatchMode

        class AllocationMode(TorchDispatchMode):
            """Hands every operation's result to the recorder."""

            def __init__(self, recorder):
                super().__init__()
                self.recorder = recorder

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                fake = self.recorder._fake
                if fake is not None and args and fake.is_fake(args[0]):
                    if func is self.recorder._scalar_op:
                        return fake.scalar(args[0])
                    replaced = fake.override(func)
                    if replaced is not None:
                        out = replaced(func, args, kwargs,
                                       self.recorder._scratch)
                        self.recorder._after(func, args, kwargs, out)
                        return out
                out = func(*args, **(kwargs or {}))
                self.recorder._after(func, args, kwargs, out)
                return out

        _MODE_CLASS = AllocationMode
    return _MODE_CLASS


class _Storage:
    """What the recorder knows of one live storage."""
    __slots__ = ("request", "nbytes", "ref", "host")

    def __init__(self, request, nbytes, host):
        self.request = request  # the live request id, None if not recorded
        self.nbytes = nbytes
        self.ref = None
        self.host = host        # host memory: never recorded



class Recorder(RecorderMarkers):
    """Records the CUDA allocator's requests of the PyTorch code run while
    it is active, on the CPU. A context manager (`loom.record_cpu(...)`);
    `start()` / `stop()` do the same by hand. See the module docstring.

    path          trace file written when the `with` block ends without an
                  exception (text for .ltt, binary otherwise); None: write
                  nothing (use `.trace` or `write(path)`)
    model         a torch.nn.Module: its tensors are set-up allocations,
                  its forward marks iterations and phases, every module is
                  marked (`modules=False`: only the dynamic ones)
    optimizer     a torch.optim.Optimizer: its state is set-up, its step
                  marks "optimizer" and ends the iteration
    dynamic       extra dynamic modules: patterns on qualified or class
                  names (fnmatch, "re:<regex>")
    dynamic_classes  the regex of dynamic class names (DYNAMIC_CLASSES)
    tensors       more tensors (or modules) alive before recording starts
    cuda_autocast apply CUDA's autocast policy under CPU autocast (True)
    provenance    the trace header's provenance text
    real          run the real arithmetic (False: FakeTensors, the default;
                  see loom.tools.fake_record)
    cuda_workspaces  record cuBLAS's workspaces as a CUDA run allocates
                  them (fake_record.Workspaces; default: when not real)
    """

    def __init__(self, path=None, *, model=None, optimizer=None, dynamic=(),
                 dynamic_classes=DYNAMIC_CLASSES, modules=True, tensors=(),
                 cuda_autocast=True, provenance=None, real=False,
                 cuda_workspaces=None):
        self.path = path
        self.real = bool(real)
        self.cuda_workspaces = not self.real if cuda_workspaces is None \
            else bool(cuda_workspaces)
        self._workspaces = None
        self.model = model
        self.optimizer = optimizer
        self.dynamic = dynamic
        self.dynamic_classes = dynamic_classes
        self.modules = modules
        self.tensors = tensors
        self.cuda_autocast = cuda_autocast
        self.provenance = provenance
        self.events = []
        self.dynamic_modules = []
        self._lock = threading.RLock()
        self._live = {}           # storage key -> _Storage
        self._next_request = 1
        self._next_iteration = 0
        self._iteration = None    # the open iteration's number
        self._pending = False     # begin an iteration at the next event
        self._stack = []          # open modules, innermost last
        self._host = 0            # depth of rec.host() blocks
        self._host_fresh = 0      # depth of optimizer steps (see host())
        self._recording = False
        self._started = False
        self._mode = None
        self._policy = None
        self._removers = []
        self._torch = None
        self._lift_ops = ()
        self._scalar_op = None
        self._fake = None         # loom.tools.fake_record when fake
        self._fake_exits = []     # what start() entered for a fake step
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.setup_bytes = 0

    # ------------------------------------------------------------ life cycle

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, kind, value, traceback):
        self.stop()
        if kind is None and self.path is not None:
            self.write(self.path)
        return False

    def start(self):
        """Starts recording: set-up tensors first, then every operation."""
        if self._started:
            raise LoomError("record_cpu: a recorder records once (make a "
                            "new one)")
        try:
            import torch  # pylint: disable=import-outside-toplevel
        except ImportError:
            # pylint: disable-next=import-outside-toplevel
            from loom import _extras
            raise LoomError(_extras.message("loom", "record_cpu",
                                            ["torch"])) from None
        self._torch = torch
        self._lift_ops = (torch.ops.aten.lift_fresh.default,
                          torch.ops.aten.lift_fresh_copy.default)
        self._scalar_op = torch.ops.aten._local_scalar_dense.default
        self._started = True
        self._recording = True
        try:
            if not self.real:
                self._enter_fake()
            if self.cuda_workspaces:
                # pylint: disable-next=import-outside-toplevel
                from loom.tools import fake_record
                self._workspaces = fake_record.Workspaces()
            if self.model is not None:
                self.watch(self.model, self.dynamic, self.modules)
            if self.optimizer is not None:
                self.watch_optimizer(self.optimizer)
            self.track(self.model, self.optimizer, *self._as_list(
                self.tensors))
            self.setup_bytes = self.live_bytes
            # With a watched model or optimizer the first iteration begins
            # as the later ones do: at the first event after the set-up
            # (the batch made before the forward belongs to it).
            self._pending = self.model is not None or \
                self.optimizer is not None
            if self.cuda_autocast:
                # pylint: disable-next=import-outside-toplevel
                from loom.tools import cpu_autocast
                self._policy = cpu_autocast.install()
            self._mode = _mode_class()(self)
            self._mode.__enter__()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stops recording: hooks off, open modules closed, an open
        iteration that recorded something ended (one that did not is
        dropped). Later frees are not recorded (request_of still answers
        for storages alive then)."""
        if not self._recording:
            return
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        if self._policy is not None:
            self._policy.remove()
            self._policy = None
        while self._fake_exits:
            self._fake_exits.pop()()
        while self._removers:
            self._removers.pop()()
        with self._lock:
            self._close_modules()
            if self._iteration is not None:
                if self.events and self.events[-1].kind == \
                        loom_trace.ITER_BEGIN:
                    self.events.pop()
                    self._next_iteration -= 1
                else:
                    self.events.append(Event(loom_trace.ITER_END,
                                             id=self._iteration))
                self._iteration = None
            self._pending = False
            self._recording = False
            self.events = canonical_frees(self.events)

    def _enter_fake(self):
        """Enters the fake mode and transformers' eager paths until stop()."""
        # pylint: disable-next=import-outside-toplevel
        from loom.tools import fake_record
        self._fake = fake_record
        for context in (fake_record.fake_mode(),
                        fake_record.patch_transformers()):
            context.__enter__()
            self._fake_exits.append(
                lambda c=context: c.__exit__(None, None, None))

    @property
    def fake(self):
        """True when the step runs on FakeTensors (not `real`)."""
        return not self.real

    @property
    def recording(self):
        return self._recording

    @property
    def trace(self):
        """The recorded trace (so far) as a loom.tools.trace.Trace."""
        with self._lock:
            return loom_trace.Trace(device=0, granularity=0,
                                    provenance=self._provenance(),
                                    events=canonical_frees(self.events))

    def write(self, path):
        """Writes the trace (libloom checks it first; TraceError)."""
        loom_trace.write_trace(self.trace, path)

    def _provenance(self):
        if self.provenance is not None:
            return self.provenance
        versions = f"torch {self._torch.__version__}" if self._torch else ""
        return (f"loom.record_cpu: a training step recorded on the CPU "
                f"(requests as PyTorch's CUDA caching allocator would get "
                f"them); {versions}")

    def request_of(self, tensor):
        """The live request id of `tensor`'s storage (None when it is not
        recorded: host memory, empty, or made before recording and not
        tracked)."""
        try:
            # pylint: disable-next=protected-access
            key = tensor.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            return None
        with self._lock:
            entry = self._live.get(key)
            return None if entry is None else entry.request

    # ---------------------------------------------------------------- set-up

    @staticmethod
    def _as_list(value):
        if value is None:
            return []
        if isinstance(value, (list, tuple)):
            return list(value)
        return [value]

    def track(self, *objects):
        """Records the storages of tensors that exist already (modules:
        parameters, their gradients and buffers; optimizers: their state;
        tensors; lists of those) as allocations now, unless known."""
        torch = self._torch
        for obj in objects:
            if obj is None:
                continue
            if isinstance(obj, torch.Tensor):
                self._track_tensor(obj)
            elif isinstance(obj, torch.nn.Module):
                for param in obj.parameters():
                    self._track_tensor(param)
                for param in obj.parameters():
                    if param.grad is not None:
                        self._track_tensor(param.grad)
                for buffer in obj.buffers():
                    self._track_tensor(buffer)
            elif hasattr(obj, "state") and hasattr(obj, "param_groups"):
                host_steps = self._steps_on_host(obj)
                for state in obj.state.values():
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor):
                            self._track_tensor(
                                value, host=host_steps and key == "step")
            elif isinstance(obj, (list, tuple)):
                self.track(*obj)
            elif isinstance(obj, dict):
                self.track(*obj.values())
            else:
                raise LoomError(f"record_cpu: cannot track a "
                                f"{type(obj).__name__} (tensors, modules, "
                                f"optimizers, or lists of them)")

    def _track_tensor(self, tensor, host=False):
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = storage._cdata  # pylint: disable=protected-access
        with self._lock:
            if key not in self._live:
                self._new_storage(storage, key, host)

    # ------------------------------------------------------------- requests

    def _after(self, func, args, kwargs, out):
        """Called by the mode after each operation with its result."""
        self._outputs(func, args, kwargs, out)
        if self._workspaces is not None:
            nbytes = self._workspaces.after(func)
            if nbytes and self._recording and not self._host:
                with self._lock:
                    self._alloc(nbytes)  # never freed

    def _outputs(self, func, args, kwargs, out):
        tensor_type = self._torch.Tensor
        if isinstance(out, tensor_type):
            outs = (out,)
        elif isinstance(out, (tuple, list)):
            outs = [o for o in self._leaves(out) if isinstance(o,
                                                               tensor_type)]
            if not outs:
                return
        else:
            return
        inputs = None
        lifted = func in self._lift_ops
        fresh = self._host_fresh and lifted
        # FakeTensors: a tensor made from Python data (torch.tensor) is
        # lifted into the fake mode, a new storage; in a real recording it
        # is never an operation's result. Neither is a request.
        unseen = lifted and self._fake is not None
        for tensor in outs:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue  # sparse and other storage-less layouts
            key = storage._cdata  # pylint: disable=protected-access
            with self._lock:
                known = self._live.get(key)
                if known is not None:
                    nbytes = storage.nbytes()
                    if nbytes != known.nbytes:
                        self._resized(known, nbytes)
                    continue
                if inputs is None:
                    inputs = self._input_keys(args, kwargs)
                # An unknown input storage existed before: not a request
                # (but followed, so that a resize of it is one).
                self._new_storage(storage, key, fresh, record=key not in
                                  inputs and not unseen)

    @staticmethod
    def _leaves(value):
        for item in value:
            if isinstance(item, (tuple, list)):
                yield from Recorder._leaves(item)
            else:
                yield item

    def _input_keys(self, args, kwargs):
        keys = set()
        tensor_type = self._torch.Tensor
        values = list(self._leaves(args))
        if kwargs:
            values += list(self._leaves(list(kwargs.values())))
        for value in values:
            if isinstance(value, tensor_type):
                if self._fake is not None and not self._fake.is_fake(value):
                    # A real tensor enters the fake mode as its fake twin
                    # (memoized): that storage is no request either.
                    value = self._fake.as_fake(value)
                try:
                    # pylint: disable-next=protected-access
                    keys.add(value.untyped_storage()._cdata)
                except (RuntimeError, NotImplementedError):
                    pass
        return keys

    def _new_storage(self, storage, key, host=False, record=True):
        nbytes = storage.nbytes()
        entry = _Storage(None, nbytes, host or self._host > 0)
        if record and nbytes and not entry.host and self._recording:
            entry.request = self._alloc(nbytes)
        recorder_ref = weakref.ref(self)

        def dead(_ref, key=key):
            recorder = recorder_ref()
            if recorder is not None:
                recorder._dead(key)

        entry.ref = weakref.ref(storage, dead)
        self._live[key] = entry

    def _alloc(self, nbytes):
        self._ensure_iteration()
        request = self._next_request
        self._next_request += 1
        self.events.append(Event(loom_trace.ALLOC, id=request, size=nbytes))
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_live_bytes:
            self.peak_live_bytes = self.live_bytes
        return request

    def _scratch(self, nbytes):
        """A temporary a CUDA kernel allocates and frees (fake_record)."""
        with self._lock:
            if nbytes and self._recording and not self._host:
                self._free(self._alloc(nbytes), nbytes)

    def _free(self, request, nbytes):
        self.events.append(Event(loom_trace.FREE, id=request))
        self.live_bytes -= nbytes

    def _resized(self, entry, nbytes):
        """A storage changed size: on CUDA a new block, then the old freed."""
        old, old_bytes = entry.request, entry.nbytes
        entry.nbytes = nbytes
        if entry.host or not self._recording:
            return
        entry.request = self._alloc(nbytes) if nbytes else None
        if old is not None:
            self._free(old, old_bytes)

    def _dead(self, key):
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None and entry.request is not None and \
                    self._recording:
                self._free(entry.request, entry.nbytes)

    # ----------------------------------------------------------------- stats

    def summary(self):
        """Counts of the trace so far: requests, frees, iterations, peak and
        set-up live bytes, and requests per complete iteration."""
        with self._lock:
            events = list(self.events)
        return summarize(events, self.peak_live_bytes, self.setup_bytes)


def record_cpu(path=None, **options):
    """A Recorder (a context manager): see Recorder and the module
    docstring. `loom.record_cpu` is this function."""
    return Recorder(path, **options)
