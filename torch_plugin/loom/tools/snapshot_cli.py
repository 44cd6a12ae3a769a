"""Command-line side of snapshot import/export (loom trace files are read
and written by libloom, through loom.tools.trace).

  loom import <snapshot> -o out.ltt|out.ltb [--device N] [--json]
  loom export-snapshot <trace> -o out.pickle [--offsets plan.csv]
                       [--segments alloc|map] [--granularity BYTES] [--json]

Each prints one summary line of what it wrote, or with --json that summary
as a JSON object.

and the hook `converted_snapshot_args` that lets every subcommand forwarded
to loom_tool take a snapshot pickle wherever it takes a trace: positional
arguments that are snapshot pickles (by content: a pickle protocol header)
are imported to temporary `.ltt` files first. Values of output options
(`-o`, `--output`, `--out`) are never touched. `--snapshot-device N` picks
the device and is consumed here.
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile

from loom.errors import LoomError
from loom.tools import snapshot_export
from loom.tools import snapshot_import
from loom.tools import trace as loom_trace
from loom.tools.snapshot import SnapshotError
from loom.tools.snapshot import is_snapshot_file

OUTPUT_OPTIONS = ("-o", "--output", "--out")
DEVICE_OPTION = "--snapshot-device"


class UsageError(Exception):
    """Bad command-line arguments (exit status 2)."""


class ConversionError(Exception):
    """A snapshot argument could not be converted (exit status 1)."""


def _device_value(text):
    if not text.isdigit() or not text.isascii() or int(text) > 32767:
        raise UsageError(f"{DEVICE_OPTION} needs a device number 0..32767, "
                         f"got {text!r}")
    return int(text)


def split_snapshot_args(args):
    """Takes `--snapshot-device N` out of `args`. Returns (the other args,
    device or None, indices of the positional candidates)."""
    rest, device, candidates = [], None, []
    index, positional_only, after_output = 0, False, False
    while index < len(args):
        arg = args[index]
        index += 1
        if not positional_only and (arg == DEVICE_OPTION or
                                    arg.startswith(DEVICE_OPTION + "=")):
            if arg == DEVICE_OPTION:
                if index == len(args):
                    raise UsageError(f"{DEVICE_OPTION} needs a value")
                value = args[index]
                index += 1
            else:
                value = arg[len(DEVICE_OPTION) + 1:]
            device = _device_value(value)
            continue
        if not positional_only and arg == "--":
            positional_only = True
        elif after_output:
            after_output = False
        elif not positional_only and arg in OUTPUT_OPTIONS:
            after_output = True
        elif positional_only or not arg.startswith("-"):
            candidates.append(len(rest))
        rest.append(arg)
    return rest, device, candidates


class ConvertedArgs(list):
    """The arguments with snapshots replaced; `.originals` maps each
    temporary trace's path to the snapshot path the user gave (for output
    that names the input: loom.tools.forward prints the user's path)."""

    def __init__(self, args, originals=None):
        super().__init__(args)
        self.originals = dict(originals or {})


@contextlib.contextmanager
def converted_snapshot_args(args):
    """Yields `args` (a ConvertedArgs) with each snapshot pickle argument
    replaced by a temporary loom text trace (removed on exit). Raises
    UsageError or ConversionError (one line, naming the file)."""
    rest, device, candidates = split_snapshot_args(args)
    snapshots = [i for i in candidates if os.path.isfile(rest[i]) and
                 is_snapshot_file(rest[i])]
    if not snapshots:
        if device is not None:
            raise UsageError(f"{DEVICE_OPTION} given, but no argument is a "
                             f"PyTorch memory snapshot")
        yield ConvertedArgs(rest)
        return
    with tempfile.TemporaryDirectory(prefix="loom-snapshot-") as tmp:
        used, originals = set(), {}
        for i in snapshots:
            stem = os.path.splitext(os.path.basename(rest[i]))[0] or "snapshot"
            name, n = stem, 1
            while name in used:
                n += 1
                name = f"{stem}-{n}"
            used.add(name)
            out = os.path.join(tmp, name + ".ltt")
            try:
                result = snapshot_import.import_snapshot(rest[i], device)
                loom_trace.write_trace(result.trace, out)
            except (SnapshotError, loom_trace.TraceError, LoomError) as error:
                raise ConversionError(str(error)) from None
            except OSError as error:
                raise ConversionError(f"{out}: cannot write: "
                                      f"{error.strerror}") from None
            originals[out] = rest[i]
            rest[i] = out
        yield ConvertedArgs(rest, originals)


def _parser(prog, description):
    return argparse.ArgumentParser(prog=prog, description=description,
                                   allow_abbrev=False)


def _parse(parser, argv):
    """(args, None), or (None, exit status) after --help or a usage error
    (argparse has printed the message)."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as done:
        return None, done.code if isinstance(done.code, int) else 2


def run_import(argv):
    """`loom import`; returns the exit status."""
    parser = _parser(
        "loom import",
        "Converts a PyTorch memory snapshot (torch.cuda.memory."
        "_dump_snapshot pickle) to a loom trace. The pickle is loaded "
        "with a restricted unpickler (plain data only). Blocks allocated "
        "before recording started become allocs at the start of the trace.")
    parser.add_argument("snapshot", help="snapshot pickle")
    parser.add_argument("-o", "--output", required=True,
                        help="loom trace to write (text for a .ltt name, "
                        "else binary)")
    parser.add_argument("--device", type=_checked_int, default=None,
                        help="device to import (default: the one with the "
                        "most trace entries)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON")
    args, status = _parse(parser, argv)
    if args is None:
        return status
    try:
        result = snapshot_import.import_snapshot(args.snapshot, args.device)
        loom_trace.write_trace(result.trace, args.output)
    except (SnapshotError, loom_trace.TraceError, LoomError) as error:
        print(f"loom import: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"loom import: {args.output}: cannot write: {error.strerror}",
              file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"loom import: warning: {warning}", file=sys.stderr)
    allocs = sum(1 for e in result.trace.events if e.kind == loom_trace.ALLOC)
    frees = len(result.trace.events) - allocs
    if args.json:
        print(json.dumps({
            "output": args.output, "device": result.device,
            "allocs": allocs, "frees": frees,
            "preexisting_freed": result.preexisting_freed,
            "preexisting_live": result.preexisting_live,
            "peak_live_bytes": result.peak_live_bytes,
            "snapshot_entries": dict(sorted(result.counts.items())),
            "warnings": list(result.warnings)}, indent=2))
        return 0
    counts = ", ".join(f"{action} {n}" for action, n in
                       sorted(result.counts.items()))
    print(f"{args.output}: device {result.device}, {allocs} allocs "
          f"({result.preexisting_freed + result.preexisting_live} made before "
          f"recording: {result.preexisting_freed} freed later, "
          f"{result.preexisting_live} never freed), {frees} frees, peak live "
          f"{result.peak_live_bytes} bytes; snapshot entries: "
          f"{counts or 'none'}")
    return 0


def _checked_int(text):
    if not text.isdigit() or not text.isascii() or len(text) > 20:
        raise argparse.ArgumentTypeError(f"not a non-negative integer: "
                                         f"{text!r}")
    return int(text)


def run_export(argv):
    """`loom export-snapshot`; returns the exit status."""
    parser = _parser(
        "loom export-snapshot",
        "Writes a loom trace as a PyTorch memory snapshot pickle that "
        "pytorch.org/memory_viz opens. Block addresses come from a plan's "
        "offsets CSV, or from a first-fit placement.")
    parser.add_argument("trace", help="loom trace (text .ltt or binary)")
    parser.add_argument("-o", "--output", required=True,
                        help="snapshot pickle to write")
    parser.add_argument("--offsets", metavar="PLAN_CSV",
                        help="offsets CSV (id,lower,upper,size,offset; ids "
                        "are request ids) giving each request's address")
    parser.add_argument("--segments", choices=("alloc", "map"),
                        default="alloc",
                        help="segment entries: 'alloc' (one segment_alloc "
                        "per segment, default) or 'map' (segment_map per "
                        "newly touched granule run, like expandable "
                        "segments)")
    parser.add_argument("--granularity", type=_checked_int, default=None,
                        help="segment granule in bytes (default: the "
                        "trace's, else 2 MiB)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON")
    args, status = _parse(parser, argv)
    if args is None:
        return status
    if args.granularity == 0:
        print("loom export-snapshot: --granularity must be positive",
              file=sys.stderr)
        return 2
    try:
        trace = loom_trace.read_trace(args.trace)
        addresses = None
        if args.offsets:
            plan = snapshot_export.read_offsets_csv(args.offsets)
            addresses = snapshot_export.addresses_from_plan(trace, plan,
                                                            args.offsets)
        snapshot = snapshot_export.export_snapshot(
            trace, args.output, addresses, args.granularity, args.segments)
    except (loom_trace.TraceError, snapshot_export.ExportError,
            LoomError) as error:
        print(f"loom export-snapshot: {error}", file=sys.stderr)
        return 1
    reserved = sum(s["total_size"] for s in snapshot["segments"])
    entries = sum(len(t) for t in snapshot["device_traces"])
    if args.json:
        print(json.dumps({
            "output": args.output, "trace_entries": entries,
            "segments": len(snapshot["segments"]),
            "segment_bytes": reserved}, indent=2))
        return 0
    print(f"{args.output}: {entries} trace entries, "
          f"{len(snapshot['segments'])} segments, {reserved} bytes in "
          f"segments; open it at https://pytorch.org/memory_viz")
    return 0
