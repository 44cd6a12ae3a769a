"""`loom import`, `loom export-snapshot` and the snapshot hook for
subcommands forwarded to loom_tool (exercised with a stand-in tool)."""

import io
import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import snapshot_factory as sf
from loom.tools import cli
from loom.tools import forward
from loom.tools import snapshot_cli
from loom.tools import trace as loom_trace
from test_snapshot_import import EXPECTED_TEXT, _scenario

PLUGIN_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture
def snap(tmp_path):
    return sf.write(tmp_path / "a.pickle", _scenario())


def test_import_help(capsys):
    assert cli.main(["import", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: loom import [-h] -o OUTPUT [--device "
                          "DEVICE] [--json] snapshot")


def test_import_writes_the_trace(snap, tmp_path, capsys):
    out = tmp_path / "a.ltt"
    assert cli.main(["import", str(snap), "-o", str(out)]) == 0
    assert out.read_text() == EXPECTED_TEXT
    captured = capsys.readouterr()
    assert captured.out == (
        f"{out}: device 0, 8 allocs (3 made before recording: 2 freed later, "
        f"1 never freed), 4 frees, peak live 496 bytes; snapshot entries: "
        f"alloc 5, free_completed 4, free_requested 2, mystery 1, oom 1, "
        f"segment_alloc 1, snapshot 1\n")
    assert captured.err == ""


def test_import_json_is_the_summary(snap, tmp_path, capsys):
    out = tmp_path / "a.ltb"
    assert cli.main(["import", str(snap), "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "output": str(out), "device": 0, "allocs": 8, "frees": 4,
        "preexisting_freed": 2, "preexisting_live": 1, "peak_live_bytes": 496,
        "snapshot_entries": {"alloc": 5, "free_completed": 4,
                             "free_requested": 2, "mystery": 1, "oom": 1,
                             "segment_alloc": 1, "snapshot": 1},
        "warnings": []}
    assert loom_trace.read_trace(out).device == 0


def test_import_device_option(snap, tmp_path):
    out = tmp_path / "a1.ltt"
    assert cli.main(["import", str(snap), "-o", str(out), "--device", "1"]) == 0
    assert loom_trace.read_trace(out).device == 1


@pytest.mark.parametrize("make,message", [
    (lambda p: p, "loom import: {p}: cannot read: No such file or directory"),
    (lambda p: p.write_bytes(sf.dumps(_scenario())[:100]) and p,
     "loom import: {p}: not a readable pickle: the data ends early "
     "(truncated file)"),
    (lambda p: p.write_bytes(pickle.dumps(os.system)) and p,
     "loom import: {p}: refused global 'posix.system': a memory snapshot "
     "holds plain data only, so this file is not one (or was tampered with); "
     "it is not loaded"),
])
def test_import_errors_are_one_line(tmp_path, capsys, make, message):
    path = make(tmp_path / "bad.pickle")
    assert cli.main(["import", str(path), "-o", str(tmp_path / "o.ltt")]) == 1
    captured = capsys.readouterr()
    assert captured.err == message.format(p=path) + "\n"
    assert not (tmp_path / "o.ltt").exists()


def test_import_usage_errors(snap, capsys):
    assert cli.main(["import", str(snap)]) == 2
    assert "the following arguments are required: -o/--output" in \
        capsys.readouterr().err
    assert cli.main(["import", str(snap), "-o", "x", "--device", "-1"]) == 2


def test_import_unwritable_output(snap, tmp_path, capsys):
    out = tmp_path / "missing" / "a.ltt"
    assert cli.main(["import", str(snap), "-o", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"loom import: {out}: cannot create: No such file or directory\n")


def test_export_snapshot_with_offsets(tmp_path, capsys):
    trace = tmp_path / "t.ltt"
    trace.write_text("loom-trace 1\ndevice 0\ngranularity 0\nprovenance \"\"\n"
                     "events\na 0 100\na 1 50\nf 0\nend 3\n")
    plan = tmp_path / "plan.csv"
    plan.write_text("id,lower,upper,size,offset\n0,0,2,100,0\n1,1,3,50,128\n")
    out = tmp_path / "t.pickle"
    assert cli.main(["export-snapshot", str(trace), "-o", str(out),
                     "--offsets", str(plan)]) == 0
    assert capsys.readouterr().out == (
        f"{out}: 5 trace entries, 1 segments, 2097152 bytes in segments; "
        f"open it at https://pytorch.org/memory_viz\n")
    exported = pickle.loads(out.read_bytes())
    assert [(e["action"], e["addr"]) for e in exported["device_traces"][0]] \
        == [("segment_alloc", 0), ("alloc", 0), ("alloc", 128),
            ("free_requested", 0), ("free_completed", 0)]
    assert cli.main(["export-snapshot", str(trace), "-o", str(out),
                     "--offsets", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "output": str(out), "trace_entries": 5, "segments": 1,
        "segment_bytes": 2097152}
    assert cli.main(["export-snapshot", str(trace), "-o", str(out),
                     "--segments", "map", "--granularity", "4096"]) == 0
    exported = pickle.loads(out.read_bytes())
    assert exported["device_traces"][0][0] == {
        "action": "segment_map", "addr": 0, "size": 4096, "stream": 0,
        "time_us": 0, "frames": []}


def test_export_snapshot_errors(tmp_path, capsys):
    trace = tmp_path / "t.ltt"
    trace.write_text("loom-trace 1\ndevice 0\n")
    out = tmp_path / "t.pickle"
    assert cli.main(["export-snapshot", str(trace), "-o", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"loom export-snapshot: {trace}:3: truncated: missing the "
        f"'granularity' header line\n")
    trace.write_text("loom-trace 1\ndevice 0\ngranularity 0\nprovenance \"\"\n"
                     "events\na 0 100\nend 1\n")
    plan = tmp_path / "plan.csv"
    plan.write_text("id,size,offset\n0,99,0\n")
    assert cli.main(["export-snapshot", str(trace), "-o", str(out),
                     "--offsets", str(plan)]) == 1
    assert capsys.readouterr().err == (
        f"loom export-snapshot: {plan}: id 0 has size 99, the trace's "
        f"request 0 has size 100\n")
    assert cli.main(["export-snapshot", str(trace), "-o", str(out),
                     "--granularity", "0"]) == 2
    assert not out.exists()


# ------------------------------------------------------ forwarded commands

def test_split_snapshot_args():
    split = snapshot_cli.split_snapshot_args
    assert split(["a", "-o", "b", "--snapshot-device", "3", "--json", "c"]) \
        == (["a", "-o", "b", "--json", "c"], 3, [0, 4])
    assert split(["--snapshot-device=2", "--out", "x", "--", "-y"]) == (
        ["--out", "x", "--", "-y"], 2, [3])
    with pytest.raises(snapshot_cli.UsageError, match="needs a value"):
        split(["--snapshot-device"])
    with pytest.raises(snapshot_cli.UsageError, match="got 'x'"):
        split(["--snapshot-device", "x"])


def test_snapshot_arguments_become_temporary_traces(snap, tmp_path):
    csv = tmp_path / "i.csv"
    csv.write_text("id,lower,upper,size\n")
    output = tmp_path / "out.pickle"  # an output option's value: untouched
    output.write_bytes(sf.dumps(_scenario()))
    args = [str(snap), "--json", str(csv), "-o", str(output)]
    with snapshot_cli.converted_snapshot_args(args) as converted:
        assert converted[1:] == args[1:]
        converted_path = Path(converted[0])
        assert converted_path.name == "a.ltt"
        assert converted_path.read_text() == EXPECTED_TEXT
    assert not converted_path.exists()
    assert args[0] == str(snap)  # the caller's list is not modified


def test_snapshot_device_picks_the_device(snap):
    with snapshot_cli.converted_snapshot_args(
            [str(snap), "--snapshot-device", "1", str(snap)]) as converted:
        assert len(converted) == 2 and converted[0] != converted[1]
        for path in converted:
            assert loom_trace.read_trace(path).device == 1


def test_hook_errors(snap, tmp_path):
    with pytest.raises(snapshot_cli.UsageError, match="no argument is a "
                       "PyTorch memory snapshot"):
        with snapshot_cli.converted_snapshot_args(["x", "--snapshot-device",
                                                   "0"]):
            pass
    with pytest.raises(snapshot_cli.ConversionError, match="device 5 is not "
                       r"in the snapshot \(devices: 0, 1\)"):
        with snapshot_cli.converted_snapshot_args([str(snap),
                                                   "--snapshot-device=5"]):
            pass
    broken = tmp_path / "broken.bin"
    broken.write_bytes(b"\x80\x04\x95garbage")
    with pytest.raises(snapshot_cli.ConversionError, match="broken.bin: not "
                       "a readable pickle"):
        with snapshot_cli.converted_snapshot_args([str(broken)]):
            pass


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    """A stand-in loom_tool that prints its arguments and, for each file
    argument, its first line."""
    tool = tmp_path / "fake_loom_tool"
    tool.write_text("#!/bin/sh\nfor a in \"$@\"; do echo \"arg $a\"; "
                    "if [ -f \"$a\" ]; then echo \"head $(head -n 1 \"$a\")\"; "
                    "fi; done\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("LOOM_TOOL", str(tool))
    monkeypatch.setitem(cli.FORWARDED, "analyze", "stand-in")
    return tool


def test_forwarded_subcommand_gets_a_trace(snap, fake_tool, capfd):
    """The tool reads a temporary trace (its first line is a trace's); what
    it prints names the snapshot as the user gave it, not the temporary
    file (deleted when the command ends)."""
    assert cli.main(["analyze", str(snap)]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines == ["arg analyze", f"arg {snap}", "head loom-trace 1"]


def test_forwarded_output_names_the_user_s_path_in_json_too(tmp_path,
                                                            fake_tool, capfd):
    odd = tmp_path / 'a "quoted" \\ name.pickle'
    sf.write(odd, _scenario())
    assert cli.main(["analyze", str(odd), "--json"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[1] == "arg " + json.dumps(str(odd))[1:-1]
    assert lines[2:] == ["head loom-trace 1", "arg --json"]


def test_the_relay_replaces_paths_split_across_reads():
    class Pipe:  # pylint: disable=too-few-public-methods
        def __init__(self, chunks):
            self.chunks = list(chunks)

        def read1(self, _):
            return self.chunks.pop(0) if self.chunks else b""

    out = io.StringIO()
    forward._relay(Pipe([b"input: /tmp/x/a", b".ltt and /tm", b"p/x/a.ltt\n",
                         b"done /tmp"]), out, [(b"/tmp/x/a.ltt", b"a.pickle")])
    assert out.getvalue() == "input: a.pickle and a.pickle\ndone /tmp"


def test_forwarded_subcommand_errors(tmp_path, fake_tool, capfd):
    broken = tmp_path / "b.pickle"
    broken.write_bytes(b"\x80\x04N.")
    assert cli.main(["analyze", str(broken)]) == 1
    captured = capfd.readouterr()
    assert captured.out == ""
    assert captured.err == (f"loom analyze: {broken}: top level is NoneType "
                            f"None, expected a dict with 'device_traces' and "
                            f"'segments' (a torch.cuda.memory._snapshot())\n")
    assert cli.main(["analyze", "x.ltt", "--snapshot-device", "0"]) == 2
    assert capfd.readouterr().err == (
        "loom analyze: --snapshot-device given, but no argument is a PyTorch "
        "memory snapshot\n")


def test_module_entry_point_imports(snap, tmp_path):
    out = tmp_path / "m.ltt"
    result = subprocess.run(
        [sys.executable, "-m", "loom", "import", str(snap), "-o", str(out)],
        cwd=PLUGIN_DIR, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == EXPECTED_TEXT
