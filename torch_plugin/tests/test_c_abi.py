"""libloom.so's C ABI through ctypes, on the host backend (no GPU, no torch).

The host backend maps real memory, so what loom_malloc returns can be written
and read here: two live allocations sharing a byte would show up as data
corruption.
"""

import ctypes
import json

import pytest

MiB = 1 << 20


@pytest.fixture()
def lib(libloom):  # conftest's libloom: the test fails when it is not built
    lib = ctypes.CDLL(str(libloom))
    lib.loom_configure.argtypes = [ctypes.c_char_p]
    lib.loom_malloc.restype = ctypes.c_void_p
    lib.loom_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.loom_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                              ctypes.c_void_p]
    lib.loom_last_error.restype = ctypes.c_char_p
    lib.loom_stats_json.restype = ctypes.c_longlong
    lib.loom_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.loom_write_trace.argtypes = [ctypes.c_int, ctypes.c_char_p]
    lib.loom_load_plan.argtypes = [ctypes.c_int, ctypes.c_char_p]
    lib.loom_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.loom_iteration_begin.argtypes = [ctypes.c_longlong]
    lib.loom_iteration_end.argtypes = [ctypes.c_longlong]
    lib.loom_module_enter.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.loom_module_exit.argtypes = [ctypes.c_char_p]
    lib.loom_phase.argtypes = [ctypes.c_char_p]
    assert lib.loom_shutdown() == 0, lib.loom_last_error()
    yield lib
    lib.loom_shutdown()


def stats(lib, device=0):
    n = lib.loom_stats_json(device, None, 0)
    assert n > 0, lib.loom_last_error()
    buf = ctypes.create_string_buffer(n + 1)
    assert lib.loom_stats_json(device, buf, n + 1) == n
    return json.loads(buf.value)


def test_malloc_free_with_real_memory(lib):
    assert lib.loom_configure(b"backend=host; granularity=64KiB; device_memory=64MiB") == 0
    a = lib.loom_malloc(3 * MiB + 5, 0, None)
    b = lib.loom_malloc(1000, 0, None)
    assert a and b and a != b
    ctypes.memset(a, 0xAB, 3 * MiB + 5)
    ctypes.memset(b, 0xCD, 1000)
    assert ctypes.string_at(a, 3 * MiB + 5) == b"\xab" * (3 * MiB + 5)
    assert ctypes.string_at(b, 1000) == b"\xcd" * 1000
    s = stats(lib)
    assert s["allocated_bytes.all.current"] == 3 * MiB + 5 + 1000
    assert s["reserved_bytes.all.current"] >= 3 * MiB + 5 + 1000
    assert lib.loom_check_invariants(0) == 0
    lib.loom_free(a, 3 * MiB + 5, 0, None)
    lib.loom_free(b, 1000, 0, None)
    s = stats(lib)
    assert s["allocated_bytes.all.current"] == 0
    assert s["allocated_bytes.all.peak"] == 3 * MiB + 5 + 1000
    assert lib.loom_reset_peak_stats(0) == 0
    assert stats(lib)["allocated_bytes.all.peak"] == 0


def test_out_of_memory_returns_null_and_says_why(lib):
    assert lib.loom_configure(b"backend=host;granularity=64KiB;device_memory=4MiB") == 0
    assert lib.loom_malloc(64 * MiB, 0, None) is None
    assert b"OUT_OF_MEMORY" in lib.loom_last_error()
    s = stats(lib)
    assert s["num_ooms"] == 1
    assert s["reserved_bytes.all.current"] == 0, "nothing held after the failure"
    p = lib.loom_malloc(MiB, 0, None)
    assert p
    lib.loom_free(p, MiB, 0, None)


def test_settings_are_checked(lib):
    assert lib.loom_configure(b"backend=tpu") != 0
    assert b"backend 'tpu'" in lib.loom_last_error()
    assert lib.loom_configure(b"colour=blue") != 0
    assert b"unknown setting 'colour'" in lib.loom_last_error()
    assert lib.loom_configure(b"cap=lots") != 0
    assert lib.loom_configure(b"fraction=1.5") != 0
    for bad in (b"fraction=half", b"fraction=", b"fraction=0.5x",
                b"replan_time_limit=0", b"replan_time_limit=soon"):
        assert lib.loom_configure(bad) != 0, bad
        assert b"is not in" in lib.loom_last_error(), bad
    assert lib.loom_configure(b"replan_time_limit=2.5") == 0
    assert lib.loom_configure(b"backend=host") == 0
    p = lib.loom_malloc(10, 0, None)
    # Too late to change the settings once memory is served.
    assert lib.loom_configure(b"backend=fake") != 0
    assert b"already serving" in lib.loom_last_error()
    assert lib.loom_shutdown() != 0, "live allocations: shutdown must refuse"
    lib.loom_free(p, 10, 0, None)
    assert lib.loom_shutdown() == 0


def test_bad_pointers_are_reported_not_fatal(lib):
    assert lib.loom_configure(b"backend=host") == 0
    p = lib.loom_malloc(4096, 0, None)
    lib.loom_free(p + 16, 4096, 0, None)
    assert b"not a live loom allocation" in lib.loom_last_error()
    lib.loom_free(p, 4096, 0, None)
    lib.loom_free(p, 4096, 0, None)  # double free: reported, nothing breaks
    assert b"not a live loom allocation" in lib.loom_last_error()
    lib.loom_record_stream(12345, 0x77)
    assert b"record_stream" in lib.loom_last_error()
    assert lib.loom_check_invariants(0) == 0
    assert lib.loom_malloc(-5, 0, None) is None


def test_record_mode_writes_a_trace_with_markers(lib, tmp_path):
    assert lib.loom_configure(b"backend=host;record=1000") == 0
    lib.loom_iteration_begin(0)
    lib.loom_phase(b"forward")
    lib.loom_module_enter(b"layers.0.moe", 1)
    p = lib.loom_malloc(8192, 0, None)
    lib.loom_module_exit(b"layers.0.moe")
    lib.loom_free(p, 8192, 0, None)
    lib.loom_iteration_end(0)
    path = tmp_path / "run.ltt"
    assert lib.loom_write_trace(0, str(path).encode()) == 0, lib.loom_last_error()
    from loom.tools import trace as loom_trace
    trace = loom_trace.read_trace(str(path))
    kinds = [e.kind for e in trace.events]
    assert kinds == ["iter_begin", "phase", "module_enter", "alloc", "module_exit",
                     "free", "iter_end"]
    assert trace.events[3].size == 8192
    assert stats(lib)["loom.dynamic_requests"] == 1


def test_stats_of_an_unused_device_are_zero_and_create_nothing(lib):
    assert lib.loom_configure(b"backend=host;devices=2") == 0
    s = stats(lib, device=1)
    assert s["reserved_bytes.all.current"] == 0
    assert s["allocation.all.allocated"] == 0
    # Nothing was created: settings can still change.
    assert lib.loom_configure(b"backend=fake") == 0
    assert lib.loom_init_device(0) == 0
    assert lib.loom_configure(b"backend=host") != 0, "device 0 exists now"
