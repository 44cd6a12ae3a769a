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
H200's reason); loom-plan needs an existing --plan file and writes no
trace; loom-remember serves the plan a previous run left in --workdir. FAKE_STEP_NOISE=x scatters the step times uniformly within
+-x of the allocator's (seeded by --out, so reproducible). --profile-steps N adds a profile made by the real
profile_steps.summarize() from a synthetic Kineto trace in which the GEMM
takes GEMM_US[allocator] per step (and --profile-trace keeps that trace).
"""

import argparse
import gzip
import json
import os
import random
import shutil
import sys
from pathlib import Path

GiB = 1 << 30
EFFICIENCY = {"torch": 0.90, "expandable": 0.95, "loom": 0.995}
STEP_S = {"torch": 0.100, "expandable": 0.1012, "loom": 0.1005}
GEMM_US = {"torch": 1000.0, "expandable": 1010.0, "loom": 1000.0,
           "loom-chunk1": 1200.0, "loom-chunk10": 1020.0}
DEFAULT_MB = {"llama1b": 4, "llama1b_recompute": 4, "moe": 8,
              "gpt2_interleaved": 4}


def synthetic_trace(allocator, steps):
    """A Kineto-shaped trace: per step a 10 ms annotation holding a GEMM, a
    memset, three elementwise kernels (the second overlapping the first on
    another stream) and a copy, 100 us apart."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" /
                           "gpu" / "train"))
    import profile_steps  # pylint: disable=import-outside-toplevel
    events = []
    for step in range(steps):
        t = 1_000_000.0 + step * 20_000
        events.append({"ph": "X", "cat": "user_annotation",
                       "name": profile_steps.STEP_LABEL, "ts": t,
                       "dur": 10_000.0, "pid": 1, "tid": 1})
        gemm = GEMM_US[allocator]
        kernels = [("kernel", "ampere_sgemm_128x64_tn", t + 100, gemm),
                   ("gpu_memset", "Memset (Device)", t + 200 + gemm, 5.0),
                   ("kernel", "void at::native::elementwise_kernel<128, 2>",
                    t + 300 + gemm, 50.0),
                   ("kernel", "void at::native::elementwise_kernel<128, 2>",
                    t + 320 + gemm, 50.0),
                   ("kernel", "void at::native::elementwise_kernel<128, 2>",
                    t + 500 + gemm, 50.0),
                   ("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)",
                    t + 600 + gemm, 10.0)]
        for cat, name, ts, dur in kernels:
            events.append({"ph": "X", "cat": cat, "name": name, "ts": ts,
                           "dur": dur, "pid": 0, "tid": 7})
    return {"traceEvents": events}, profile_steps


def main(argv):
    parser = argparse.ArgumentParser()
    for name in ("--model", "--allocator", "--out", "--workdir", "--scale",
                 "--snapshot", "--record-iterations", "--profile-trace",
                 "--plan"):
        parser.add_argument(name)
    for name in ("--micro-batch", "--warmup", "--steps", "--profile-steps",
                 "--seed"):
        parser.add_argument(name, type=int)
    args = parser.parse_args(argv)
    limits = json.loads(os.environ.get("FAKE_LIMITS", "{}"))
    mb = args.micro_batch or DEFAULT_MB[args.model]
    result = {"model": args.model, "allocator": args.allocator,
              "micro_batch": mb, "steps": args.steps, "oom": False,
              "seed": args.seed,
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
            allocated / EFFICIENCY.get(args.allocator, EFFICIENCY["loom"]))
        result["efficiency"] = allocated / result["reserved_bytes.all.peak"]
        step_s = STEP_S.get(args.allocator, STEP_S["loom"])
        result["median_step_s"] = step_s
        noise = float(os.environ.get("FAKE_STEP_NOISE", "0"))
        rng = random.Random(args.out)
        result["step_seconds"] = [step_s * (1 + rng.uniform(-noise, noise))
                                  for _ in range(args.steps)]
        if args.profile_steps:
            trace, profile_steps = synthetic_trace(args.allocator,
                                                   args.profile_steps)
            result["profile"] = profile_steps.summarize(trace)
            if args.allocator.startswith("loom"):
                result["profile"]["loom"] = {
                    "loom.layout.handles": 7, "loom.layout.mappings": 7,
                    "loom.layout.handle_size.1GiB.handles": 7,
                    "loom.waits.free.events": 0,
                    "loom.host.malloc.samples": 2,
                    "loom.host.malloc.sampled_ns": 300,
                    "loom.host.free.samples": 2,
                    "loom.host.free.sampled_ns": 180}
            if args.profile_trace:
                with gzip.open(args.profile_trace, "wt") as sink:
                    json.dump(profile_steps.kept_events(trace), sink)
        if args.allocator == "loom-plan":  # plan mode: records nothing
            if args.plan is None or not Path(args.plan).is_file():
                raise SystemExit(f"--plan {args.plan}: no such file")
            result["plan_file"] = args.plan
            result["loom_state"] = "serving"  # plan mode's state
            result["plan_loaded"] = True
            result["plan_error"] = None
            result["hit_rate"] = 1.0
            result["driver_calls_per_step"] = 0
        elif args.allocator.startswith("loom"):
            workdir = Path(args.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            if args.allocator == "loom-remember":  # the first run leaves it
                start_plan = workdir / "start-plan.rank0.lplan"
                result["plan_source"] = "previous run" \
                    if start_plan.exists() else "own"
                result["remembered"] = "confirmed" \
                    if start_plan.exists() else None
                start_plan.write_bytes(b"a plan")
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
