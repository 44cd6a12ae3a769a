"""loom's auto and plan modes on the CUDA backend, through libloom and the
stub libcuda (vmm/testing/cuda_stub.h), no GPU: the plan installed mid-run
on the training thread with PyTorch's context current (auto mode), and at
enable() on a thread with no context (plan mode). There is no CUDA PyTorch
here, so the test does what PyTorch's runtime would: it retains the stub's
primary context and makes it current on the training thread.

On the H200 (2026-11-26) every auto-mode run ended in fallback:
loom_load_plan failed with cuCtxSynchronize: CUDA_ERROR_CONTEXT_IS_DESTROYED
(the entry point's CUDA 13 ABI called without its context argument)."""

import ctypes
import threading

import pytest

from loom import _paths

MiB = 1 << 20
STUB = _paths.REPO_ROOT / "bazel-bin" / "vmm" / "testing" / "libcuda_stub.so"
OPTIONS = {"backend": "cuda", "atexit": False}


class Stub:
    """The stub libcuda, loaded as libloom's CudaDriver loads it (one copy
    per process), with what a test needs of it."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        if not hasattr(self.lib, "cuInit"):
            pytest.fail(f"{path} is empty: loom was built without CUDA "
                        f"headers (set LOOM_CUDA_PATH and rebuild)",
                        pytrace=False)
        self.lib.loom_stub_read_problems.restype = ctypes.c_size_t
        self.lib.loom_stub_read_counts.restype = ctypes.c_size_t
        assert self.lib.cuInit(0) == 0

    def _read(self, reader):
        size = reader(None, 0) + 1
        buffer = ctypes.create_string_buffer(size)
        reader(buffer, size)
        return [line for line in buffer.value.decode().split("\n") if line]

    def problems(self):
        return self._read(self.lib.loom_stub_read_problems)

    def counts(self):
        counts = {}
        for line in self._read(self.lib.loom_stub_read_counts):
            name, _, count = line.rpartition(" ")
            counts[name] = int(count)
        return counts

    def clear(self):
        self.lib.loom_stub_clear()

    def retain_primary(self, device=0):
        ctx = ctypes.c_void_p()
        assert self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) \
            == 0
        return ctx.value

    def release_primary(self, device=0):
        assert self.lib.cuDevicePrimaryCtxRelease_v2(device) == 0

    def current(self):
        ctx = ctypes.c_void_p()
        assert self.lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
        return ctx.value

    def set_current(self, ctx):
        assert self.lib.cuCtxSetCurrent(ctypes.c_void_p(ctx)) == 0


@pytest.fixture(name="stub")
def fixture_stub(loom_env, monkeypatch):
    """The stub libcuda, named by LOOM_LIBCUDA for libloom; the test fails
    when it is not built."""
    del loom_env
    if not STUB.exists():
        pytest.fail(f"{STUB} is not built; run `bazel build "
                    f"//vmm/testing:libcuda_stub.so` first", pytrace=False)
    monkeypatch.setenv("LOOM_LIBCUDA", str(STUB))
    stub = Stub(STUB)
    stub.clear()
    yield stub
    assert stub.problems() == []
    counts = stub.counts()
    assert counts.get("cuCtxSynchronize_v2", 0) == 0
    assert counts.get("cuCtxGetDevice_v2", 0) == 0


class Loop:
    """A training loop through libloom's C ABI that never touches the
    memory (device addresses are not host addresses on the CUDA backend)."""

    def __init__(self, native):
        self.native = native
        self.weights = [self.alloc(size) for size in (6 * MiB, 3 * MiB)]

    def alloc(self, size):
        pointer = self.native.malloc(size, 0, None)
        assert pointer, self.native.last_error()
        return pointer

    def iteration(self, loom):
        loom.phase("forward")
        acts = [self.alloc(size) for size in (4 * MiB, 2 * MiB + 4096,
                                              MiB // 2, 3 * MiB)]
        self.native.free(self.alloc(5 * MiB), 0, 0, None)
        loom.phase("backward")
        for pointer in reversed(acts):
            grad = self.alloc(2 * MiB)
            self.native.free(pointer, 0, 0, None)
            self.native.free(grad, 0, 0, None)
        loom.step()

    def close(self):
        for pointer in self.weights:
            self.native.free(pointer, 0, 0, None)


def test_auto_mode_installs_mid_run_with_pytorchs_context_current(
        loom_env, stub, tmp_path):
    loom = loom_env
    primary = stub.retain_primary()  # what PyTorch's runtime holds
    stub.set_current(primary)
    try:
        session = loom._configure_native(
            mode="auto", workdir=tmp_path, record_iterations=3,
            plan_async=False, plan_options={"time_limit": 2}, **OPTIONS)
        loop = Loop(session.native)
        for _ in range(4):
            loop.iteration(loom)
        status = loom.status()
        assert status["state"] == "planned", status["plan_error"]
        assert stub.current() == primary, "loom changed PyTorch's context"
        hits = loom.memory_stats()["loom.plan_hits"]
        for _ in range(2):
            loop.iteration(loom)
        assert loom.memory_stats()["loom.plan_hits"] > hits
        assert stub.counts().get("cuCtxSynchronize", 0) > 0
        session.native.check_invariants(0)
        loop.close()
        loom._reset()
        assert stub.current() == primary
    finally:
        stub.set_current(None)
        stub.release_primary()


def test_plan_mode_installs_at_enable_with_no_context(loom_env, stub,
                                                      tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                      **OPTIONS)
    loop = Loop(session.native)
    # The first iteration begins after the set-up (as loom.watch(model)
    # marks it), so the plan places its requests too and earns its place.
    loom.begin_iteration()
    for _ in range(3):
        loop.iteration(loom)
    loop.close()
    loom.finish()
    loom._reset()
    plan = tmp_path / "plan.rank0.lplan"
    report = session.native.plan_trace(tmp_path / "trace.rank0.ltb", plan,
                                       {"time_limit": 1})
    assert plan.exists()
    assert report["check"]["earns_its_place"], report["check"]
    # enable() first thing, on a thread that never touched CUDA.
    result = {}

    def enable():
        result["before"] = stub.current()
        result["session"] = loom._configure_native(
            mode="plan", workdir=tmp_path, **OPTIONS)
        result["after"] = stub.current()

    thread = threading.Thread(target=enable)
    thread.start()
    thread.join()
    assert result["before"] is None and result["after"] is None
    session = result["session"]
    assert loom.status()["state"] == "serving"
    loop = Loop(session.native)
    loom.begin_iteration()
    for _ in range(2):
        loop.iteration(loom)
    assert loom.memory_stats()["loom.plan_hits"] > 0
    session.native.check_invariants(0)
    loop.close()
