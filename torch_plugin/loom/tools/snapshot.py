"""Safe loading of PyTorch memory snapshots (torch.cuda.memory._dump_snapshot).

A snapshot is a pickle of plain data (dicts, lists, tuples, strings, ints,
floats, bools, None). It is loaded with a restricted unpickler that refuses
every global, persistent id and opcode that is not plain data, so no code
in the file can run and nothing but plain data (those types and bytes) can
come out; then its structure is checked before anything uses it. Every
failure is a `SnapshotError` whose message names the file and the place
(`device_traces[0][17]: ...`).

Schema used by loom (research/vmm_anchors.md §3.3):
  {"device_traces": [[entry, ...] per device],
   "segments": [{"device", "address", "stream", "blocks": [
       {"address", "size", "requested_size", "state"}, ...]}, ...], ...}
  entry = {"action", "addr", "size", "stream", "time_us", "frames", ...}
`addr`, `size` and `stream` are required for alloc/free_requested/
free_completed entries and type-checked wherever present. Legacy blocks
without `address` are placed like the PyTorch visualizer does (segment
address plus the sizes of the blocks before them); without `requested_size`
the block's `size` is used.
"""

import io
import pickle
import pickletools

MAX_SIZE = 1 << 50          # bytes; anything larger is corrupt input
MAX_ADDRESS = (1 << 64) - 1
MAX_DEVICE = 32767
BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
ACTIVE_STATES = ("active_allocated", "active_pending_free")


class SnapshotError(ValueError):
    """A snapshot file cannot be used; the message says which and why."""


def is_snapshot_file(path):
    """True when `path` is a regular file that starts with a pickle protocol
    header (PROTO opcode, protocol 2..5), as every `_dump_snapshot` file
    does. Decided by content, not by the file name."""
    try:
        with open(path, "rb") as source:
            return has_pickle_header(source.read(2))
    except OSError:
        return False


def has_pickle_header(data):
    """True when `data` starts with a PROTO opcode for protocol 2..5."""
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5


# Opcodes that build plain data, plus the ones that ask find_class or
# persistent_load (which refuse, naming what was asked for). Every other
# opcode (REDUCE, BUILD, OBJ, NEWOBJ, EXT*, sets, bytearrays, out-of-band
# buffers) is refused by name before it runs.
_ALLOWED_OPCODES = frozenset("""
    PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE
    INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT
    STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES BINBYTES8
    UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8
    EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3
    EMPTY_DICT DICT SETITEM SETITEMS
    GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE
    GLOBAL STACK_GLOBAL INST PERSID BINPERSID
""".split())


def _refuse_opcode(name, code):
    def refuse(unpickler):
        if name is None:
            raise SnapshotError(f"{unpickler.source}: not a readable pickle: "
                                f"invalid opcode byte {code:#04x}")
        raise SnapshotError(
            f"{unpickler.source}: refused pickle opcode {name} (byte "
            f"{code:#04x}): a memory snapshot holds plain data only")
    return refuse


def _restricted_dispatch():
    names = {ord(op.code): op.name for op in pickletools.opcodes}
    plain = pickle._Unpickler.dispatch  # pylint: disable=protected-access
    return {code: plain[code] if names.get(code) in _ALLOWED_OPCODES
            else _refuse_opcode(names.get(code), code)
            for code in range(256)}


# pylint: disable-next=protected-access
class _RestrictedUnpickler(pickle._Unpickler):
    """Refuses every global (classes, functions), persistent id and opcode
    that could build anything but plain data.

    Built on the pure-Python unpickler: its memo is a dict, so a corrupt
    PUT index cannot make it allocate gigabytes (the C unpickler grows an
    array to the index), and its dispatch table can be restricted."""

    dispatch = _restricted_dispatch()

    def __init__(self, data, source):
        self.stream = io.BytesIO(data)
        super().__init__(self.stream)
        self.source = source

    def find_class(self, module, name):
        raise SnapshotError(
            f"{self.source}: refused global '{module}.{name}': a memory "
            f"snapshot holds plain data only, so this file is not one (or "
            f"was tampered with); it is not loaded")

    def persistent_load(self, pid):
        raise SnapshotError(f"{self.source}: refused persistent id "
                            f"{str(pid)[:60]!r}: a memory snapshot holds "
                            f"plain data only")


def loads_snapshot(data, source="<bytes>"):
    """Unpickles and validates snapshot bytes. `source` names the input in
    errors. Returns the top-level dict."""
    if not data:
        raise SnapshotError(f"{source}: empty file, not a memory snapshot")
    if not has_pickle_header(data):
        raise SnapshotError(f"{source}: not a memory snapshot: it does not "
                            f"start with a pickle protocol header (0x80 and "
                            f"a protocol 2..5)")
    unpickler = _RestrictedUnpickler(data, source)
    try:
        snapshot = unpickler.load()
    except SnapshotError:
        raise
    except Exception as error:  # pylint: disable=broad-except
        # Truncated or corrupt pickles raise many kinds of error from inside
        # the unpickler (EOFError, UnpicklingError, ValueError, TypeError,
        # MemoryError...): all mean the same thing to the user.
        reason = str(error) or type(error).__name__
        if not isinstance(error, pickle.UnpicklingError):
            reason = f"{type(error).__name__}: {reason}"
        if isinstance(error, EOFError) or "exhausted before end" in reason:
            reason = "the data ends early (truncated file)"
        raise SnapshotError(f"{source}: not a readable pickle: "
                            f"{reason}") from None
    consumed = unpickler.stream.tell()
    if consumed != len(data):
        raise SnapshotError(f"{source}: {len(data) - consumed} unexpected "
                            f"bytes after the end of the pickle (byte "
                            f"offset {consumed})")
    validate_snapshot(snapshot, source)
    return snapshot


def load_snapshot(path):
    """Reads, unpickles (restricted) and validates the snapshot at `path`."""
    try:
        with open(path, "rb") as source:
            data = source.read()
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror}") from None
    return loads_snapshot(data, str(path))


# ----------------------------------------------------------------- structure

def _fail(source, where, what):
    raise SnapshotError(f"{source}: {where}: {what}")


def _describe(value):
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _get_int(source, where, record, key, low, high, required=True,
             default=None):
    if key not in record:
        if required:
            _fail(source, where, f"missing key '{key}'")
        return default
    value = record[key]
    if type(value) is not int:  # bool is an int subclass: refused too
        _fail(source, where, f"'{key}' is {_describe(value)}, expected an "
              f"integer")
    if not low <= value <= high:
        _fail(source, where, f"'{key}' is {value}, outside {low}..{high}")
    return value


def _get_str(source, where, record, key):
    if key not in record:
        _fail(source, where, f"missing key '{key}'")
    value = record[key]
    if type(value) is not str:
        _fail(source, where, f"'{key}' is {_describe(value)}, expected a "
              f"string")
    return value


def _get_list(source, where, record, key):
    if key not in record:
        _fail(source, where, f"missing key '{key}'")
    value = record[key]
    if type(value) is not list:
        _fail(source, where, f"'{key}' is {_describe(value)}, expected a "
              f"list")
    return value


def _check_entry(source, where, entry):
    if type(entry) is not dict:
        _fail(source, where, f"trace entry is {_describe(entry)}, expected "
              f"a dict")
    action = _get_str(source, where, entry, "action")
    required = action in BLOCK_ACTIONS
    _get_int(source, where, entry, "addr", 0, MAX_ADDRESS, required)
    _get_int(source, where, entry, "size", 0, MAX_SIZE, required)
    _get_int(source, where, entry, "stream", 0, MAX_ADDRESS, required)


def validate_snapshot(snapshot, source="<snapshot>"):
    """Checks the structure loom relies on (see the module docstring) and
    fills in legacy block fields (`address`, `requested_size`) in place.
    Raises SnapshotError naming the first problem."""
    if type(snapshot) is not dict:
        raise SnapshotError(f"{source}: top level is {_describe(snapshot)}, "
                            f"expected a dict with 'device_traces' and "
                            f"'segments' (a torch.cuda.memory._snapshot())")
    traces = _get_list(source, "top level", snapshot, "device_traces")
    segments = _get_list(source, "top level", snapshot, "segments")
    if len(traces) > MAX_DEVICE + 1:
        _fail(source, "device_traces", f"{len(traces)} devices, more than "
              f"{MAX_DEVICE + 1}")
    for device, trace in enumerate(traces):
        if type(trace) is not list:
            _fail(source, f"device_traces[{device}]",
                  f"is {_describe(trace)}, expected a list of entries")
        for index, entry in enumerate(trace):
            _check_entry(source, f"device_traces[{device}][{index}]", entry)
    for number, segment in enumerate(segments):
        where = f"segments[{number}]"
        if type(segment) is not dict:
            _fail(source, where, f"is {_describe(segment)}, expected a dict")
        _get_int(source, where, segment, "device", 0, MAX_DEVICE)
        address = _get_int(source, where, segment, "address", 0, MAX_ADDRESS)
        _get_int(source, where, segment, "stream", 0, MAX_ADDRESS)
        for index, block in enumerate(
                _get_list(source, where, segment, "blocks")):
            block_where = f"{where}.blocks[{index}]"
            if type(block) is not dict:
                _fail(source, block_where, f"is {_describe(block)}, "
                      f"expected a dict")
            size = _get_int(source, block_where, block, "size", 0, MAX_SIZE)
            _get_str(source, block_where, block, "state")
            block["address"] = _get_int(source, block_where, block,
                                        "address", 0, MAX_ADDRESS,
                                        required=False, default=address)
            block["requested_size"] = _get_int(
                source, block_where, block, "requested_size", 0, MAX_SIZE,
                required=False, default=size)
            address = block["address"] + size


def active_blocks(snapshot, device):
    """[(address, requested_size, stream)] of the blocks live at the dump
    (state active_allocated or active_pending_free) on `device`, by address.
    REQUIRES: `snapshot` passed validate_snapshot."""
    blocks = []
    for segment in snapshot["segments"]:
        if segment["device"] != device:
            continue
        for block in segment["blocks"]:
            if block["state"] in ACTIVE_STATES:
                blocks.append((block["address"], block["requested_size"],
                               segment["stream"]))
    blocks.sort()
    return blocks
