"""The loom trace text form (docs/formats.md): writer, reader, errors."""

import pytest

from loom import trace_text
from loom.trace_text import Event, Trace, TraceError


def _every_kind_trace():
    return Trace(device=3, granularity=2097152,
                 provenance='unit test "x"\\y\n\tz',
                 events=[
                     Event(trace_text.ITER_BEGIN, id=0),
                     Event(trace_text.PHASE, name="forward"),
                     Event(trace_text.MODULE_ENTER, name="layers.0.moe",
                           dynamic=True),
                     Event.alloc(17, 4096),
                     Event.alloc(18, 1, stream=7, device=3),
                     Event.free(17, stream=7),
                     Event(trace_text.MODULE_EXIT, name="layers.0.moe"),
                     Event(trace_text.MODULE_ENTER, name="two words"),
                     Event(trace_text.MODULE_ENTER, name="dynamic"),
                     Event(trace_text.MODULE_EXIT, name="dynamic"),
                     Event(trace_text.MODULE_EXIT, name="two words"),
                     Event(trace_text.PHASE, name='q"\\\x01\x7fé'),
                     Event(trace_text.PHASE, name=""),
                     Event.free(18, device=3),
                     Event.alloc(17, 1 << 50, stream=(1 << 64) - 1),
                     Event(trace_text.ITER_END, id=(1 << 64) - 1),
                 ])


EVERY_KIND_TEXT = r'''loom-trace 1
device 3
granularity 2097152
provenance "unit test \"x\"\\y\n\tz"
events
ib 0
ph forward
me layers.0.moe dynamic
a 17 4096
a 18 1 s=7 d=3
f 17 s=7
mx layers.0.moe
me "two words"
me dynamic
mx dynamic
mx "two words"
ph "q\"\\\x01\x7fé"
ph ""
f 18 d=3
a 17 1125899906842624 s=18446744073709551615
ie 18446744073709551615
end 16
'''


def test_writer_output_is_exact():
    assert trace_text.format_trace(_every_kind_trace()) == EVERY_KIND_TEXT


def test_round_trip_both_ways():
    trace = _every_kind_trace()
    assert trace_text.parse_trace(EVERY_KIND_TEXT) == trace
    assert trace_text.format_trace(
        trace_text.parse_trace(EVERY_KIND_TEXT)) == EVERY_KIND_TEXT


def test_file_round_trip(tmp_path):
    path = tmp_path / "t.ltt"
    trace_text.write_trace(_every_kind_trace(), path)
    assert path.read_bytes() == EVERY_KIND_TEXT.encode("utf-8")
    assert trace_text.read_trace(path) == _every_kind_trace()


def test_spec_example_without_annotations():
    # The example of docs/formats.md without its annotations; its trailer
    # there says `end 8` for 7 event lines, corrected here.
    text = """loom-trace 1
device 0
granularity 2097152
provenance "snapshot import of x.pickle"
events
ib 0
ph forward
me layers.0.moe dynamic
a 17 4096 s=0 d=0
f 17 s=0
mx layers.0.moe
ie 0
end 7
"""
    trace = trace_text.parse_trace(text)
    assert trace.provenance == "snapshot import of x.pickle"
    assert trace.events[3] == Event.alloc(17, 4096)
    assert [e.kind for e in trace.events] == [
        "iter_begin", "phase", "module_enter", "alloc", "free", "module_exit",
        "iter_end"]
    # Written back, zero options are omitted.
    assert "a 17 4096\nf 17\n" in trace_text.format_trace(trace)


def test_lenient_parts():
    text = ("# a comment before the magic\r\n\r\nloom-trace 1\r\ndevice -1\n"
            "granularity 0\n  # indented comment\nprovenance \"\"\nevents\n"
            "a 1 10 d=2 s=5\n\t a\t2  20 \n\nme \"x\\x41\"\nend 3\n"
            "# trailing comment\n\n")
    trace = trace_text.parse_trace(text)
    assert trace.device == -1
    assert trace.events == [Event.alloc(1, 10, stream=5, device=2),
                            Event.alloc(2, 20),
                            Event(trace_text.MODULE_ENTER, name="xA")]


HEADER = "loom-trace 1\ndevice 0\ngranularity 0\nprovenance \"p\"\nevents\n"

BAD_INPUTS = [
    ("", "t.ltt:1: empty file (no 'loom-trace 1' line)"),
    ("loom-trace\n", "t.ltt:1: not a loom text trace: expected "
     "'loom-trace 1' as the first line"),
    ("loomtrace 1\n", "t.ltt:1: not a loom text trace: expected "
     "'loom-trace 1' as the first line"),
    ("loom-trace 2\n", "t.ltt:1: unsupported trace version 2 (this reader "
     "knows 1)"),
    ("loom-trace 1\ngranularity 0\n", "t.ltt:2: expected the 'device' header "
     "line, got 'granularity'"),
    ("loom-trace 1\ndevice 0\ngranularity 0\nevents\n", "t.ltt:4: expected "
     "the 'provenance' header line, got 'events'"),
    ("loom-trace 1\ndevice 0\n", "t.ltt:2: header ends early: missing "
     "'granularity' line"),
    ("loom-trace 1\ndevice -2\n", "t.ltt:2: header device '-2' is not an "
     "unsigned decimal number"),
    ("loom-trace 1\ndevice 32768\n", "t.ltt:2: header device 32768 out of "
     "range (0..32767)"),
    ("loom-trace 1\ndevice 0\ngranularity 0\nprovenance p\n", "t.ltt:4: "
     "provenance must be a quoted string"),
    ("loom-trace 1\ndevice 0\ngranularity +5\n", "t.ltt:3: granularity '+5' "
     "is not an unsigned decimal number"),
    (HEADER + "x 1\n", "t.ltt:6: unknown keyword 'x'"),
    (HEADER + "a 1 0\n", "t.ltt:6: size 0 out of range (1..1125899906842624)"),
    (HEADER + "a 1 1125899906842625\n", "t.ltt:6: size 1125899906842625 out "
     "of range (1..1125899906842624)"),
    (HEADER + "a 18446744073709551616 1\n", "t.ltt:6: request id "
     "18446744073709551616 out of range (0..18446744073709551615)"),
    (HEADER + "a 1 1 d=-1\n", "t.ltt:6: device '-1' is not an unsigned "
     "decimal number"),
    (HEADER + "a 1 1 d=40000\n", "t.ltt:6: device 40000 out of range "
     "(0..32767)"),
    (HEADER + "a 1 1 s=1 s=2\n", "t.ltt:6: s= given twice"),
    (HEADER + "a 1 1 x=1\n", "t.ltt:6: unexpected 'x=1' after 'a' (expected "
     "s=STREAM or d=DEVICE)"),
    (HEADER + "a 1\n", "t.ltt:6: alloc needs a request id and a size"),
    (HEADER + "a 1x 5\n", "t.ltt:6: request id '1x' is not an unsigned "
     "decimal number"),
    (HEADER + "a 1 5\na 1 6\n", "t.ltt:7: alloc of request 1, which is "
     "already live"),
    (HEADER + "f 1\n", "t.ltt:6: free of request 1, which is not live"),
    (HEADER + "a 1 5\nf 1\nf 1\n", "t.ltt:8: free of request 1, which is "
     "not live"),
    (HEADER + "mx m\n", "t.ltt:6: exit of module 'm', but no module is open"),
    (HEADER + "me a\nme b\nmx a\n", "t.ltt:8: exit of module 'a' while 'b' "
     "is the innermost open module"),
    (HEADER + "me a static\n", "t.ltt:6: unexpected 'static' after the "
     "module name (expected 'dynamic')"),
    (HEADER + "ph a b\n", "t.ltt:6: 'ph' needs exactly one name"),
    (HEADER + "ph \"a\\q\"\n", "t.ltt:6: unknown escape '\\q' in quoted "
     "string"),
    (HEADER + "ph \"a\n", "t.ltt:6: unterminated quoted string"),
    (HEADER + "ph \"\\x4\"\n", "t.ltt:6: \\x escape needs two hex digits"),
    (HEADER + "ph \"\\xff\"\n", "t.ltt:6: quoted string is not valid UTF-8"),
    (HEADER + "ph a\"b\n", "t.ltt:6: unexpected '\"' in token 'a\"b' "
     "(quote the name)"),
    (HEADER + "ph \"a\"b\n", "t.ltt:6: quoted string must be followed by a "
     "space"),
    (HEADER + "ib\n", "t.ltt:6: 'ib' needs exactly one iteration number"),
    (HEADER + "a 1 5\n", "t.ltt:6: truncated: no 'end' trailer after 1 "
     "events"),
    (HEADER + "a 1 5\nend 2\n", "t.ltt:7: trailer says 2 events, the file "
     "has 1"),
    (HEADER + "end\n", "t.ltt:6: 'end' needs exactly the event count"),
    (HEADER + "end 0\na 1 5\n", "t.ltt:7: content after the 'end' trailer "
     "(line 6)"),
    (HEADER + "end 0\nend 0\n", "t.ltt:7: content after the 'end' trailer "
     "(line 6)"),
    (HEADER + "a 1 " + "9" * 40 + "\n", "t.ltt:6: size "
     "9999999999999999999999999... out of range (1..1125899906842624)"),
]


@pytest.mark.parametrize("text,message", BAD_INPUTS)
def test_bad_input_is_rejected_with_file_line_and_reason(text, message):
    with pytest.raises(TraceError) as error:
        trace_text.parse_trace(text, "t.ltt")
    assert str(error.value) == message


def test_truncation_at_every_line_is_reported():
    lines = EVERY_KIND_TEXT.splitlines(keepends=True)
    for cut in range(len(lines)):
        with pytest.raises(TraceError):
            trace_text.parse_trace("".join(lines[:cut]), "t.ltt")


def test_read_trace_reports_bad_utf8_and_missing_file(tmp_path):
    path = tmp_path / "bad.ltt"
    path.write_bytes(HEADER.encode() + b"ph \xff\n")
    with pytest.raises(TraceError, match=r"bad.ltt:6: not valid UTF-8 "
                       r"\(byte offset 61\)"):
        trace_text.read_trace(path)
    with pytest.raises(TraceError, match="missing.ltt: cannot read"):
        trace_text.read_trace(tmp_path / "missing.ltt")


@pytest.mark.parametrize("events,message", [
    ([Event.alloc(1, 0)], "event 0: alloc size 0 out of range"),
    ([Event.alloc(1, 5), Event.alloc(1, 5)],
     "event 1: alloc of request 1, which is already live"),
    ([Event.free(4)], "event 0: free of request 4, which is not live"),
    ([Event.alloc(1, 5, stream=-1)], "event 0: stream -1 out of range"),
    ([Event.alloc(1, 5, device=-1)], "event 0: device -1 out of range"),
    ([Event(trace_text.MODULE_EXIT, name="m")],
     "event 0: exit of module 'm', but no module is open"),
    ([Event("bogus")], "event 0: unknown event kind 'bogus'"),
])
def test_writer_refuses_invalid_traces(events, message):
    with pytest.raises(TraceError, match=message):
        trace_text.format_trace(Trace(events=events))


def test_writer_refuses_bad_header():
    with pytest.raises(TraceError, match="header device -2 out of range"):
        trace_text.format_trace(Trace(device=-2))


def test_names_are_quoted_only_when_needed():
    assert trace_text.format_name("layers.0.attn") == "layers.0.attn"
    assert trace_text.format_name("#x") == "#x"
    assert trace_text.format_name("") == '""'
    assert trace_text.format_name("a b") == '"a b"'
    assert trace_text.format_name("a\tb\nc") == '"a\\tb\\nc"'
    assert trace_text.format_name("\x00") == '"\\x00"'
