"""A stand-in for bench/gpu/train/worker.py, for test_train_compare.py.

Takes the worker's arguments and writes a result of the worker's shape
without torch: the run is out of memory when --micro-batch exceeds the
allocator's limit in FAKE_LIMITS (JSON, allocator -> micro-batch); peaks
scale with the micro-batch, efficiency and step time per allocator are
fixed (below). --snapshot copies FAKE_SNAPSHOT (a real snapshot pickle)
there and reports FAKE_SNAPSHOT_RESERVED as the real peak reserved. Under
loom a trace file is written in --workdir, as loom's auto mode does.
FAKE_FAIL=model/allocator makes that run fail (exit 1); a loom run is
"planned" unless FAKE_FALLBACK names its model (then "fallback", with the
H200's reason).
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

GiB = 1 << 30
EFFICIENCY = {"torch": 0.90, "expandable": 0.95, "loom": 0.995}
STEP_S = {"torch": 0.100, "expandable": 0.1012, "loom": 0.1005}
DEFAULT_MB = {"llama1b": 4, "llama1b_recompute": 4, "moe": 8,
              "gpt2_interleaved": 4}


def main(argv):
    parser = argparse.ArgumentParser()
    for name in ("--model", "--allocator", "--out", "--workdir", "--scale",
                 "--snapshot", "--record-iterations"):
        parser.add_argument(name)
    for name in ("--micro-batch", "--warmup", "--steps"):
        parser.add_argument(name, type=int)
    args = parser.parse_args(argv)
    limits = json.loads(os.environ.get("FAKE_LIMITS", "{}"))
    mb = args.micro_batch or DEFAULT_MB[args.model]
    result = {"model": args.model, "allocator": args.allocator,
              "micro_batch": mb, "steps": args.steps, "oom": False,
              "env": {"gpu": "Fake H100", "gpu_memory_bytes": 80 * GiB,
                      "torch": "2.11.0", "cuda": "13.0", "python": "3.12"}}
    code = 0
    if os.environ.get("FAKE_FAIL") == f"{args.model}/{args.allocator}":
        result["error"] = "Traceback ...\nRuntimeError: CUDA error: boom"
        code = 1
    elif mb > limits.get(args.allocator, 1 << 30):
        result["oom"] = True
        result["error"] = "CUDA out of memory. Tried to allocate 2.00 GiB"
    else:
        allocated = mb * GiB
        result["allocated_bytes.all.peak"] = allocated
        result["reserved_bytes.all.peak"] = int(
            allocated / EFFICIENCY[args.allocator])
        result["efficiency"] = allocated / result["reserved_bytes.all.peak"]
        result["median_step_s"] = STEP_S[args.allocator]
        result["step_seconds"] = [STEP_S[args.allocator]] * args.steps
        if args.allocator == "loom":
            workdir = Path(args.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            trace = workdir / "trace.rank0.ltb"
            trace.write_bytes(b"LTB fake trace " + args.model.encode())
            (workdir / "trace.rank0.ltb.json").write_text("{}")
            result["trace"] = str(trace)
            result["driver_calls_per_step"] = 0 if args.model != "moe" else 2
            if os.environ.get("FAKE_FALLBACK") == args.model:
                result["loom_state"] = "fallback"
                result["plan_error"] = (
                    "cannot install plan.rank0.lplan: INTERNAL: "
                    "cuCtxSynchronize(device 0): "
                    "CUDA_ERROR_CONTEXT_IS_DESTROYED")
                result["hit_rate"] = None
            else:
                result["loom_state"] = "planned"
                result["plan_error"] = None
                result["hit_rate"] = 1.0
        if args.snapshot:
            shutil.copy(os.environ["FAKE_SNAPSHOT"], args.snapshot)
            result["reserved_bytes.all.peak"] = int(
                os.environ["FAKE_SNAPSHOT_RESERVED"])
    Path(args.out).write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
