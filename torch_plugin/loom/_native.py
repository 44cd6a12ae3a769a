"""ctypes binding of libloom.so's C ABI (torch_plugin/loom_c_api.h).

One `Native` object per process wraps the library (dlopen returns the same
handle to PyTorch's CUDAPluggableAllocator, so both talk to one allocator).
Calls that return a status code raise `NativeError` with libloom's message
(`loom_last_error()` is per thread, and is read on the calling thread right
after the failing call). No torch here.
"""

import ctypes
import json
import threading

from loom import _paths
from loom.errors import LoomError, NativeError

# loom::StatusCode names (base/status.h), for messages and tests.
STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "NOT_FOUND", 3: "ALREADY_EXISTS",
    4: "FAILED_PRECONDITION", 5: "OUT_OF_RANGE", 6: "OUT_OF_MEMORY",
    7: "DATA_LOSS", 8: "UNAVAILABLE", 9: "UNIMPLEMENTED", 10: "INTERNAL",
}

_c_char_p, _c_int, _c_void_p = ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p
_c_longlong, _c_size_t = ctypes.c_longlong, ctypes.c_size_t

# name -> (restype, argtypes), exactly as declared in loom_c_api.h.
_SIGNATURES = {
    "loom_configure": (_c_int, [_c_char_p]),
    "loom_malloc": (_c_void_p, [ctypes.c_ssize_t, _c_int, _c_void_p]),
    # PyTorch's malloc: throws a C++ exception on failure, so never called
    # from Python (only looked up, so an old build is refused clearly).
    "loom_torch_malloc": (_c_void_p, [ctypes.c_ssize_t, _c_int, _c_void_p]),
    "loom_free": (None, [_c_void_p, ctypes.c_ssize_t, _c_int, _c_void_p]),
    "loom_record_stream": (None, [_c_void_p, _c_void_p]),
    "loom_empty_cache": (None, []),
    "loom_set_memory_fraction": (None, [ctypes.c_double, _c_int]),
    "loom_iteration_begin": (None, [_c_longlong]),
    "loom_iteration_end": (None, [_c_longlong]),
    "loom_phase": (None, [_c_char_p]),
    "loom_module_enter": (None, [_c_char_p, _c_int]),
    "loom_module_exit": (None, [_c_char_p]),
    "loom_load_plan": (_c_int, [_c_int, _c_char_p]),
    "loom_write_trace": (_c_int, [_c_int, _c_char_p]),
    "loom_stats_json": (_c_longlong, [_c_int, _c_char_p, _c_size_t]),
    "loom_init_device": (_c_int, [_c_int]),
    "loom_stop_recording": (_c_int, []),
    "loom_reset_peak_stats": (_c_int, [_c_int]),
    "loom_check_invariants": (_c_int, [_c_int]),
    "loom_shutdown": (_c_int, []),
    "loom_last_error": (_c_char_p, []),
    "loom_version": (_c_char_p, []),
}

# The hooks PyTorch's pluggable allocator takes as raw function pointers.
HOOK_FUNCTIONS = ("loom_torch_malloc", "loom_free", "loom_record_stream",
                  "loom_empty_cache", "loom_set_memory_fraction")


def _encode(text):
    return str(text).encode("utf-8")


class Native:
    """libloom.so, loaded once. REQUIRES: `path` is a libloom.so."""

    def __init__(self, path):
        self.path = str(path)
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as error:
            raise LoomError(f"cannot load {self.path}: {error}") from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                function = getattr(self.lib, name)
            except AttributeError:
                raise LoomError(f"{self.path} has no symbol {name}: it is not "
                                f"libloom.so, or an old build (rebuild with "
                                f"`bazel build //torch_plugin:libloom.so`)"
                                ) from None
            function.restype = restype
            function.argtypes = argtypes

    # ------------------------------------------------------------ plumbing

    def last_error(self):
        message = self.lib.loom_last_error()
        return message.decode("utf-8", "replace") if message else ""

    def _check(self, call, code):
        if code != 0:
            raise NativeError(call, code, self.last_error())

    def address(self, name):
        """The address of exported function `name` (for PyTorch's hooks)."""
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def version(self):
        return self.lib.loom_version().decode()

    # ------------------------------------------------------------- control

    def configure(self, settings):
        self._check("loom_configure", self.lib.loom_configure(
            _encode(settings)))

    def shutdown(self):
        self._check("loom_shutdown", self.lib.loom_shutdown())

    def load_plan(self, device, path):
        self._check(f"loom_load_plan({path})",
                    self.lib.loom_load_plan(device, _encode(path)))

    def write_trace(self, device, path):
        self._check(f"loom_write_trace({path})",
                    self.lib.loom_write_trace(device, _encode(path)))

    def init_device(self, device):
        """Creates `device`'s allocator now (loading the configured plan)."""
        self._check("loom_init_device", self.lib.loom_init_device(device))

    def stop_recording(self):
        """Stops recording on every device and frees the record buffers."""
        self._check("loom_stop_recording", self.lib.loom_stop_recording())

    def stats(self, device):
        """The allocator stats of `device` as a dict (all zero for a device
        that has served nothing; never creates an allocator)."""
        for _ in range(4):  # the JSON may grow between the two calls
            length = self.lib.loom_stats_json(device, None, 0)
            if length < 0:
                raise NativeError("loom_stats_json", -1, self.last_error())
            buffer = ctypes.create_string_buffer(length + 64)
            length = self.lib.loom_stats_json(device, buffer, len(buffer))
            if 0 <= length < len(buffer):
                return json.loads(buffer.value.decode())
        raise NativeError("loom_stats_json", -1, "stats kept growing")

    def reset_peak_stats(self, device):
        self._check("loom_reset_peak_stats",
                    self.lib.loom_reset_peak_stats(device))

    def check_invariants(self, device):
        self._check("loom_check_invariants",
                    self.lib.loom_check_invariants(device))

    # ---------------------------------------------------------- allocation

    def malloc(self, size, device=0, stream=None):
        """Address of `size` fresh bytes, or None (libloom's reason in
        last_error())."""
        return self.lib.loom_malloc(size, device, stream)

    def free(self, pointer, size=0, device=0, stream=None):
        self.lib.loom_free(pointer, size, device, stream)

    def record_stream(self, pointer, stream):
        self.lib.loom_record_stream(pointer, stream)

    def empty_cache(self):
        self.lib.loom_empty_cache()

    # ------------------------------------------------------------- markers

    def iteration_begin(self, number):
        self.lib.loom_iteration_begin(number)

    def iteration_end(self, number):
        self.lib.loom_iteration_end(number)

    def phase(self, name):
        self.lib.loom_phase(_encode(name))

    def module_enter(self, name, dynamic):
        self.lib.loom_module_enter(_encode(name), 1 if dynamic else 0)

    def module_exit(self, name):
        self.lib.loom_module_exit(_encode(name))


_lock = threading.Lock()
_loaded = None


def load(path=None):
    """The process's Native (loaded on first use from `path`, LOOM_LIB or
    the checkout's bazel-bin). Raises LoomError when it is not built."""
    global _loaded  # pylint: disable=global-statement
    with _lock:
        if _loaded is None:
            if path is None:
                try:
                    path = _paths.libloom()
                except _paths.NotBuiltError as error:
                    raise LoomError(str(error)) from None
            _loaded = Native(path)
        return _loaded
