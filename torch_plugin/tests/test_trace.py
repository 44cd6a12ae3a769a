"""loom.tools.trace: the Python model of a trace, read, checked and written
by libloom's trace handles (no parser or formatter in Python). Every error
is libloom's, as a TraceError naming the file and line or offset, or the
event by its index."""

import re

import pytest

from loom import _native
from loom.tools import trace as loom_trace
from loom.tools.trace import Event, Trace, TraceError

U64 = (1 << 64) - 1

# Names that need quoting in the text form, and a module named like the
# `dynamic` keyword.
ODD_NAMES = ["two words", 'q"\\\x01\x7fé', "", "#x", "tab\there",
             "line\nbreak", "ünïcödé ✓"]


@pytest.fixture(autouse=True)
def _libloom(libloom):  # every test here needs libloom (fails without it)
    return libloom


def _every_kind_trace():
    return Trace(device=3, granularity=2097152,
                 provenance='unit test "x"\\y\n\tz',
                 events=[
                     Event(loom_trace.ITER_BEGIN, id=0),
                     Event(loom_trace.PHASE, name="forward"),
                     Event(loom_trace.MODULE_ENTER, name="layers.0.moe",
                           dynamic=True),
                     Event.alloc(17, 4096),
                     Event.alloc(18, 1, stream=7, device=3),
                     Event.free(17, stream=7),
                     Event(loom_trace.MODULE_EXIT, name="layers.0.moe"),
                     Event(loom_trace.MODULE_ENTER, name="two words"),
                     Event(loom_trace.MODULE_ENTER, name="dynamic"),
                     Event(loom_trace.MODULE_EXIT, name="dynamic"),
                     Event(loom_trace.MODULE_EXIT, name="two words"),
                     Event(loom_trace.PHASE, name='q"\\\x01\x7fé'),
                     Event(loom_trace.PHASE, name=""),
                     Event.free(18, device=3),
                     Event.alloc(17, 1 << 50, stream=U64),
                     Event(loom_trace.ITER_END, id=0),
                     Event(loom_trace.ITER_BEGIN, id=U64),
                 ])


# What libloom's text writer makes of it (docs/formats.md): names quoted
# only when needed, zero s=/d= left out.
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
ph "q\"\\\x01\x7f\xc3\xa9"
ph ""
f 18 d=3
a 17 1125899906842624 s=18446744073709551615
ie 0
ib 18446744073709551615
end 17
'''


@pytest.mark.parametrize("suffix", [".ltt", ".ltb"])
def test_round_trip_in_both_forms(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    loom_trace.write_trace(_every_kind_trace(), path)
    back = loom_trace.read_trace(path)
    assert back == _every_kind_trace()
    assert back.names == ["forward", "layers.0.moe", "two words", "dynamic",
                          'q"\\\x01\x7fé', ""]


def test_text_form_is_libloom_s(tmp_path):
    path = tmp_path / "t.ltt"
    loom_trace.write_trace(_every_kind_trace(), path)
    assert path.read_text(encoding="utf-8") == EVERY_KIND_TEXT


def test_files_read_and_written_again_are_identical(tmp_path):
    first = tmp_path / "a.ltb"
    loom_trace.write_trace(_every_kind_trace(), first)
    text = tmp_path / "b.ltt"
    loom_trace.write_trace(loom_trace.read_trace(first), text)
    second = tmp_path / "c.ltb"
    loom_trace.write_trace(loom_trace.read_trace(text), second)
    assert first.read_bytes() == second.read_bytes()
    assert text.read_text() == EVERY_KIND_TEXT


@pytest.mark.parametrize("suffix", [".ltt", ".ltb"])
def test_names_needing_quotes_and_unused_names_survive(tmp_path, suffix):
    events = []
    for name in ODD_NAMES:
        events += [Event(loom_trace.MODULE_ENTER, name=name),
                   Event(loom_trace.PHASE, name=name),
                   Event(loom_trace.MODULE_EXIT, name=name)]
    # A name table with names no event uses, in an order that is not the
    # order of first use: kept through both forms.
    table = ["never used", "ünïcödé ✓", "also unused"]
    trace = Trace(provenance="names ✓", events=events, names=table)
    path = tmp_path / f"n{suffix}"
    loom_trace.write_trace(trace, path)
    back = loom_trace.read_trace(path)
    assert back == trace
    assert [e.name for e in back.events] == [e.name for e in events]
    assert back.names[:3] == table
    assert set(back.names) == set(table) | set(ODD_NAMES)
    if suffix == ".ltt":
        text = path.read_text(encoding="utf-8")
        assert 'me "two words"\n' in text and 'ph "line\\nbreak"\n' in text
        assert 'name "never used"\n' in text


def test_validate_accepts_a_good_trace():
    loom_trace.validate_trace(_every_kind_trace())
    loom_trace.validate_trace(Trace())


# (events, libloom's message): each names the first bad event by index.
BAD_EVENTS = [
    ([Event.alloc(1, 0)], "event 0: alloc of request 1 has size 0"),
    ([Event.alloc(1, (1 << 50) + 1)],
     "event 0: alloc of request 1 has size 1125899906842625 above 2^50"),
    ([Event.alloc(1, 5), Event.alloc(1, 5)],
     "event 1: alloc of request 1 which is already live"),
    ([Event.alloc(1, 5), Event.free(1), Event.free(1)],
     "event 2: free of request 1 which is not live"),
    ([Event.free(4)], "event 0: free of request 4 which is not live"),
    ([Event(loom_trace.MODULE_EXIT, name="m")],
     "event 0: exit of module 'm' with no open module"),
    ([Event(loom_trace.MODULE_ENTER, name="a"),
      Event(loom_trace.MODULE_ENTER, name="b"),
      Event(loom_trace.MODULE_EXIT, name="a")],
     "event 2: exit of module 'a' while module 'b' is the innermost open "
     "one"),
    ([Event(loom_trace.ITER_END, id=3)],
     "event 0: end of iteration 3 with no open iteration"),
    ([Event(loom_trace.ITER_BEGIN, id=1), Event(loom_trace.ITER_END, id=2)],
     "event 1: end of iteration 2 while iteration 1 is open"),
    ([Event.alloc(1, 5), Event(loom_trace.PHASE, name="x", id=3)],
     "event 1: phase event with a non-zero 'id' field"),
    ([Event(loom_trace.ALLOC, id=2, size=4, name="x")],
     "event 0: alloc event with a non-zero 'name' field"),
    ([Event.alloc(1, 5), Event(loom_trace.FREE, id=1, dynamic=True)],
     "event 1: free event with a non-zero 'flags' field"),
    ([Event(loom_trace.ITER_BEGIN, id=0, stream=2)],
     "event 0: iter_begin event with a non-zero 'stream' field"),
    ([Event.alloc(1, 5, device=40000)],
     "event 0: flags 0, device 40000 or name 0 out of range"),
    ([Event.alloc(1, 5), Event(loom_trace.PHASE, name="n" * 5000)],
     "event 1: name of 5000 bytes above the limit 4096"),
    # Values the records cannot hold are refused before libloom sees them.
    ([Event.alloc(1, 5, stream=-1)],
     "event 0: stream -1 out of range (an unsigned 64-bit integer)"),
    ([Event.alloc(1, 5, device=-1)],
     "event 0: device -1 out of range (an unsigned 64-bit integer)"),
    ([Event.alloc(U64 + 1, 5)],
     "event 0: id 18446744073709551616 out of range"),
    ([Event.alloc(1, 5), Event("bogus")],
     "event 1: unknown event kind 'bogus'"),
    ([Event(loom_trace.PHASE, name="a\0b")],
     "event 0: name 'a\\x00b' contains a NUL character"),
]


@pytest.mark.parametrize("events,message", BAD_EVENTS,
                         ids=[m.split(": ", 1)[1][:40] for _, m in BAD_EVENTS])
def test_every_error_is_a_trace_error_naming_the_event(tmp_path, events,
                                                       message):
    trace = Trace(events=events)
    with pytest.raises(TraceError) as error:
        loom_trace.validate_trace(trace)
    assert str(error.value).startswith(message)
    path = tmp_path / "bad.ltt"
    with pytest.raises(TraceError) as error:
        loom_trace.write_trace(trace, path)
    assert str(error.value).startswith(message)
    assert not path.exists()  # checked before anything is written


@pytest.mark.parametrize("trace,message", [
    (Trace(device=-2), "header device -2 outside -1..32767"),
    (Trace(device=32768), "header device 32768 outside -1..32767"),
    (Trace(granularity=1 << 51), "granularity 2251799813685248 above the "
     "limit 2^50"),
    (Trace(provenance="p" * 70000), "provenance of 70000 bytes above the "
     "limit 65536"),
    (Trace(device="0"), "header device '0' is not an integer"),
])
def test_bad_headers_are_trace_errors(trace, message):
    with pytest.raises(TraceError) as error:
        loom_trace.validate_trace(trace)
    assert str(error.value) == message


HEADER = "loom-trace 1\ndevice 0\ngranularity 0\nprovenance \"p\"\nevents\n"


@pytest.mark.parametrize("text,message", [
    ("", "t.ltt: empty file: not a loom trace (no 'loom-trace 1' line)"),
    ("loom-trace 2\n", "t.ltt:1: unsupported text trace version 2"),
    (HEADER + "x 1\n", "t.ltt:6: unknown keyword 'x'"),
    (HEADER + "a 1 5\na 1 6\n", "t.ltt:7: alloc of request 1 which is "
     "already live"),
    (HEADER + "me a\nme b\nmx a\n", "t.ltt:8: exit of module 'a' while "
     "module 'b' is the innermost open one"),
    (HEADER + "ph \"a\n", "t.ltt:6: unterminated quoted string"),
    (HEADER + "a 1 5\nend 2\n", "t.ltt:7: trailer says 2 events but the "
     "file has 1"),
])
def test_bad_text_files_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "t.ltt"
    path.write_text(text)
    with pytest.raises(TraceError) as error:
        loom_trace.read_trace(path)
    assert str(error.value).startswith(str(tmp_path / message))


def test_truncated_files_are_reported(tmp_path):
    text = tmp_path / "t.ltt"
    loom_trace.write_trace(_every_kind_trace(), text)
    lines = text.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.ltt"
    for keep in range(len(lines)):
        cut.write_text("".join(lines[:keep]))
        with pytest.raises(TraceError, match="^" + re.escape(str(cut))):
            loom_trace.read_trace(cut)
    binary = tmp_path / "t.ltb"
    loom_trace.write_trace(_every_kind_trace(), binary)
    data = binary.read_bytes()
    short = tmp_path / "cut.ltb"
    for keep in range(len(data)):
        short.write_bytes(data[:keep])
        with pytest.raises(TraceError, match="^" + re.escape(str(short))):
            loom_trace.read_trace(short)
    short.write_bytes(data[:len(data) // 2])
    with pytest.raises(TraceError, match=r"cut.ltb: offset \d+: truncated"):
        loom_trace.read_trace(short)


def test_a_plan_file_is_not_a_trace(tmp_path):
    trace = tmp_path / "t.ltb"
    loom_trace.write_trace(Trace(events=[
        Event(loom_trace.ITER_BEGIN, id=0), Event.alloc(1, 4096),
        Event.alloc(2, 512), Event.free(1), Event.free(2),
        Event(loom_trace.ITER_END, id=0)]), trace)
    plan = tmp_path / "p.lplan"
    _native.load().plan_trace(trace, plan, {"time_limit": 1})
    assert plan.read_bytes()[:8] == b"LOOMPLAN"
    with pytest.raises(TraceError, match="^" + re.escape(f"{plan}:1: ")):
        loom_trace.read_trace(plan)


def test_missing_and_unwritable_files(tmp_path):
    with pytest.raises(TraceError, match=r"missing.ltt: cannot open: No such "
                       r"file or directory"):
        loom_trace.read_trace(tmp_path / "missing.ltt")
    with pytest.raises(TraceError, match="cannot create"):
        loom_trace.write_trace(Trace(), tmp_path / "no" / "dir.ltb")


def test_bytes_that_are_not_utf8_survive_a_round_trip(tmp_path):
    path = tmp_path / "raw.ltt"
    path.write_bytes(HEADER.encode() + b'ph "\\xff\\xfe"\nend 1\n')
    trace = loom_trace.read_trace(path)
    assert trace.events[0].name == "\udcff\udcfe"  # as os.fsdecode would
    again = tmp_path / "again.ltt"
    loom_trace.write_trace(trace, again)
    assert again.read_bytes() == path.read_bytes()
