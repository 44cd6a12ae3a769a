"""`loom what-if <snapshot|trace>`: what would each allocator do with my run?

For a user's own PyTorch memory snapshot (or loom trace), with no GPU: the
workload analysis (iterations, lifetime classes, the lower bound), then the
comparison of PyTorch's caching allocator, expandable segments, a
GMLake-style stitcher and loom on that same trace, optionally with the
picture.
"""

import argparse
import sys

from loom.tools import compare_plot
from loom.tools.forward import run_forwarded


def main(argv):
    parser = argparse.ArgumentParser(
        prog="loom what-if",
        description="Analyses a PyTorch memory snapshot (or a loom trace) and "
        "compares what PyTorch's allocator, expandable segments, a "
        "GMLake-style stitcher and loom would reserve on it. No GPU needed.")
    parser.add_argument("input", help="snapshot pickle (torch.cuda.memory."
                        "_dump_snapshot) or loom trace")
    parser.add_argument("--plot", help="write the picture here (PNG)")
    parser.add_argument("--json", action="store_true",
                        help="print the comparison rows as JSON")
    parser.add_argument("--snapshot-device", type=int,
                        help="device of the snapshot to use")
    args = parser.parse_args(argv)
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
    if args.plot:
        compare_args += ["--plot", args.plot]
    return compare_plot.run(compare_args,
                            lambda a: run_forwarded(a[0], a[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
