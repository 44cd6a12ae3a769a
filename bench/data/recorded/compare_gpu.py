"""Measures what the CPU recordings of this folder miss: each trace against
the same steps run on a GPU and recorded there by loom.

On a machine with a GPU (PyTorch with CUDA and transformers; LOOM_PYTHON
names that interpreter for ./loom if it is not .venv's):

    bench/data/recorded/regenerate.sh --device cuda --out /tmp/recorded-gpu
    PYTHONPATH=torch_plugin python3 bench/data/recorded/compare_gpu.py \
        bench/data/recorded /tmp/recorded-gpu

prints one Markdown row per trace: requests and requested bytes per steady
iteration (iterations 1 on; iteration 0 holds the optimizer's lazy state,
and on the GPU the set-up too), peak live bytes of both, and the request
sizes only the GPU made (per iteration, largest first): the kernel
workspaces and other requests a CPU recording cannot see
(loom.tools.record_cpu.compare_traces).
"""

import argparse
import os
import sys

from loom.tools import record_cpu


def _bytes(value):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else \
                f"{value:.2f} {unit}"
        value /= 1024
    return str(value)


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cpu_dir")
    parser.add_argument("gpu_dir")
    args = parser.parse_args(argv)
    names = sorted(n for n in os.listdir(args.cpu_dir)
                   if n.endswith((".ltb", ".ltt")) and
                   os.path.exists(os.path.join(args.gpu_dir, n)))
    if not names:
        print("no trace is in both folders", file=sys.stderr)
        return 1
    print("| trace | requests/iter CPU | GPU | bytes/iter CPU | GPU | "
          "peak live CPU | GPU | GPU-only sizes per iteration |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        result = record_cpu.compare_traces(os.path.join(args.cpu_dir, name),
                                           os.path.join(args.gpu_dir, name))
        cpu, gpu = result["cpu"], result["gpu"]
        extra = ", ".join(f"{_bytes(size)} x{count:g}" for size, count in
                          result["gpu_only_sizes"][:4]) or "none"
        print(f"| {name} | {_median(cpu['requests_per_iteration'])} | "
              f"{_median(gpu['requests_per_iteration'])} | "
              f"{_bytes(_median(cpu['bytes_per_iteration']))} | "
              f"{_bytes(_median(gpu['bytes_per_iteration']))} | "
              f"{_bytes(cpu['peak_live_bytes'])} | "
              f"{_bytes(gpu['peak_live_bytes'])} | {extra} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
