"""The loom trace text form (`.ltt`, version 1): model, reader and writer.

This is the Python twin of the C++ text reader/writer; the format is
specified in docs/formats.md and implemented here exactly. A trace is a
header (device, granularity, provenance) and one time-ordered list of
events; the index of an event is its time.

Invariants of a `Trace` that `validate_trace` checks (and that the reader
and the writer enforce, so every file written here reads back):
  - an alloc names a request id that is not live, with 1 <= size <= 2^50;
  - a free names a live request id;
  - module exits match the innermost open module enter;
  - ids, iteration numbers and streams fit in 64 bits unsigned, event
    devices in 0..32767, the header device in -1..32767.

Where docs/formats.md is silent this reader chooses (documented in
docs/design.md): tokens are separated by spaces or tabs; a line whose first
non-blank character is `#` is a comment; the `s=` and `d=` options may come
in either order but each at most once; `ib`/`ie` pairs are not checked; a
module still open at the end is allowed.
"""

import dataclasses
import re

MAGIC = "loom-trace"
VERSION = 1
MAX_SIZE = 1 << 50
MAX_U64 = (1 << 64) - 1
MAX_DEVICE = 32767

ALLOC = "alloc"
FREE = "free"
ITER_BEGIN = "iter_begin"
ITER_END = "iter_end"
PHASE = "phase"
MODULE_ENTER = "module_enter"
MODULE_EXIT = "module_exit"

_KEYWORD_OF_KIND = {
    ALLOC: "a", FREE: "f", ITER_BEGIN: "ib", ITER_END: "ie", PHASE: "ph",
    MODULE_ENTER: "me", MODULE_EXIT: "mx",
}
_KIND_OF_KEYWORD = {kw: kind for kind, kw in _KEYWORD_OF_KIND.items()}


class TraceError(ValueError):
    """A trace file or object breaks the format; the message says where."""


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
    """A whole trace in memory."""
    device: int = 0
    granularity: int = 0
    provenance: str = ""
    events: list = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------- validation

class _Checker:
    """Incremental invariant checks shared by the reader and validate_trace.
    `check` returns an error reason, or None when the event is fine."""

    def __init__(self):
        self.live = set()
        self.modules = []

    def check(self, event):
        kind = event.kind
        if kind == ALLOC:
            if not 0 <= event.id <= MAX_U64:
                return f"request id {event.id} out of range"
            if not 1 <= event.size <= MAX_SIZE:
                return (f"alloc size {event.size} out of range "
                        f"(1..2^50 bytes)")
            if event.id in self.live:
                return f"alloc of request {event.id}, which is already live"
            self.live.add(event.id)
        elif kind == FREE:
            if event.id not in self.live:
                return f"free of request {event.id}, which is not live"
            self.live.remove(event.id)
        elif kind in (ITER_BEGIN, ITER_END):
            if not 0 <= event.id <= MAX_U64:
                return f"iteration number {event.id} out of range"
        elif kind == MODULE_ENTER:
            self.modules.append(event.name)
        elif kind == MODULE_EXIT:
            if not self.modules:
                return f"exit of module {event.name!r}, but no module is open"
            if self.modules[-1] != event.name:
                return (f"exit of module {event.name!r} while "
                        f"{self.modules[-1]!r} is the innermost open module")
            self.modules.pop()
        elif kind != PHASE:
            return f"unknown event kind {kind!r}"
        if kind in (ALLOC, FREE):
            if not 0 <= event.stream <= MAX_U64:
                return f"stream {event.stream} out of range"
            if not 0 <= event.device <= MAX_DEVICE:
                return f"device {event.device} out of range (0..{MAX_DEVICE})"
        return None


def validate_trace(trace):
    """Raises TraceError naming the first event that breaks an invariant."""
    if not -1 <= trace.device <= MAX_DEVICE:
        raise TraceError(f"header device {trace.device} out of range")
    if not 0 <= trace.granularity <= MAX_U64:
        raise TraceError(f"granularity {trace.granularity} out of range")
    checker = _Checker()
    for index, event in enumerate(trace.events):
        reason = checker.check(event)
        if reason:
            raise TraceError(f"event {index}: {reason}")


# ------------------------------------------------------------------- writing

_BARE_NAME = re.compile(r'[^\s"\\\x00-\x1f\x7f]+')


def quote(text):
    """`text` as a double-quoted string with the format's escapes."""
    out = ['"']
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7f:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def format_name(name):
    """A phase/module name as one token, quoted only when needed."""
    return name if _BARE_NAME.fullmatch(name) else quote(name)


def _options(event):
    text = f" s={event.stream}" if event.stream else ""
    return text + (f" d={event.device}" if event.device else "")


def format_event(event):
    """The text line of one event (no line end)."""
    kind = event.kind
    if kind == ALLOC:
        return f"a {event.id} {event.size}{_options(event)}"
    if kind == FREE:
        return f"f {event.id}{_options(event)}"
    if kind in (ITER_BEGIN, ITER_END):
        return f"{_KEYWORD_OF_KIND[kind]} {event.id}"
    if kind == MODULE_ENTER:
        suffix = " dynamic" if event.dynamic else ""
        return f"me {format_name(event.name)}{suffix}"
    if kind in (PHASE, MODULE_EXIT):
        return f"{_KEYWORD_OF_KIND[kind]} {format_name(event.name)}"
    raise TraceError(f"unknown event kind {kind!r}")


def format_header(device, granularity, provenance):
    return (f"{MAGIC} {VERSION}\ndevice {device}\ngranularity {granularity}\n"
            f"provenance {quote(provenance)}\nevents\n")


def format_trace(trace):
    """The whole trace as text. REQUIRES: validate_trace(trace) passes
    (checked: raises TraceError otherwise)."""
    validate_trace(trace)
    lines = [format_header(trace.device, trace.granularity, trace.provenance)]
    lines.extend(format_event(event) + "\n" for event in trace.events)
    lines.append(f"end {len(trace.events)}\n")
    return "".join(lines)


def write_trace(trace, path):
    """Writes `trace` to `path` in the text form (UTF-8, `\\n` line ends)."""
    text = format_trace(trace)
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        out.write(text)


# ------------------------------------------------------------------- reading

_DIGITS = re.compile(r"[0-9]+")
_HEX = "0123456789abcdefABCDEF"


class _LineError(Exception):
    """Internal: a reason, to be prefixed with the file and line."""


def _number(token, what, low=0, high=MAX_U64):
    if not _DIGITS.fullmatch(token):
        raise _LineError(f"{what} {token!r} is not an unsigned decimal number")
    if len(token) > 25:
        raise _LineError(f"{what} {token[:25]}... out of range ({low}..{high})")
    value = int(token)
    if not low <= value <= high:
        raise _LineError(f"{what} {value} out of range ({low}..{high})")
    return value


class _Quoted(str):
    """A token that was a quoted string (bare tokens are plain str)."""


_BLANKS = re.compile(r"[ \t]+")


def _tokenize(line):
    """Splits a line into tokens: bare tokens are str, quoted strings
    _Quoted (unescaped)."""
    stripped = line.strip(" \t")
    if '"' not in stripped and "\\" not in stripped:
        return _BLANKS.split(stripped)  # the common case, fast
    tokens = []
    pos, length = 0, len(line)
    while True:
        while pos < length and line[pos] in " \t":
            pos += 1
        if pos == length:
            return tokens
        if line[pos] != '"':
            start = pos
            while pos < length and line[pos] not in " \t":
                if line[pos] in '"\\':
                    raise _LineError(
                        f"unexpected {line[pos]!r} in token "
                        f"{line[start:].split()[0]!r} (quote the name)")
                pos += 1
            tokens.append(line[start:pos])
            continue
        pos += 1
        raw = bytearray()
        while True:
            if pos == length:
                raise _LineError("unterminated quoted string")
            char = line[pos]
            if char == '"':
                pos += 1
                break
            if char != "\\":
                raw += char.encode("utf-8")
                pos += 1
                continue
            escape = line[pos + 1:pos + 2]
            if escape in ("\\", '"'):
                raw += escape.encode()
                pos += 2
            elif escape == "n":
                raw += b"\n"
                pos += 2
            elif escape == "t":
                raw += b"\t"
                pos += 2
            elif escape == "x":
                digits = line[pos + 2:pos + 4]
                if len(digits) != 2 or any(c not in _HEX for c in digits):
                    raise _LineError(r"\x escape needs two hex digits")
                raw.append(int(digits, 16))
                pos += 4
            else:
                raise _LineError(f"unknown escape '\\{escape}' in quoted "
                                 f"string")
        if pos < length and line[pos] not in " \t":
            raise _LineError("quoted string must be followed by a space")
        try:
            tokens.append(_Quoted(raw.decode("utf-8")))
        except UnicodeDecodeError:
            raise _LineError("quoted string is not valid UTF-8") from None


def _bare(token, what):
    if type(token) is _Quoted:
        raise _LineError(f"{what} must not be quoted")
    return token


def _parse_options(tokens, keyword):
    stream = device = None
    for text in tokens:
        key, sep, value = text.partition("=")
        if type(text) is _Quoted or not sep or key not in ("s", "d"):
            raise _LineError(f"unexpected {text!r} after '{keyword}' "
                             f"(expected s=STREAM or d=DEVICE)")
        if key == "s":
            if stream is not None:
                raise _LineError("s= given twice")
            stream = _number(value, "stream")
        else:
            if device is not None:
                raise _LineError("d= given twice")
            device = _number(value, "device", 0, MAX_DEVICE)
    return stream or 0, device or 0


def _parse_event(tokens):
    keyword = _bare(tokens[0], "keyword")
    kind = _KIND_OF_KEYWORD.get(keyword)
    args = tokens[1:]
    if kind is None:
        raise _LineError(f"unknown keyword {keyword!r}")
    if kind == ALLOC:
        if len(args) < 2:
            raise _LineError("alloc needs a request id and a size")
        request_id = _number(_bare(args[0], "id"), "request id")
        size = _number(_bare(args[1], "size"), "size", 1, MAX_SIZE)
        stream, device = _parse_options(args[2:], keyword)
        return Event(ALLOC, id=request_id, size=size, stream=stream,
                     device=device)
    if kind == FREE:
        if not args:
            raise _LineError("free needs a request id")
        request_id = _number(_bare(args[0], "id"), "request id")
        stream, device = _parse_options(args[1:], keyword)
        return Event(FREE, id=request_id, stream=stream, device=device)
    if kind in (ITER_BEGIN, ITER_END):
        if len(args) != 1:
            raise _LineError(f"'{keyword}' needs exactly one iteration number")
        return Event(kind, id=_number(_bare(args[0], "iteration"),
                                      "iteration number"))
    if kind == MODULE_ENTER:
        if len(args) not in (1, 2):
            raise _LineError("'me' needs a module name and optionally "
                             "'dynamic'")
        if len(args) == 2 and (args[1] != "dynamic" or
                               type(args[1]) is _Quoted):
            raise _LineError(f"unexpected {args[1]!r} after the module "
                             f"name (expected 'dynamic')")
        return Event(kind, name=str(args[0]), dynamic=len(args) == 2)
    if len(args) != 1:
        raise _LineError(f"'{keyword}' needs exactly one name")
    return Event(kind, name=str(args[0]))


_FAST_LINE = re.compile(
    r"([af]) ([0-9]{1,20})(?: ([0-9]{1,16}))?(?: s=([0-9]{1,20}))?"
    r"(?: d=([0-9]{1,5}))?")


def _fast_event(stripped):
    """The event of a canonical alloc/free line (as the writer writes it),
    or None to take the general path (which also explains errors)."""
    match = _FAST_LINE.fullmatch(stripped)
    if match is None:
        return None
    keyword, request, size, stream, device = match.groups()
    request = int(request)
    stream = int(stream) if stream else 0
    device = int(device) if device else 0
    if request > MAX_U64 or stream > MAX_U64 or device > MAX_DEVICE:
        return None
    if keyword == "a":
        if size is None or not 1 <= int(size) <= MAX_SIZE:
            return None
        return Event(ALLOC, id=request, size=int(size), stream=stream,
                     device=device)
    if size is not None:
        return None
    return Event(FREE, id=request, stream=stream, device=device)


_HEADER_KEYS = ("device", "granularity", "provenance", "events")


def parse_trace(text, source="<text>"):
    """Parses the text form. Raises TraceError("source:line: reason")."""
    trace = Trace()
    checker = _Checker()
    stage = -1  # -1: magic; 0..3: header line _HEADER_KEYS[stage]; 4: events
    trailer_line = None
    line_number = last_line = 1
    try:
        for line_number, line in enumerate(text.split("\n"), start=1):
            if line.endswith("\r"):
                line = line[:-1]
            stripped = line.strip(" \t")
            if not stripped or stripped.startswith("#"):
                continue
            last_line = line_number
            if trailer_line is not None:
                raise _LineError(f"content after the 'end' trailer (line "
                                 f"{trailer_line})")
            if stage == 4:
                event = _fast_event(stripped)
                if event is not None:
                    reason = checker.check(event)
                    if reason:
                        raise _LineError(reason)
                    trace.events.append(event)
                    continue
            tokens = _tokenize(line)
            if stage == -1:
                if (len(tokens) != 2 or type(tokens[0]) is _Quoted or
                        tokens[0] != MAGIC):
                    raise _LineError(f"not a loom text trace: expected "
                                     f"'{MAGIC} {VERSION}' as the first line")
                version = _number(_bare(tokens[1], "version"), "version")
                if version != VERSION:
                    raise _LineError(f"unsupported trace version {version} "
                                     f"(this reader knows {VERSION})")
                stage = 0
            elif stage < 4:
                _parse_header_line(trace, tokens, _HEADER_KEYS[stage])
                stage += 1
            elif tokens[0] == "end" and type(tokens[0]) is str:
                if len(tokens) != 2:
                    raise _LineError("'end' needs exactly the event count")
                count = _number(_bare(tokens[1], "count"), "event count")
                if count != len(trace.events):
                    raise _LineError(f"trailer says {count} events, the file "
                                     f"has {len(trace.events)}")
                trailer_line = line_number
            else:
                event = _parse_event(tokens)
                reason = checker.check(event)
                if reason:
                    raise _LineError(reason)
                trace.events.append(event)
    except _LineError as error:
        raise TraceError(f"{source}:{line_number}: {error}") from None
    if trailer_line is None:
        if stage == -1:
            what = "empty file (no 'loom-trace 1' line)"
        elif stage < 4:
            what = f"header ends early: missing '{_HEADER_KEYS[stage]}' line"
        else:
            what = (f"truncated: no 'end' trailer after "
                    f"{len(trace.events)} events")
        raise TraceError(f"{source}:{last_line}: {what}")
    return trace


def _parse_header_line(trace, tokens, key):
    if tokens[0] != key or type(tokens[0]) is _Quoted:
        raise _LineError(f"expected the '{key}' header line, got "
                         f"{str(tokens[0])!r}")
    if key == "events":
        if len(tokens) != 1:
            raise _LineError("'events' takes no value")
        return
    if len(tokens) != 2:
        raise _LineError(f"'{key}' needs exactly one value")
    if key == "device":
        token = _bare(tokens[1], "device")
        trace.device = -1 if token == "-1" else _number(
            token, "header device", 0, MAX_DEVICE)
    elif key == "granularity":
        trace.granularity = _number(_bare(tokens[1], "granularity"),
                                    "granularity")
    else:
        if type(tokens[1]) is not _Quoted:
            raise _LineError("provenance must be a quoted string")
        trace.provenance = str(tokens[1])


def read_trace(path):
    """Reads a text trace file. Raises TraceError naming the file."""
    try:
        with open(path, "rb") as source:
            data = source.read()
    except OSError as error:
        raise TraceError(f"{path}: cannot read: {error.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise TraceError(f"{path}:{line}: not valid UTF-8 (byte offset "
                         f"{error.start})") from None
    return parse_trace(text, str(path))
