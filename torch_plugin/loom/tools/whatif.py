"""`loom what-if`: what would each allocator do with my run? No GPU needed.

Two forms:

  loom what-if <snapshot|trace> [--plot out.png] [--device-memory SIZE]
      a user's own PyTorch memory snapshot (or loom trace): the workload
      analysis (iterations, lifetime classes, the lower bound), then the
      comparison of PyTorch's caching allocator, expandable segments, a
      GMLake-style stitcher and loom on that same trace

  loom what-if --model TYPE|--config FILE [record-cpu's model options,
               --tp/--pp/--dp/--zero/--optimizer] [--device-memory SIZE
               [--max-batch N]] [--snapshot FILE]
      a model's training steps recorded on the CPU (loom record-cpu's
      options), every allocator's predicted peak reserved memory, and for a
      device size the largest micro-batch that fits under each allocator
      (loom.tools.whatif_model, loom.tools.predict), which modules hold
      the peak (loom.tools.peak_modules), one rank of a multi-GPU job
      (loom.tools.parallel_shapes)

`--json` prints the result as JSON in both forms.
"""

import argparse
import sys

from loom.config import parse_size
from loom.errors import LoomError
from loom.tools import compare_plot
from loom.tools import record_cpu_cli
from loom.tools.forward import run_forwarded

PROG = "loom what-if"


class UsageError(Exception):
    """Bad arguments (one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _bytes(text):
    """An argparse type: a byte count. argparse names the option in its
    message ("argument --device-memory: ..."), so the reason does not."""
    try:
        return parse_size(text, "--device-memory")
    except LoomError as error:
        raise argparse.ArgumentTypeError(
            str(error).removeprefix("--device-memory: ")) from None


def parser():
    p = _Parser(
        prog=PROG,
        usage="%(prog)s <snapshot|trace> [--plot PNG] [--device-memory SIZE] "
        "[--json]\n       %(prog)s --model TYPE [record-cpu options] "
        "[--device-memory SIZE [--max-batch N]] [--json]",
        description="What would PyTorch's caching allocator, expandable "
        "segments, a GMLake-style stitcher and loom reserve for my training "
        "run? Either a PyTorch memory snapshot (or loom trace) of the run, "
        "analysed and replayed through every allocator, or a model by name "
        "(--model, with loom record-cpu's options) whose training steps are "
        "recorded on the CPU: every allocator's predicted peak reserved "
        "memory and, for a device size, the largest micro-batch (--batch) "
        "that fits under each. No GPU needed.")
    p.add_argument("input", nargs="?", help="snapshot pickle (torch.cuda."
                   "memory._dump_snapshot) or loom trace")
    p.add_argument("--plot", help="write the picture here (PNG)")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON")
    p.add_argument("--snapshot-device", type=int,
                   help="device of the snapshot to use")
    p.add_argument("--device-memory", type=_bytes, metavar="SIZE",
                   help="the device's memory, e.g. 80GiB: the replay's "
                   "capacity (a row's oom); with --model also the largest "
                   "batch that fits")
    p.add_argument("--max-batch", type=record_cpu_cli.positive_int, default=None,
                   help="--model: the largest batch tried (default 64)")
    p.add_argument("--snapshot", metavar="FILE", default=None,
                   help="--model: write the step recorded at --batch as a "
                   "PyTorch memory snapshot (pytorch.org/memory_viz), each "
                   "request's frames its module stack")
    p.add_argument("--loom-time-limit", type=float, default=None,
                   metavar="SECONDS",
                   help="seconds loom's planner may search (default 10)")
    model = p.add_argument_group(
        "--model: the training step recorded on the CPU (as loom record-cpu)")
    record_cpu_cli.add_step_arguments(model, model_required=False,
                                      full_size=True)
    return p


def _check(p, args):
    """The combination of the two forms' options."""
    if args.config is not None and args.model is None:
        args.model = ""  # the --model form: --config names the type
    if args.input is None and args.model is None:
        raise UsageError("give a snapshot or trace, or --model TYPE "
                         "(or --config FILE)")
    if args.input is not None and args.model is not None:
        raise UsageError(f"give a snapshot or trace ({args.input}) or "
                         f"--model, not both")
    if args.model is None:
        given = [name for name in record_cpu_cli.STEP_OPTIONS
                 if getattr(args, name) != p.get_default(name)]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} describes "
                             f"the step of --model, which is not given")
        if args.max_batch is not None:
            raise UsageError("--max-batch needs --model and --device-memory")
        if args.snapshot is not None:
            raise UsageError("--snapshot needs --model (the step recorded)")
    else:
        if args.snapshot_device is not None:
            raise UsageError("--snapshot-device needs a snapshot, not "
                             "--model")
        if args.max_batch is not None and args.device_memory is None:
            raise UsageError("--max-batch needs --device-memory")


def main(argv):
    argv = list(argv)
    p = parser()
    try:
        args = p.parse_args(argv)
        _check(p, args)
    except UsageError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    if args.model is not None:
        # pylint: disable-next=import-outside-toplevel
        from loom.tools import whatif_model
        return whatif_model.run(args, argv)
    return _snapshot(args)


def _snapshot(args):
    """The first form: analysis, then compare (with --plot)."""
    device = ([] if args.snapshot_device is None
              else ["--snapshot-device", str(args.snapshot_device)])
    if not args.json:
        print("=== the workload")
        code = run_forwarded("analyze", [args.input, *device])
        if code != 0:
            return code
        print("\n=== what each allocator would reserve")
    compare_args = [args.input, *device]
    if args.json:
        compare_args.append("--json")
    if args.device_memory is not None:
        compare_args += ["--capacity", str(args.device_memory)]
    if args.loom_time_limit is not None:
        compare_args += ["--loom-time-limit", str(args.loom_time_limit)]
    if args.plot:
        compare_args += ["--plot", args.plot]
    return compare_plot.run(compare_args,
                            lambda a: run_forwarded(a[0], a[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
