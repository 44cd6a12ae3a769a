"""Stand-ins, only where the real thing cannot run in the tests (the
project's Python has the real torch, CPU build, and transformers: models,
optimizers, tensors, autograd, torch.device, torch.cuda's stats functions
and _memory_viz are the real ones in the tests):

- `fake_torch`: a `torch` module whose CUDA side works, for the hand-over
  (CUDAPluggableAllocator, the `_allocator` setters,
  change_current_allocator, set_device, is_initialized, MemPool /
  use_mem_pool, CUDAGraph): the CPU build cannot construct or call any of
  them and never has CUDA (test_torch_glue.py; on a GPU,
  tests/gpu/python/test_torch_handover_gpu.py);
- `OldOptimizer`: an optimizer without step hooks, as Megatron's are (not a
  torch.optim.Optimizer; Megatron is not installed);
- `FakeLoop`: a training loop that allocates through libloom's C ABI
  (host backend: real memory), since CPU tensors never reach libloom;
- `HOST`: enable() options for libloom on the host backend;
- `run_steps`: a FakeLoop's iterations with loom's markers and steps."""

import ctypes
import types

# enable() options for tests: libloom on the host backend, small pages.
HOST = {"backend": "host", "granularity": "64KiB", "device_memory": "1GiB",
        "atexit": False}


class OldOptimizer:
    """An optimizer without step hooks (Megatron's, or torch < 2.0)."""

    def __init__(self, body=None):
        self.param_groups = [{}]
        self.body = body
        self.steps = 0

    def step(self):
        if self.body:
            self.body()
        self.steps += 1
        return "stepped"


# ------------------------------------------------------------ fake torch

def fake_torch(available=True, initialized=False, swap_error=None,
               hooks=("set_record_stream_fn", "set_reset_fn",
                      "set_memory_fraction_fn"), mem_pool=False,
               version="2.9.0", graphs=False):
    """A module object shaped like torch for loom._torch. `calls` records
    what loom did with it."""
    calls = []
    torch = types.ModuleType("torch")
    torch.__version__ = version
    torch.version = types.SimpleNamespace(cuda="12.4" if available else None)
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    torch.cuda, cuda.memory = cuda, memory
    state = {"initialized": initialized, "device": 0}

    class RawAllocator:
        pass

    for setter in hooks:
        setattr(RawAllocator, setter,
                lambda self, address, _s=setter: calls.append((_s, address)))

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_name, free_name):
            calls.append(("CUDAPluggableAllocator", path, alloc_name,
                          free_name))
            self._allocator = RawAllocator()

        def allocator(self):
            return self._allocator

    def change_current_allocator(allocator):
        if swap_error:
            raise RuntimeError(swap_error)
        calls.append(("change_current_allocator", allocator))

    def set_device(device):
        calls.append(("set_device", device))
        state["initialized"] = True
        state["device"] = device

    def memory_stats(device=None):
        raise RuntimeError("CUDAPluggableAllocator does not yet support "
                           "getDeviceStats")

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator
    memory.memory_stats = memory_stats
    memory.reset_peak_memory_stats = memory_stats
    memory.memory_summary = memory_stats
    cuda.memory_stats = memory_stats
    cuda.reset_peak_memory_stats = memory_stats
    cuda.memory_summary = memory_stats
    cuda.is_available = lambda: available
    cuda.is_initialized = lambda: state["initialized"]
    cuda.set_device = set_device
    cuda.current_device = lambda: state["device"]
    if graphs:
        class CUDAGraph:
            def capture_begin(self, *args, **kwargs):
                calls.append(("capture_begin", args, kwargs))

        cuda.CUDAGraph = CUDAGraph
    if mem_pool:
        class MemPool:
            def __init__(self, allocator):
                calls.append(("MemPool", allocator))

        class UseMemPool:
            def __init__(self, pool, device=None):
                self.pool, self.device = pool, device

            def __enter__(self):
                calls.append(("use_mem_pool", self.pool, self.device))

            def __exit__(self, *exc):
                calls.append(("end_mem_pool", self.pool))

        cuda.MemPool = MemPool
        cuda.use_mem_pool = UseMemPool
    return torch, calls, state


# ---------------------------------------------------- fake training loop

MiB = 1 << 20


class FakeLoop:
    """A training loop in plain Python that allocates through libloom's C
    ABI in a repeating pattern and checks its data: weights at set-up, then
    per iteration forward activations (kept for backward), backward
    gradients, optimizer temporaries. Every buffer is filled with its own
    byte and checked before it is freed, so two live buffers sharing
    memory would show."""

    def __init__(self, native, device=0, scale=1):
        self.native, self.device = native, device
        self.scale = scale
        self.live = {}  # pointer -> (size, byte)
        self.counter = 0
        self.weights = [self.alloc(s * scale) for s in
                        (4 * MiB, 3 * MiB + 512, 1 * MiB, 96 * 1024)]

    def alloc(self, size):
        pointer = self.native.malloc(size, self.device, None)
        assert pointer, self.native.last_error()
        self.counter = (self.counter + 1) % 251
        byte = self.counter + 1
        ctypes.memset(pointer, byte, size)
        self.live[pointer] = (size, byte)
        return pointer

    def free(self, pointer):
        size, byte = self.live.pop(pointer)
        self.check(pointer, size, byte)
        self.native.free(pointer, size, self.device, None)

    @staticmethod
    def check(pointer, size, byte):
        # First, last and a middle stretch (whole buffers would be slow).
        for offset in (0, size // 2, max(0, size - 4096)):
            length = min(4096, size - offset)
            data = ctypes.string_at(pointer + offset, length)
            assert data == bytes([byte]) * length, \
                f"buffer at {pointer:#x} (+{offset}) was overwritten"

    def check_all(self):
        for pointer, (size, byte) in self.live.items():
            self.check(pointer, size, byte)

    def iteration(self, markers=None, extra=None):
        """One iteration; `markers(name)` is called at phase changes.
        `extra`: a size allocated and freed in the middle (an unplanned
        request)."""
        mark = markers or (lambda _: None)
        s = self.scale
        mark("forward")
        acts = [self.alloc(size * s) for size in
                (2 * MiB, 2 * MiB, 512 * 1024, 3000)]
        temp = self.alloc(1 * MiB * s)
        self.free(temp)
        if extra:
            self.free(self.alloc(extra))
        mark("backward")
        grads = []
        for act in reversed(acts):
            grads.append(self.alloc(self.live[act][0]))
            self.free(act)
        mark("optimizer")
        state = self.alloc(256 * 1024 * s)
        self.free(state)
        for grad in grads:
            self.free(grad)
        self.check_all()

    def close(self):
        for pointer in list(self.live):
            self.free(pointer)


def run_steps(loom, session, iterations, extra_at=None):
    """`iterations` iterations of a FakeLoop on `session`'s device, marked
    with loom.phase and ended with loom.step(); iteration `extra_at` makes
    an extra 4 KiB request. Returns the loop (its weights still live)."""
    loop = FakeLoop(session.native, session.device)
    for i in range(iterations):
        loop.iteration(markers=loom.phase,
                       extra=4096 if i == extra_at else None)
        loom.step()
    return loop
