"""Running loom_tool for the subcommands the command line forwards to it
(info, analyze, plan, compare, ...), PyTorch snapshot arguments converted to
loom traces first (loom.tools.snapshot_cli)."""

import subprocess
import sys

from loom import _paths


def run_tool(args):
    """Runs loom_tool with `args`; returns its exit code."""
    try:
        tool = _paths.loom_tool()
    except _paths.NotBuiltError as error:
        print(f"loom: {error}", file=sys.stderr)
        return 1
    return subprocess.call([str(tool), *args])


def capture_tool(args, timeout=None):
    """Runs loom_tool with `args`, capturing its output: the
    CompletedProcess (text). Raises _paths.NotBuiltError when loom_tool
    is not built."""
    return subprocess.run([str(_paths.loom_tool()), *args],
                          capture_output=True, text=True, check=False,
                          timeout=timeout)


def run_forwarded(command, args):
    """Runs loom_tool `command`, snapshot arguments converted first."""
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import snapshot_cli
    try:
        with snapshot_cli.converted_snapshot_args(args) as converted:
            return run_tool([command, *converted])
    except snapshot_cli.UsageError as error:
        print(f"loom {command}: {error}", file=sys.stderr)
        return 2
    except snapshot_cli.ConversionError as error:
        print(f"loom {command}: {error}", file=sys.stderr)
        return 1
