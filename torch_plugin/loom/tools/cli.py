"""The `loom` command line (`./loom <subcommand>`, `python3 -m loom ...`).

Subcommands that compute (info, analyze, plan, ...) run in the C++ tool
loom_tool; this front end forwards them, after turning any PyTorch snapshot
argument into a loom trace (loom.snapshot_cli: positional arguments that are
snapshot pickles, by content; `--snapshot-device N` picks the device).
Snapshot import and export run here in Python. `setup` and `test` are
handled by the ./loom launcher script itself, since they must work before
anything is built.
"""

import importlib
import subprocess
import sys

from loom import _paths

# name -> one-line summary. Forwarded verbatim to loom_tool.
FORWARDED = {
    "info": "backend, devices, granularity, total and free memory",
    "replay": "run a trace through loom's run-time allocator",
    "analyze": "lifetime classes, peaks and iterations of a trace or CSV",
    "plan": "plan an instance (offsets per buffer) and write a plan file",
    "verify": "check a plan or offsets against an instance",
}

# Subcommands implemented in Python: name -> (summary, module, function).
PYTHON_COMMANDS = {
    "demo": ("compare allocators on the embedded workloads (tables + plots)",
             "loom.demo", "main"),
    "what-if": ("your snapshot: analysis + every allocator's reservation",
                "loom.whatif", "main"),
    "import": ("PyTorch memory snapshot pickle -> loom text trace",
               "loom.snapshot_cli", "run_import"),
    "export-snapshot": ("loom text trace -> snapshot pickle for memory_viz",
                        "loom.snapshot_cli", "run_export"),
    "files": ("traces, plans and plan-sharing ranks of a work directory",
              "loom.workdir_cli", "run_files"),
}

# Forwarded to loom_tool after the front end handled options of its own.
WRAPPED = {
    "compare": "compare allocators on a workload (--plot out.png)",
}

# Subcommands that exist but whose work has not landed yet.
NOT_YET = {}

# Subcommands handled by the ./loom launcher script, listed for --help.
LAUNCHER_ONLY = {
    "setup": "install the Debian packages loom needs (idempotent)",
    "test": "run every test; ends with 'N passed, N failed'",
}


def usage():
    lines = ["usage: loom <subcommand> [options]", "", "subcommands:"]
    python = {name: entry[0] for name, entry in PYTHON_COMMANDS.items()}
    for name, summary in {**LAUNCHER_ONLY, **FORWARDED, **WRAPPED, **python,
                          **NOT_YET}.items():
        lines.append(f"  {name:<16} {summary}")
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


def run_forwarded(command, args):
    """Runs loom_tool `command`, snapshot arguments converted first."""
    from loom import snapshot_cli  # pylint: disable=import-outside-toplevel
    try:
        with snapshot_cli.converted_snapshot_args(args) as converted:
            return run_tool([command, *converted])
    except snapshot_cli.UsageError as error:
        print(f"loom {command}: {error}", file=sys.stderr)
        return 2
    except snapshot_cli.ConversionError as error:
        print(f"loom {command}: {error}", file=sys.stderr)
        return 1


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in FORWARDED:
        return run_forwarded(command, rest)
    if command in PYTHON_COMMANDS:
        _, module, function = PYTHON_COMMANDS[command]
        return getattr(importlib.import_module(module), function)(rest)
    if command == "compare":
        from loom import compare_plot  # pylint: disable=import-outside-toplevel
        return compare_plot.run(rest, lambda a: run_forwarded(a[0], a[1:]))
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
