"""The `loom` command line (`./loom <subcommand>`, `python3 -m loom ...`).

Subcommands that compute (info, analyze, plan, ...) run in the C++ tool
loom_tool; this front end forwards them, after turning any PyTorch snapshot
argument into a loom trace (loom.tools.snapshot_cli: positional arguments
that are snapshot pickles, by content; `--snapshot-device N` picks the
device). Snapshot import and export run here in Python (trace files through
libloom). `setup`, `test` and `wheel` are
handled by the ./loom launcher script itself, since they must work before
anything is built (or build the wheel from the checkout): they are listed by
`--help` only in a source checkout, and an installed package (the wheel)
refuses them in one line.
"""

import importlib
import sys

from loom import _extras
from loom.tools.forward import run_forwarded

# name -> one-line summary. Forwarded verbatim to loom_tool.
FORWARDED = {
    "info": "backend, devices, granularity, total and free memory",
    "replay": "run a trace through loom's run-time allocator",
    "analyze": "lifetime classes, peaks and iterations of a trace or CSV",
    "plan": "plan an instance (offsets per buffer) and write a plan file",
    "verify": "check a plan or offsets against an instance",
    "stress": "random multi-stream programs against the run-time allocator",
}

# Subcommands implemented in Python: name -> (summary, module, function).
PYTHON_COMMANDS = {
    "demo": ("compare allocators on the embedded workloads (tables + plots)",
             "loom.tools.demo", "main"),
    "what-if": ("every allocator on your snapshot or model; largest batch",
                "loom.tools.whatif", "main"),
    "import": ("PyTorch memory snapshot pickle -> loom trace",
               "loom.tools.snapshot_cli", "run_import"),
    "export-snapshot": ("loom trace -> snapshot pickle for memory_viz",
                        "loom.tools.snapshot_cli", "run_export"),
    "files": ("traces, plans and plan-sharing ranks of a work directory",
              "loom.tools.workdir_cli", "run_files"),
    "record-cpu": ("a model's training steps on the CPU -> loom trace",
                   "loom.tools.record_cpu_cli", "main"),
}

# Forwarded to loom_tool after the front end handled options of its own.
WRAPPED = {
    "compare": "compare allocators on a workload (--plot out.png)",
}

# Subcommands handled by the ./loom launcher script, listed for --help.
LAUNCHER_ONLY = {
    "setup": "install the Debian packages loom needs (idempotent)",
    "test": "run every test; ends with 'N passed, N failed'",
    "wheel": "build an installable wheel of the loom package (-o DIR)",
}


def usage(checkout=None):
    """The --help text; the launcher's subcommands only in a checkout."""
    checkout = _extras.in_checkout() if checkout is None else checkout
    lines = ["usage: loom <subcommand> [options]", "", "subcommands:"]
    python = {name: entry[0] for name, entry in PYTHON_COMMANDS.items()}
    launcher = LAUNCHER_ONLY if checkout else {}
    for name, summary in {**launcher, **FORWARDED, **WRAPPED,
                          **python}.items():
        lines.append(f"  {name:<16} {summary}")
    lines += ["", "`loom <subcommand> --help` describes each one."]
    return "\n".join(lines) + "\n"


def launcher_only_message(command, checkout=None):
    """Why `command` (setup, test, wheel) does not run here: one line."""
    checkout = _extras.in_checkout() if checkout is None else checkout
    if checkout:
        return (f"loom: '{command}' is run by the ./loom launcher of this "
                f"checkout ({_repo_root()}/loom {command})")
    why = {"setup": "an installed loom needs no setup (the extras add the "
                    f"optional pieces: pip install '{_extras.DIST}[all]')",
           "test": "the tests live in the source repository",
           "wheel": "this is an installed wheel already"}[command]
    return (f"loom: '{command}' is a command of a loom source checkout "
            f"(./loom {command} there): {why}")


def _repo_root():
    from loom import _paths  # pylint: disable=import-outside-toplevel
    return _paths.REPO_ROOT


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
        # pylint: disable-next=import-outside-toplevel
        from loom.tools import compare_plot
        return compare_plot.run(rest, lambda a: run_forwarded(a[0], a[1:]))
    if command in LAUNCHER_ONLY:
        print(launcher_only_message(command), file=sys.stderr)
        return 2
    print(f"loom: unknown subcommand '{command}'\n", file=sys.stderr)
    sys.stderr.write(usage())
    return 2


if __name__ == "__main__":
    sys.exit(main())
