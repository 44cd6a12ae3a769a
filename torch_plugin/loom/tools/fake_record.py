"""Recording without arithmetic: the CPU recorder's default mode, where a
training step runs on FakeTensors (shapes, dtypes and storages, no data).

`loom.record_cpu` (loom.tools.record_cpu) records the storages PyTorch
allocates; it needs their sizes and lifetimes, never their values. Under
PyTorch's `FakeTensorMode` every operation runs its meta kernel: a result
has its real shape, dtype and a storage of the real number of bytes (a
meta storage: no memory, data_ptr 0), views share storages as usual, and
the storage's Python object lives exactly as long as the storage, so the
recorder's weak references give the frees as with real tensors. A step of
an 8B-parameter model records in seconds and holds almost no memory.

    from loom.tools import fake_record
    with fake_record.fake_mode():            # build at full size, no memory
        model = build_model()
        optimizer = torch.optim.AdamW(model.parameters())
    with loom.record_cpu("step.ltb", model=model, optimizer=optimizer):
        ...                                  # the step, as usual

What a fake step does differently from a real one, and how it is kept to
what a CUDA run does (docs/plugin.md, "Recording on the CPU"):

- The device is the CPU (fake CUDA tensors need a CUDA device guard and
  an accelerator, which a CPU-only PyTorch build does not have: its
  autograd engine refuses them). So CUDA's choices are emulated as for a
  real CPU recording: CUDA's autocast policy (loom.tools.cpu_autocast),
  and the optimizer path CUDA picks (`cuda_optimizer`: foreach when the
  optimizer leaves it open, as `_default_to_fused_or_foreach` does for
  CUDA tensors; it answers False for FakeTensors and CPU tensors).
- A value read on the host (`.item()`, `bool(t)`, `if t.all():`) has no
  data: `scalar()` answers True for a boolean and 1 for a number (not 0:
  an optimizer divides by 1 - beta ** step). A loss printed is 1; a
  check such as transformers' "are these sequences
  packed?" takes the branch a real batch of one sequence per row takes.
- transformers treats FakeTensors as tracing (`is_tracing`): it would
  build an explicit causal mask (and repeat the key/value heads) where an
  eager CUDA run asks SDPA for `is_causal` with grouped-query attention.
  While a fake recording runs, its `is_fake_tensor` answers False, so the
  model takes its eager path (`patch_transformers`).
- Meta kernels stricter than CUDA's: `_grouped_mm`'s accepts bfloat16
  only, CUDA's (PyTorch 2.11, transformers' MoE experts over float32
  weights) also float32: `override()` gives the shape bfloat16 would
  have, in the inputs' dtype.
- Autograd's backward of indexing (x[idx]) copies the zeros it puts the
  gradient into when a tensor is "subclass-like", which FakeTensors and a
  dispatch mode make every tensor; CUDA's eager run puts it in place, and
  so does `override()` (`_index_put`).
- cuBLAS's workspace: CUDA's matmuls take one from the caching allocator
  per cuBLAS handle, at a handle's first matmul, and never give it back:
  32 MiB on Hopper (CUBLAS_WORKSPACE_CONFIG's default :4096:8; H100,
  H200), one handle for the forward's thread and one for the autograd
  engine's device thread. `Workspaces` records them (after the first
  matmul's result, as the H200 traces have them); a fake recording does
  by default (Recorder(cuda_workspaces=...)).
- A model built outside the fake mode (real tensors) still records: each
  real tensor an operation takes is converted to its fake twin
  (memoized), whose storage is no request; but its memory is real, so
  build at full size under `building()`.
- Operations whose result size depends on data (nonzero, masked_select,
  unique, an MoE router's per-expert counts) fail under FakeTensorMode
  without a symbolic shape environment; such models need `real=True`.

torch is imported on first use only.
"""

import contextlib

_MODE = None


def fake_mode():
    """The FakeTensorMode fake recordings share (created on first use;
    real tensors used as inputs are converted, allow_non_fake_inputs). A
    model and optimizer built inside `with fake_mode():` hold no memory.
    If another FakeTensorMode is active, that one is returned."""
    global _MODE  # pylint: disable=global-statement
    import torch  # pylint: disable=import-outside-toplevel
    # pylint: disable-next=import-outside-toplevel
    from torch._subclasses.fake_tensor import FakeTensorMode
    active = torch._C._get_dispatch_mode(  # pylint: disable=protected-access
        torch._C._TorchDispatchModeKey.FAKE)  # pylint: disable=protected-access
    if active is not None:
        return active
    if _MODE is None:
        _MODE = FakeTensorMode(allow_non_fake_inputs=True)
    return _MODE


def is_fake(tensor):
    """True for a FakeTensor."""
    # pylint: disable-next=import-outside-toplevel
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(tensor, FakeTensor)


def as_fake(tensor):
    """The FakeTensor fake_mode() uses for real `tensor` (the converter's
    memo: the same one each time the tensor is an input)."""
    mode = fake_mode()
    return mode.fake_tensor_converter.from_real_tensor(mode, tensor)


def scalar(tensor):
    """The host value of a fake one-element tensor: True for a boolean,
    1 (or 1.0) for a number."""
    import torch  # pylint: disable=import-outside-toplevel
    if tensor.dtype == torch.bool:
        return True
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return 1.0
    return 1


def cuda_optimizer(optimizer):
    """Makes `optimizer` take the path it would take on CUDA: torch.optim
    optimizers whose groups leave `foreach` and `fused` open (None) run
    foreach there (PyTorch's default for CUDA tensors), and the
    single-tensor loop on CPU and FakeTensors. Sets foreach=True in those
    groups; returns the number of groups changed."""
    if not type(optimizer).__module__.startswith("torch.optim"):
        return 0
    changed = 0
    for group in optimizer.param_groups:
        if "foreach" in group and group.get("foreach") is None and \
                not group.get("fused"):
            group["foreach"] = True
            changed += 1
    return changed


CUBLAS_WORKSPACE_BYTES = 32 << 20
# The aten ops that run a cuBLAS matmul on CUDA.
_CUBLAS_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv",
               "dot", "vdot", "_addmm_activation")


class Workspaces:
    """cuBLAS's workspaces of a CUDA run (see the module docstring):
    `after(func)` is the size of the workspace the op allocates now (0:
    none), one per "thread": the forward's and the backward's."""

    def __init__(self, nbytes=CUBLAS_WORKSPACE_BYTES):
        import torch  # pylint: disable=import-outside-toplevel
        self.nbytes = nbytes
        self.ops = set()
        for name in _CUBLAS_OPS:
            packet = getattr(torch.ops.aten, name, None)
            if packet is not None:
                self.ops.update(getattr(packet, overload)
                                for overload in packet.overloads())
        self.graph_task = torch._C._current_graph_task_id  # noqa: SLF001
        self.taken = set()

    def after(self, func):
        if func not in self.ops:
            return 0
        thread = "backward" if self.graph_task() != -1 else "forward"
        if thread in self.taken:
            return 0
        self.taken.add(thread)
        return self.nbytes


def _grouped_mm(func, args, kwargs, _scratch):
    """_grouped_mm in any floating dtype: the shape the meta kernel gives
    in bfloat16, in the first input's dtype (or out_dtype). CUDA's
    fallback for other dtypes (a cuBLAS mm per group into the result)
    allocates nothing else, a transposed operand included."""
    import torch  # pylint: disable=import-outside-toplevel
    kwargs = dict(kwargs or {})
    a, b = args[0], args[1]
    dtype = kwargs.pop("out_dtype", None) or a.dtype
    if a.dtype == b.dtype == torch.bfloat16:
        return func(*args, out_dtype=dtype, **kwargs)
    shaped = func(a.to(torch.bfloat16), b.to(torch.bfloat16), *args[2:],
                  **kwargs)
    return torch.empty(shaped.shape, dtype=dtype, device=shaped.device)


def override(func):
    """The replacement of aten op `func` for FakeTensors (see the module
    docstring), called as override(func)(func, args, kwargs, scratch),
    where scratch(nbytes) records a temporary a CUDA kernel allocates and
    frees; None when the op runs as it is."""
    import torch  # pylint: disable=import-outside-toplevel
    if func is torch.ops.aten._grouped_mm.default:  # noqa: SLF001
        return _grouped_mm
    if func is torch.ops.aten.new_zeros.default:
        return _new_zeros
    if func is torch.ops.aten.index_put.default:
        return _index_put
    return None


# The last tensor aten.new_zeros made (a weak reference): what autograd's
# backward of indexing puts the gradient into.
_ZEROS = None


def _new_zeros(func, args, kwargs, _scratch):
    global _ZEROS  # pylint: disable=global-statement
    import weakref  # pylint: disable=import-outside-toplevel
    out = func(*args, **(kwargs or {}))
    _ZEROS = weakref.ref(out)
    return out


def _index_put(func, args, kwargs, _scratch):
    """index_put: autograd's backward of indexing (`index_backward`) puts
    the gradient into zeros it has just made (`grad.new_zeros`) in place
    (`_index_put_impl_`, as on CUDA; there index_put's own sort temporaries
    follow, which the shapes alone do not size: CUB's), but out of place,
    a copy of the zeros, when a tensor is "subclass-like": a FakeTensor,
    or any tensor while a dispatch mode (the recorder's) is on. That
    index_put (accumulating, while a backward runs, into the last
    new_zeros) is done in place."""
    import torch  # pylint: disable=import-outside-toplevel
    kwargs = dict(kwargs or {})
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    zeros = _ZEROS() if _ZEROS is not None else None
    if accumulate and zeros is not None and zeros is args[0] and \
            torch._C._current_graph_task_id() != -1:  # noqa: SLF001
        return torch.ops.aten.index_put_.default(args[0], args[1], args[2],
                                                 True)
    return func(*args, **kwargs)


@contextlib.contextmanager
def patch_transformers():
    """While the block runs, transformers' `is_fake_tensor` answers False
    (so `is_tracing` is False for FakeTensors and models take their eager
    paths); nothing when transformers is not installed."""
    try:
        # pylint: disable-next=import-outside-toplevel
        from transformers.utils import import_utils as module
    except ImportError:
        module = None
    if module is None or not hasattr(module, "is_fake_tensor"):
        yield
        return
    saved = module.is_fake_tensor
    module.is_fake_tensor = lambda _tensor: False
    try:
        yield
    finally:
        module.is_fake_tensor = saved


@contextlib.contextmanager
def building():
    """`with building():` builds a model for a fake recording: inside
    fake_mode(), with transformers' eager paths (patch_transformers)."""
    with fake_mode(), patch_transformers():
        yield
