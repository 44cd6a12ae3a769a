"""The `loom` command line (`./loom <subcommand>`, `python3 -m loom ...`).

Subcommands that compute (info, analyze, plan, ...) run in the C++ tool
loom_tool; this front end forwards them, after turning any PyTorch snapshot
argument into a loom trace. `setup` and `test` are handled by the ./loom
launcher script itself, since they must work before anything is built.
"""

import os
import subprocess
import sys

from loom import _paths

# name -> one-line summary. Forwarded verbatim to loom_tool.
FORWARDED = {
    "info": "backend, devices, granularity, total and free memory",
    "analyze": "lifetime classes, peaks and iterations of a trace or CSV",
}

# Subcommands that exist but whose work has not landed yet.
NOT_YET = {
    "demo": "compare allocators on the embedded workloads (table + plot)",
}

# Subcommands handled by the ./loom launcher script, listed for --help.
LAUNCHER_ONLY = {
    "setup": "install the Debian packages loom needs (idempotent)",
    "test": "run every test; ends with 'N passed, N failed'",
}


def usage():
    lines = ["usage: loom <subcommand> [options]", "", "subcommands:"]
    for name, summary in {**LAUNCHER_ONLY, **FORWARDED, **NOT_YET}.items():
        lines.append(f"  {name:<10} {summary}")
    lines += ["", "`loom <subcommand> --help` describes each one."]
    return "\n".join(lines) + "\n"


def run_tool(args):
    """Runs loom_tool with `args`; returns its exit code."""
    try:
        tool = _paths.loom_tool()
    except _paths.NotBuiltError as error:
        print(f"loom: {error}", file=sys.stderr)
        return 1
    return subprocess.call([str(tool), *args])


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in FORWARDED:
        return run_tool([command, *rest])
    if command in NOT_YET:
        print(f"loom {command}: not yet available", file=sys.stderr)
        return 1
    if command in LAUNCHER_ONLY:
        print(f"loom: '{command}' is run by the ./loom launcher in the "
              f"repository root", file=sys.stderr)
        return 2
    print(f"loom: unknown subcommand '{command}'\n", file=sys.stderr)
    sys.stderr.write(usage())
    return 2


if __name__ == "__main__":
    sys.exit(main())
