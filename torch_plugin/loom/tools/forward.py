"""Running loom_tool for the subcommands the command line forwards to it
(info, analyze, plan, compare, ...), PyTorch snapshot arguments converted to
loom traces first (loom.tools.snapshot_cli).

When a snapshot was converted, loom_tool reads a temporary trace, and what
it prints would name that file (deleted when the command ends): its output
is relayed with each temporary path replaced by the path the user gave
(JSON-escaped under --json). Without conversions the tool writes to the
terminal directly."""

import json
import os
import subprocess
import sys
import threading

from loom import _paths


def run_tool(args, display_names=None):
    """Runs loom_tool with `args`; returns its exit code. `display_names`
    maps paths in `args` to the names its output should show instead."""
    try:
        tool = _paths.loom_tool()
    except _paths.NotBuiltError as error:
        print(f"loom: {error}", file=sys.stderr)
        return 1
    if not display_names:
        return subprocess.call([str(tool), *args])
    json_output = "--json" in args
    with subprocess.Popen([str(tool), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as child:
        relays = [
            threading.Thread(target=_relay, args=(
                child.stdout, sys.stdout, _replacements(display_names,
                                                        json_output))),
            threading.Thread(target=_relay, args=(
                child.stderr, sys.stderr, _replacements(display_names,
                                                        False)))]
        for relay in relays:
            relay.start()
        for relay in relays:
            relay.join()
        return child.wait()


def _replacements(display_names, json_output):
    """[(bytes shown by the tool, bytes to show)], longest first."""
    pairs = []
    for path, name in display_names.items():
        shown = json.dumps(name, ensure_ascii=False)[1:-1] if json_output \
            else name
        pairs.append((os.fsencode(path), os.fsencode(shown)))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def _relay(source, target, replacements):
    """Copies `source` (a binary pipe) to the text stream `target` as it
    comes, with the replacements made. Bytes that may begin a path to
    replace are held back until the next read tells."""
    out = getattr(target, "buffer", None)
    pending = b""
    while True:
        chunk = source.read1(65536) if hasattr(source, "read1") else \
            source.read(65536)
        pending += chunk
        for old, new in replacements:
            pending = pending.replace(old, new)
        keep = 0 if not chunk else _held_back(pending, replacements)
        ready, pending = pending[:len(pending) - keep], pending[
            len(pending) - keep:]
        if ready:
            if out is not None:
                target.flush()
                out.write(ready)
                out.flush()
            else:
                target.write(ready.decode(errors="replace"))
                target.flush()
        if not chunk:
            return


def _held_back(data, replacements):
    """The length of the longest end of `data` that begins a path to
    replace."""
    longest = 0
    for old, _ in replacements:
        for size in range(min(len(old) - 1, len(data)), longest, -1):
            if old.startswith(data[len(data) - size:]):
                longest = size
                break
    return longest


def capture_tool(args, timeout=None):
    """Runs loom_tool with `args`, capturing its output: the
    CompletedProcess (text). Raises _paths.NotBuiltError when loom_tool
    is not built."""
    return subprocess.run([str(_paths.loom_tool()), *args],
                          capture_output=True, text=True, check=False,
                          timeout=timeout)


def run_forwarded(command, args):
    """Runs loom_tool `command`, snapshot arguments converted first; the
    output names the snapshots as the user gave them."""
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import snapshot_cli
    try:
        with snapshot_cli.converted_snapshot_args(args) as converted:
            extra = []
            if command == "plan" and len(converted.originals) == 1 and \
                    not any(a == "--source" or a.startswith("--source=")
                            for a in converted):
                # The plan file records the snapshot, not the temporary
                # trace, as its source.
                extra = ["--source", *converted.originals.values()]
            return run_tool([command, *converted, *extra],
                            converted.originals)
    except snapshot_cli.UsageError as error:
        print(f"loom {command}: {error}", file=sys.stderr)
        return 2
    except snapshot_cli.ConversionError as error:
        print(f"loom {command}: {error}", file=sys.stderr)
        return 1
