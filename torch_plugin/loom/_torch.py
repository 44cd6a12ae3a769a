"""Handing libloom to PyTorch. The only module that imports torch, always
inside functions, so `import loom` works without it.

- `install`: `torch.cuda.memory.CUDAPluggableAllocator(libloom,
  "loom_torch_malloc", "loom_free")` (loom_torch_malloc throws on failure,
  which PyTorch reports as a RuntimeError starting "CUDA out of memory.";
  PyTorch would not check a NULL), the optional hooks of its `_allocator`
  where this torch has them (record_stream, reset = empty_cache, memory
  fraction), then `change_current_allocator`. Must run before CUDA is
  initialised: checked first, and PyTorch's "Can't swap an already
  initialized allocator" is turned into the same explanation.
- `patch_stats`: torch.cuda.memory_stats() and friends raise with a
  pluggable allocator; they are pointed at loom's (loom.stats).
- `pool`: the scoped alternative, torch.cuda.MemPool + use_mem_pool.
"""

import contextlib

from loom.errors import LoomError

TOO_LATE = (
    "CUDA is already initialised in this process, so PyTorch's allocator can "
    "no longer be replaced. Call loom.enable() first thing: before creating "
    "any CUDA tensor, moving a model with .cuda()/.to('cuda'), calling "
    "torch.cuda.set_device(), or importing code that does (put "
    "`import loom; loom.enable(...)` at the top of the training script).")

# _allocator setter -> libloom function (vmm_anchors.md §3.1).
HOOKS = (
    ("set_record_stream_fn", "loom_record_stream"),
    ("set_reset_fn", "loom_empty_cache"),
    ("set_memory_fraction_fn", "loom_set_memory_fraction"),
    # CUDA graph capture: PyTorch's private pools (C++ signatures, see
    # loom_c_api.h).
    ("set_begin_allocate_to_pool", "loom_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "loom_end_allocate_to_pool"),
    ("set_release_pool", "loom_release_pool"),
)
GRAPH_HOOKS = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn",
               "set_release_pool")


def refuse_graph_capture(torch):
    """Without the pool hooks PyTorch would capture a graph into memory loom
    hands to eager code as soon as it is freed, and replays would corrupt
    it: capture is refused with the reason instead."""
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is None or getattr(graph, "_loom_refused", False):
        return
    original = graph.capture_begin

    def capture_begin(self, *args, **kwargs):  # pylint: disable=unused-argument
        raise LoomError(
            "CUDA graph capture with loom needs PyTorch's allocate-to-pool "
            "hooks (CUDAPluggableAllocator.set_begin_allocate_to_pool, "
            "set_end_allocate_to_pool_fn, set_release_pool), which this "
            f"PyTorch ({_version(torch)}) does not offer: without them the "
            "graph's memory would be reused by eager code while replays "
            "still write it. Capture without loom (loom.enable after the "
            "graphs) or use a PyTorch that has the hooks.")

    capture_begin.__wrapped__ = original
    graph.capture_begin = capture_begin
    graph._loom_refused = True  # pylint: disable=protected-access


def import_torch(what):
    """torch, or LoomError saying `what` needs it."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise LoomError(
            f"{what} needs PyTorch, which cannot be imported here ({error}). "
            f"Install PyTorch with CUDA support. loom's offline tools "
            f"(python3 -m loom analyze/plan/compare/import) need no torch."
            ) from None
    return torch


def _version(torch):
    return getattr(torch, "__version__", "unknown")


def ready_torch(what):
    """torch after checking that loom can become its allocator now: the
    pluggable-allocator API exists, CUDA is available and not initialised."""
    torch = import_torch(what)
    cuda = getattr(torch, "cuda", None)
    memory = getattr(cuda, "memory", None)
    if not (hasattr(memory, "CUDAPluggableAllocator") and
            hasattr(memory, "change_current_allocator")):
        raise LoomError(f"{what} needs torch.cuda.memory."
                        f"CUDAPluggableAllocator (PyTorch >= 2.0); this is "
                        f"PyTorch {_version(torch)}")
    if not cuda.is_available():
        raise LoomError(
            f"{what}: CUDA is not available to PyTorch {_version(torch)} "
            f"(no GPU or driver visible, or a CPU-only build: torch.version."
            f"cuda = {getattr(getattr(torch, 'version', None), 'cuda', None)})."
            f" loom serves CUDA memory only; without a GPU use its offline "
            f"tools, or backend='host' to exercise the allocator on the CPU.")
    if cuda.is_initialized():
        raise LoomError(TOO_LATE)
    return torch


def _raw(allocator):
    """The torch._C._cuda_CUDAAllocator behind a CUDAPluggableAllocator."""
    getter = getattr(allocator, "allocator", None)
    if callable(getter):
        return getter()
    return allocator._allocator  # pylint: disable=protected-access


def set_hooks(raw, native):
    """Installs libloom's optional hooks on `raw` where it has the setter.
    Returns the setters used."""
    used = []
    for setter, function in HOOKS:
        method = getattr(raw, setter, None)
        if method is not None:
            method(native.address(function))
            used.append(setter)
    return used


def _pluggable(torch, native):
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        native.path, "loom_torch_malloc", "loom_free")
    return allocator, set_hooks(_raw(allocator), native)


def install(torch, session, set_device):
    """Makes libloom the allocator of every CUDA tensor (see module doc)."""
    allocator, hooks = _pluggable(torch, session.native)
    if torch.cuda.is_initialized():  # imports may have initialised CUDA
        raise LoomError(TOO_LATE)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        if "already initialized" in str(error) or "Can't swap" in str(error):
            raise LoomError(TOO_LATE) from None
        raise LoomError(f"torch.cuda.memory.change_current_allocator failed: "
                        f"{error}") from None
    session.torch_allocator = allocator
    session.torch_hooks = hooks
    if "set_record_stream_fn" not in hooks:
        import logging  # pylint: disable=import-outside-toplevel
        logging.getLogger("loom").warning(
            "loom: PyTorch %s cannot forward record_stream to a pluggable "
            "allocator; memory used on a side stream after its tensor is "
            "freed may be reused early (synchronise those streams)",
            _version(torch))
    if not all(setter in hooks for setter in GRAPH_HOOKS):
        refuse_graph_capture(torch)
    if session.config.torch_stats:
        patch_stats(torch)
    if set_device:
        torch.cuda.set_device(session.device)


# torch.cuda function -> loom.stats function.
_STATS_FUNCTIONS = ("memory_stats", "reset_peak_memory_stats",
                    "memory_summary")


def patch_stats(torch):
    """Points torch.cuda.memory_stats(), reset_peak_memory_stats() and
    memory_summary() at loom's. memory_allocated(), max_memory_allocated(),
    memory_reserved() and max_memory_reserved() read memory_stats() and so
    follow. Code that imported the functions by name before keeps the
    originals (which raise with a pluggable allocator)."""
    from loom import stats  # pylint: disable=import-outside-toplevel
    for name in _STATS_FUNCTIONS:
        replacement = getattr(stats, name)
        for namespace in (torch.cuda.memory, torch.cuda):
            if hasattr(namespace, name):
                setattr(namespace, name, replacement)


def pool_torch():
    """torch after checking that it has MemPool and CUDA."""
    torch = import_torch("loom.pool()")
    if not (hasattr(torch.cuda, "MemPool") and
            hasattr(torch.cuda, "use_mem_pool")):
        raise LoomError(f"loom.pool() needs torch.cuda.MemPool and "
                        f"torch.cuda.use_mem_pool (PyTorch >= 2.5); this is "
                        f"PyTorch {_version(torch)}. Use loom.enable() "
                        f"instead.")
    if not torch.cuda.is_available():
        raise LoomError("loom.pool(): CUDA is not available to PyTorch")
    return torch


@contextlib.contextmanager
def pool(session, device=None):
    """Routes this thread's CUDA allocations inside the block to a MemPool
    served by libloom (see loom.pool)."""
    torch = pool_torch()
    if session.torch_allocator is not None:
        raise LoomError("loom.pool(): loom.enable() already made loom the "
                        "allocator of every CUDA tensor; use one or the other")
    if session.torch_pool_allocator is None:
        allocator, hooks = _pluggable(torch, session.native)
        session.torch_pool_allocator = allocator
        session.torch_hooks = hooks
    pools = session.torch_pools
    key = device if device is not None else torch.cuda.current_device()
    if key not in pools:
        pools[key] = torch.cuda.MemPool(_raw(session.torch_pool_allocator))
    with torch.cuda.use_mem_pool(pools[key], device=device):
        yield pools[key]
