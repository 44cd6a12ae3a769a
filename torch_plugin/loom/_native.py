"""ctypes binding of libloom.so's C ABI (torch_plugin/loom_c_api.h).

One `Native` object per process wraps the library (dlopen returns the same
handle to PyTorch's CUDAPluggableAllocator, so both talk to one allocator).
Calls that return a status code raise `NativeError` with libloom's message
(`loom_last_error()` is per thread, and is read on the calling thread right
after the failing call). No torch here.

Two halves, as in the header:
  - the run-time allocator (configure, markers, plans, stats), used by
    loom.enable();
  - the offline tools (plan a trace, fingerprint it, read, build and write
    trace files), used by the auto-mode planner and loom.tools. They need no
    settings and never configure or create an allocator, so loading libloom
    for them leaves enable() free to configure it later.
"""

import array
import contextlib
import ctypes
import json
import os
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
_c_ull = ctypes.c_ulonglong
_ull_p = ctypes.POINTER(_c_ull)

# Values per event record of the trace handles (LOOM_TRACE_FIELDS): kind,
# flags, device, name index, id, size, stream.
TRACE_FIELDS = 7

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
    # Offline tools.
    "loom_plan_trace": (_c_int, [_c_char_p, _c_char_p, _c_char_p]),
    "loom_plan_file_check": (_c_int, [_c_char_p]),
    "loom_fingerprint_trace": (_c_int, [_c_char_p]),
    "loom_last_result": (_c_char_p, []),
    "loom_trace_new": (_c_void_p, [_c_int, _c_ull, _c_char_p]),
    "loom_trace_read": (_c_int, [_c_char_p, ctypes.POINTER(_c_void_p)]),
    "loom_trace_free": (None, [_c_void_p]),
    "loom_trace_header": (_c_int, [_c_void_p, ctypes.POINTER(_c_int),
                                   _ull_p]),
    "loom_trace_provenance": (_c_char_p, [_c_void_p]),
    "loom_trace_name_count": (_c_longlong, [_c_void_p]),
    "loom_trace_name": (_c_char_p, [_c_void_p, _c_longlong]),
    "loom_trace_intern_name": (_c_longlong, [_c_void_p, _c_char_p]),
    "loom_trace_event_count": (_c_longlong, [_c_void_p]),
    "loom_trace_get_events": (_c_int, [_c_void_p, _c_longlong, _c_longlong,
                                       _ull_p]),
    "loom_trace_add_events": (_c_int, [_c_void_p, _ull_p, _c_longlong]),
    "loom_trace_write": (_c_int, [_c_void_p, _c_char_p]),
}

# Marker names whose encodings Native keeps.
_NAME_CACHE = 4096

# The hooks PyTorch's pluggable allocator takes as raw function pointers.
HOOK_FUNCTIONS = ("loom_torch_malloc", "loom_free", "loom_record_stream",
                  "loom_empty_cache", "loom_set_memory_fraction")


def _encode(text):
    return str(text).encode("utf-8")


def _path(path):
    """A file name for libloom (bytes as the OS spells it)."""
    return os.fsencode(path)


def _text(data):
    """Text libloom returned (names, provenance): UTF-8, with any other byte
    kept as a lone surrogate, so that _text_bytes gives it back unchanged."""
    return data.decode("utf-8", "surrogateescape")


def _text_bytes(text, what):
    """`text` for libloom; ValueError when a C string cannot carry it."""
    if not isinstance(text, str):
        raise ValueError(f"{what} {text!r} is not a string")
    if "\0" in text:
        raise ValueError(f"{what} {text!r} contains a NUL character, which "
                         f"libloom's C interface cannot carry")
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {text!r} is not valid Unicode") from None


def status_text(message):
    """libloom's message without its leading status code name
    ("INVALID_ARGUMENT: x.ltt:3: ..." -> "x.ltt:3: ...")."""
    head, sep, rest = message.partition(": ")
    return rest if sep and head in STATUS_NAMES.values() else message


def plan_options_string(options):
    """`loom_plan_trace`'s options text ("key=value;...") for a dict (values:
    bool -> 1/0, numbers and strings as written), a string (as is) or None.
    ValueError for a key or value that the text cannot carry."""
    if options is None:
        return ""
    if isinstance(options, str):
        return options
    items = []
    for key, value in dict(options).items():
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, float):
            value = repr(value)
        text = f"{key}={value}"
        if not isinstance(key, str) or not key or any(c in text for c in
                                                      ";\n") or "=" in key:
            raise ValueError(f"plan option {key!r}={value!r} cannot be "
                             f"passed to the planner (no ';', '=' in keys "
                             f"or newlines)")
        items.append(text)
    return ";".join(items)


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
        self._names = {}
        self._stats_capacity = 8192
        self._phase = self.lib.loom_phase
        self._module_enter = self.lib.loom_module_enter
        self._module_exit = self.lib.loom_module_exit

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
        # Read once per iteration boundary by the session: one call into
        # libloom with a buffer the size of the last answer (and room to
        # grow), a second only when the JSON outgrew it.
        capacity = self._stats_capacity
        for _ in range(4):  # the JSON may grow between two calls
            buffer = ctypes.create_string_buffer(capacity)
            length = self.lib.loom_stats_json(device, buffer, capacity)
            if length < 0:
                raise NativeError("loom_stats_json", -1, self.last_error())
            if length < capacity:
                self._stats_capacity = max(capacity, length + 1024)
                return json.loads(buffer.value.decode())
            capacity = length + 1024
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

    # Called from hooks on every call of a marked module: the names'
    # encodings are kept (a model has a fixed set of module names; the
    # cache stops growing at _NAME_CACHE entries).

    def _name(self, name):
        try:
            data = self._names.get(name)
        except TypeError:  # not hashable: str() of it, as _encode does
            return _encode(name)
        if data is None:
            data = _encode(name)
            if len(self._names) < _NAME_CACHE:
                self._names[name] = data
        return data

    def phase(self, name):
        self._phase(self._name(name))

    def module_enter(self, name, dynamic):
        self._module_enter(self._name(name), 1 if dynamic else 0)

    def module_exit(self, name):
        self._module_exit(self._name(name))

    # ------------------------------------------------------- offline tools
    # No settings, no allocator: these work whether or not loom is enabled.

    def _result(self):
        return json.loads(self.lib.loom_last_result().decode("utf-8"))

    def plan_trace(self, trace, plan, options=None):
        """Plans the trace (either form) or MiniMalloc CSV at `trace` in
        this process and writes the plan file `plan`. `options`: a dict
        ({"time_limit": 5}), a "key=value;..." string or None (plan/
        make_plan.h). Returns the planner's report (a dict). Releases the
        GIL while planning."""
        try:
            text = plan_options_string(options)
        except ValueError as error:
            raise NativeError("loom_plan_trace", 1, str(error)) from None
        self._check(f"loom_plan_trace({trace})", self.lib.loom_plan_trace(
            _path(trace), _path(plan), _encode(text)))
        return self._result()

    def plan_file_check(self, path):
        """The check recorded in the plan file at `path` when it was made
        (whatif/loom/plan_check.h: planned_peak_reserved_bytes,
        unplanned_peak_reserved_bytes, earns_its_place, ...), or None when
        the file has none. Raises NativeError for an unreadable or corrupt
        file."""
        self._check(f"loom_plan_file_check({path})",
                    self.lib.loom_plan_file_check(_path(path)))
        return self._result()["check"]

    def fingerprint_trace(self, path):
        """The request fingerprint of the trace file at `path` (a dict:
        version, prologue, steady, counts, events, has_steady)."""
        self._check(f"loom_fingerprint_trace({path})",
                    self.lib.loom_fingerprint_trace(_path(path)))
        return self._result()

    def read_trace_file(self, path):
        """The trace file at `path` (either form) as (device, granularity,
        provenance, names, records): `records` is an array('Q') of
        TRACE_FIELDS values per event."""
        handle = _c_void_p()
        self._check(f"loom_trace_read({path})", self.lib.loom_trace_read(
            _path(path), ctypes.byref(handle)))
        try:
            return self._trace_contents(handle)
        finally:
            self.lib.loom_trace_free(handle)

    def write_trace_file(self, path, device, granularity, provenance, names,
                         records):
        """Builds a trace (checked event by event, as read_trace_file
        returns them) and writes it to `path`: the text form for a `.ltt`
        path, binary otherwise."""
        with self._trace_handle(device, granularity, provenance, names,
                                records) as handle:
            self._check(f"loom_trace_write({path})",
                        self.lib.loom_trace_write(handle, _path(path)))

    def check_trace(self, device, granularity, provenance, names, records):
        """Raises NativeError naming the first event (by index) that breaks
        the trace format's rules; the header and names are checked too."""
        with self._trace_handle(device, granularity, provenance, names,
                                records):
            pass

    @contextlib.contextmanager
    def _trace_handle(self, device, granularity, provenance, names, records):
        if not -(1 << 31) <= device < (1 << 31):
            raise NativeError("loom_trace_new", 5,
                              f"header device {device} out of range")
        if not 0 <= granularity < (1 << 64):
            raise NativeError("loom_trace_new", 5,
                              f"granularity {granularity} out of range")
        try:
            provenance_bytes = _text_bytes(provenance, "provenance")
        except ValueError as error:
            raise NativeError("loom_trace_new", 1, str(error)) from None
        handle = self.lib.loom_trace_new(device, granularity,
                                         provenance_bytes)
        if not handle:
            raise NativeError("loom_trace_new", -1, self.last_error())
        try:
            for index, name in enumerate(names):
                self._intern(handle, index, name)
            count = len(records) // TRACE_FIELDS
            if len(records) != count * TRACE_FIELDS:
                raise NativeError("loom_trace_add_events", 1,
                                  f"{len(records)} values are not whole "
                                  f"records of {TRACE_FIELDS}")
            if count:
                data = records if isinstance(records, array.array) and \
                    records.typecode == "Q" else array.array("Q", records)
                buffer = (_c_ull * len(data)).from_buffer(data)
                self._check("loom_trace_add_events",
                            self.lib.loom_trace_add_events(handle, buffer,
                                                           count))
            yield handle
        finally:
            self.lib.loom_trace_free(handle)

    def _intern(self, handle, index, name):
        """Adds names[index]; a failure is a NativeError whose `name_index`
        is `index`."""
        try:
            data = _text_bytes(name, "name")
            got = self.lib.loom_trace_intern_name(handle, data)
            if got < 0:
                error = NativeError("loom_trace_intern_name", -1,
                                    self.last_error())
            elif got != index:
                error = NativeError("loom_trace_intern_name", 1,
                                    f"name {name!r} given twice")
            else:
                return
        except ValueError as reason:
            error = NativeError("loom_trace_intern_name", 1, str(reason))
        error.name_index = index
        raise error

    def _trace_contents(self, handle):
        device, granularity = _c_int(), _c_ull()
        self._check("loom_trace_header", self.lib.loom_trace_header(
            handle, ctypes.byref(device), ctypes.byref(granularity)))
        provenance = _text(self.lib.loom_trace_provenance(handle) or b"")
        names = [_text(self.lib.loom_trace_name(handle, i))
                 for i in range(self.lib.loom_trace_name_count(handle))]
        count = self.lib.loom_trace_event_count(handle)
        records = array.array("Q", bytes(8 * TRACE_FIELDS * count))
        if count:
            buffer = (_c_ull * len(records)).from_buffer(records)
            self._check("loom_trace_get_events",
                        self.lib.loom_trace_get_events(handle, 0, count,
                                                       buffer))
        return device.value, granularity.value, provenance, names, records


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
