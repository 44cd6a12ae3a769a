"""loom traces as Python objects, read, checked and written by libloom.

The model the snapshot importer and exporter work on: a `Trace` (header:
device, granularity, provenance; one time-ordered list of `Event`s, whose
index is their time). Nothing here reads or writes loom's trace formats:
`read_trace`, `write_trace` and `validate_trace` hand the events to
libloom's trace handles (torch_plugin/loom_c_api.h, "Offline tools"), so the
C++ reader, writer and trace checker (docs/formats.md) are the only
definition of a valid trace, and every error is theirs, naming the file and
line or byte offset, or the event by its index. Both forms are handled: text
(`.ltt`) and binary (any other name).

Events cross the C interface as records of seven unsigned 64-bit values
(kind, flags, device, name index, id, size, stream); this module only maps
them to and from `Event`s and the name table to and from names.
"""

import array
import dataclasses
import os

from loom import _native
from loom.errors import NativeError

ALLOC = "alloc"
FREE = "free"
ITER_BEGIN = "iter_begin"
ITER_END = "iter_end"
PHASE = "phase"
MODULE_ENTER = "module_enter"
MODULE_EXIT = "module_exit"

# Event kind <-> the C interface's kind code (plan/trace/trace.h EventKind).
KIND_CODES = {ALLOC: 1, FREE: 2, ITER_BEGIN: 3, ITER_END: 4, PHASE: 5,
              MODULE_ENTER: 6, MODULE_EXIT: 7}
_KINDS = (None, ALLOC, FREE, ITER_BEGIN, ITER_END, PHASE, MODULE_ENTER,
          MODULE_EXIT)
_NAMED = (PHASE, MODULE_ENTER, MODULE_EXIT)
DYNAMIC_FLAG = 1  # on module_enter
# A name index no trace has: what an event of a kind without names sends
# when it carries a name anyway, so that the trace checker refuses it.
_NO_NAME = (1 << 32) - 1
_U64 = (1 << 64) - 1


class TraceError(ValueError):
    """A trace file or object breaks the format; the message (libloom's)
    says where: the file and line or offset, or the event's index."""


@dataclasses.dataclass(slots=True)
class Event:
    """One trace event. `id` is the request id (alloc/free) or the iteration
    number (iter_begin/iter_end); `name` is the phase or module name;
    `dynamic` flags a module_enter whose allocation sizes vary. Not frozen
    (frozen dataclasses are slow to build); treat events as values."""
    kind: str
    id: int = 0
    size: int = 0
    stream: int = 0
    device: int = 0
    name: str = ""
    dynamic: bool = False

    @staticmethod
    def alloc(request_id, size, stream=0, device=0):
        return Event(ALLOC, id=request_id, size=size, stream=stream,
                     device=device)

    @staticmethod
    def free(request_id, stream=0, device=0):
        return Event(FREE, id=request_id, stream=stream, device=device)


@dataclasses.dataclass
class Trace:
    """A whole trace in memory. `names` is the name table a file was read
    with (names no event uses included); write_trace defines these first,
    so a trace read and written back is the same file. Equality ignores
    it: two traces are equal when their headers and events are."""
    device: int = 0
    granularity: int = 0
    provenance: str = ""
    events: list = dataclasses.field(default_factory=list)
    names: list = dataclasses.field(default_factory=list, compare=False)


def _native_lib():
    return _native.load()  # LoomError, with the build command, if not built


def _error(error):
    return TraceError(_native.status_text(error.message))


def _records(trace):
    """(names, records, first use of each name) of `trace` for the C
    interface. Raises TraceError for values the records cannot hold (not an
    unsigned 64-bit integer, a name that is not text); everything else is
    the trace checker's."""
    names = list(dict.fromkeys(trace.names))
    index = {name: i for i, name in enumerate(names)}
    first_use = {}
    records = array.array("Q")
    extend = records.extend
    codes = KIND_CODES
    for position, event in enumerate(trace.events):
        kind = event.kind
        code = codes.get(kind)
        if code is None:
            raise TraceError(f"event {position}: unknown event kind {kind!r}")
        name = event.name
        if code >= 5:
            number = index.get(name)
            if number is None:
                if not isinstance(name, str):
                    raise TraceError(f"event {position}: name {name!r} is "
                                     f"not a string")
                number = index[name] = len(names)
                first_use[number] = position
                names.append(name)
        else:
            number = _NO_NAME if name else 0
        try:
            extend((code, DYNAMIC_FLAG if event.dynamic else 0, event.device,
                    number, event.id, event.size, event.stream))
        except (OverflowError, TypeError):
            for field in ("device", "id", "size", "stream"):
                value = getattr(event, field)
                if type(value) is not int or not 0 <= value <= _U64:
                    raise TraceError(
                        f"event {position}: {field} {value!r} out of range "
                        f"(an unsigned 64-bit integer)") from None
            raise
    return names, records, first_use


def _to_native_call(call, trace, *args):
    device, granularity = trace.device, trace.granularity
    for what, value in (("header device", device),
                        ("granularity", granularity)):
        if type(value) is not int:
            raise TraceError(f"{what} {value!r} is not an integer")
    names, records, first_use = _records(trace)
    try:
        call(*args, device, granularity, trace.provenance, names, records)
    except NativeError as error:
        position = first_use.get(getattr(error, "name_index", None))
        if position is not None:  # a name some event brought: name it
            raise TraceError(f"event {position}: "
                             f"{_native.status_text(error.message)}"
                             ) from None
        raise _error(error) from None


def validate_trace(trace):
    """Raises TraceError naming the first event that breaks the format's
    rules (libloom's trace checker: live requests, module nesting,
    iteration ends, value limits, unused fields zero), or a bad header."""
    _to_native_call(_native_lib().check_trace, trace)


def write_trace(trace, path):
    """Writes `trace` to `path`: the text form for a `.ltt` name, binary
    otherwise. Checked first (TraceError), so whatever is written reads
    back; a file that cannot be written is a TraceError too."""
    _to_native_call(_native_lib().write_trace_file, trace, os.fspath(path))


def read_trace(path):
    """Reads a trace file (either form). Raises TraceError naming the file
    and the line or byte offset."""
    try:
        device, granularity, provenance, names, records = \
            _native_lib().read_trace_file(os.fspath(path))
    except NativeError as error:
        raise _error(error) from None
    kinds, fields = _KINDS, _native.TRACE_FIELDS
    events = []
    append = events.append
    values = iter(records)
    for code, flags, event_device, name, request, size, stream in zip(
            *[values] * fields):
        kind = kinds[code]
        append(Event(kind, request, size, stream, event_device,
                     names[name] if kind in _NAMED else "",
                     bool(flags & DYNAMIC_FLAG)))
    return Trace(device=device, granularity=granularity,
                 provenance=provenance, events=events, names=names)
