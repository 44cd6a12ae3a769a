"""The GPU comparison's models recorded on the CPU without arithmetic, set
beside what the H200 recorded and measured (issue 22, item 2).

    python3 bench/gpu/train/cpu_fidelity.py [--models a,b] [--json]
        [--out DIR]
    python3 bench/gpu/train/cpu_fidelity.py --models llama1b --largest 80GiB
        [--max-batch 64]

The second form predicts the largest micro-batch that fits a device of
that size under PyTorch's allocator and expandable segments (largest()),
for `compare.py run --search` on a GPU to confirm (issue 22's target).

Each model of models.py at scale "full" and its GPU micro-batch is built
and trained for 3 steps (as the H200 traces hold: the build from process
start, then iterations 0-2) under loom.record_cpu's default fake mode
(FakeTensors: shapes only; CUDA's autocast policy; AdamW's foreach path,
which PyTorch picks on CUDA; the MoE experts run the code of the H200's
transformers, 5.17: h200_experts). The markers are those loom.watch puts
on the GPU: an iteration begins at the model's forward (phase "forward", then
"backward" at the output's gradient) and ends after optimizer.step()
(phase "optimizer"), so the batch made before the forward and
zero_grad's frees fall between iterations, as in the GPU traces
(gpt2_interleaved: iterations from step to step, the first unmarked).

Then `loom_tool compare --json --plan-from <as measured.json says>
--allocators pytorch,pytorch_expandable` on the CPU trace, and the same rows as bench/results/whatif.md compares with the
H200 (bench/data/traces/gpu/h200_2026-11-26/, measured.json):

  requests per iteration     CPU recording / H200 trace
  peak allocated             the trace's peak of live requested bytes
                             against the H200's allocated_bytes.all.peak
                             (under PyTorch's allocator), and each
                             simulator's own (rounded) allocated peak
  peak reserved              the simulated pytorch and pytorch_expandable
                             rows against the H200's reserved_bytes.all.peak

`--out DIR` keeps the CPU traces (<model>.ltb). Needs torch and
transformers (the venv) and loom_tool built.
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "bench" / "data" / "traces" / "gpu" / "h200_2026-11-26"
SIMULATED = ("pytorch", "pytorch_expandable")


def _models():
    spec = importlib.util.spec_from_file_location(
        "bench_train_models", Path(__file__).resolve().parent / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measured():
    """measured.json of the H200 run."""
    return json.loads((RUN / "measured.json").read_text())


def h200_experts(model):
    """Makes the MoE experts of `model` run the code the H200's transformers
    (5.17.0, bench/results/runtime.md) ran; returns the number of experts
    modules changed. Its
    grouped_mm experts always mask expert-parallel sentinels: a bool mask
    of the routed tokens (kept for the backward), masked_fill_ of the
    sorted inputs, and an out-of-place masked_fill of each grouped_mm's
    output (the gate/up and the down projection), so each has an
    output-sized copy, and so has its gradient in the backward. transformers
    5.18 does all that only under expert parallelism
    (`_is_expert_parallel`, False otherwise): setting the flag runs 5.17's
    path, which leaves the values unchanged without sentinels. With 5.17
    itself (no flag) nothing changes."""
    changed = 0
    for module in getattr(model, "modules", lambda: ())():
        if getattr(module, "_is_expert_parallel", None) is False:
            module._is_expert_parallel = True  # pylint: disable=protected-access
            changed += 1
    return changed


def record(name, steps=3, micro_batch=None):
    """The CPU recording (a stopped loom Recorder) of model `name`'s GPU
    configuration: the build and `steps` training steps, fake mode, at
    `micro_batch` (default: the GPU run's)."""
    import torch  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, str(ROOT / "torch_plugin"))
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import fake_record, record_cpu
    models = _models()
    spec = models.spec(name, "full")
    batch = spec.micro_batch if micro_batch is None else micro_batch
    recorder = record_cpu.Recorder(None, provenance=(
        f"bench/gpu/train/cpu_fidelity.py: {name} (models.py, full) at "
        f"micro-batch {batch}, {steps} steps, recorded on the "
        f"CPU on FakeTensors; torch {torch.__version__}"))
    recorder.start()
    try:
        trainer = models.build(torch, spec, batch, device="cpu")
        h200_experts(trainer.model)
        fake_record.cuda_optimizer(trainer.optimizer)
        recorder.watch(trainer.model)
        optimizer = trainer.optimizer
        optimizer.register_step_pre_hook(
            lambda *_: recorder.phase("optimizer"))
        # The model's forward begins an iteration (loom.watch); the
        # interleaved chunks are a ModuleList never called as a whole, so
        # there, as on the GPU, an iteration begins at the first event
        # after a step and the first one is in the head, unmarked.
        optimizer.register_step_post_hook(
            lambda *_: recorder.step() if spec.kind == "gpt2vp"
            else recorder.end_iteration())
        for step in range(steps):
            trainer.step(step)
    finally:
        recorder.stop()
    return recorder


def compare(loom_tool, trace_path, plan_from):
    """{allocator: row} of `loom_tool compare --json`, the simulators the
    H200 measured only (no loom plan to search for)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    done = subprocess.run(
        [str(loom_tool), "compare", str(trace_path), "--json",
         "--plan-from", plan_from, "--allocators", ",".join(SIMULATED)],
        capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"loom_tool compare failed: {done.stderr}")
    return {row["allocator"]: row for row in json.loads(done.stdout)}


def _per_iteration(trace):
    sys.path.insert(0, str(ROOT / "torch_plugin"))
    # pylint: disable-next=import-outside-toplevel
    from loom.tools.record_summary import summarize
    return summarize(trace.events)


def fidelity(name, loom_tool, out_dir=None):
    """One model's comparison: a dict (see the module docstring)."""
    sys.path.insert(0, str(ROOT / "torch_plugin"))
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import trace as loom_trace
    info = measured()["models"][name]
    started = time.time()
    recorder = record(name)
    seconds = time.time() - started
    cpu = recorder.trace
    gpu = loom_trace.read_trace(RUN / info["trace"])
    with tempfile.TemporaryDirectory(prefix="loom-fidelity-") as temp:
        path = Path(out_dir or temp) / f"{name}.ltb"
        loom_trace.write_trace(cpu, path)
        rows = compare(loom_tool, path, info["plan_from"])
    cpu_summary, gpu_summary = _per_iteration(cpu), _per_iteration(gpu)
    result = {
        "model": name, "record_seconds": round(seconds, 2),
        "requests_per_iteration": {
            "cpu": cpu_summary["requests_per_iteration"],
            "gpu": gpu_summary["requests_per_iteration"]},
        "peak_live_bytes": {"cpu": cpu_summary["peak_live_bytes"],
                            "gpu_trace": gpu_summary["peak_live_bytes"]},
        "allocators": {}}
    for allocator in SIMULATED:
        real = info["measured"][allocator]
        row = rows[allocator]
        result["allocators"][allocator] = {
            "h200_allocated": real["allocated_bytes.all.peak"],
            "cpu_allocated": row["allocator_peak_allocated_bytes"],
            "h200_reserved": real["reserved_bytes.all.peak"],
            "cpu_reserved": row["peak_reserved_bytes"]}
    return result


def _gib(value):
    return f"{value / (1 << 30):.2f}"


def _pct(mine, theirs):
    return f"{100 * (mine - theirs) / theirs:+.2f}%"


def table(results):
    """The markdown table of bench/results/whatif.md."""
    lines = ["| model | requests / iteration, CPU (H200) | peak allocated "
             "GiB, CPU vs H200 | pytorch peak reserved GiB, CPU vs H200 | "
             "expandable peak reserved GiB, CPU vs H200 | recorded in |",
             "|---|---|---|---|---|---:|"]
    for r in results:
        per = r["requests_per_iteration"]
        torch_row = r["allocators"]["pytorch"]
        exp_row = r["allocators"]["pytorch_expandable"]
        lines.append(
            f"| {r['model']} | {', '.join(map(str, per['cpu']))} "
            f"({', '.join(map(str, per['gpu']))}) | "
            f"{_gib(torch_row['cpu_allocated'])} vs "
            f"{_gib(torch_row['h200_allocated'])} "
            f"({_pct(torch_row['cpu_allocated'], torch_row['h200_allocated'])})"
            f" | {_gib(torch_row['cpu_reserved'])} vs "
            f"{_gib(torch_row['h200_reserved'])} "
            f"({_pct(torch_row['cpu_reserved'], torch_row['h200_reserved'])})"
            f" | {_gib(exp_row['cpu_reserved'])} vs "
            f"{_gib(exp_row['h200_reserved'])} "
            f"({_pct(exp_row['cpu_reserved'], exp_row['h200_reserved'])})"
            f" | {r['record_seconds']:.1f} s |")
    return "\n".join(lines)


def largest(name, device_memory, max_batch=64):
    """The largest micro-batch of model `name` predicted to fit
    `device_memory` under PyTorch's allocator and expandable segments
    (loom.tools.predict.largest_batch over CPU recordings of the GPU
    configuration): what `compare.py run --search` measures on a GPU of
    that size (issue 22's target: llama1b at 80 GiB under expandable
    segments)."""
    sys.path.insert(0, str(ROOT / "torch_plugin"))
    from loom.tools import predict  # pylint: disable=import-outside-toplevel
    return predict.largest_batch(
        lambda batch: record(name, micro_batch=batch), device_memory,
        max_batch=max_batch, allocators=list(SIMULATED),
        on_recording=lambda entry: print(
            f"{name} batch {entry['batch']}: " + ", ".join(
                f"{a['allocator']} {a['peak_reserved_bytes'] / 2**30:.2f} GiB"
                f"{' (OOM)' if a['oom'] else ''}"
                for a in entry["allocators"]), file=sys.stderr))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--largest", default=None, metavar="SIZE",
                        help="instead: the largest micro-batch predicted to "
                        "fit a device of SIZE (e.g. 80GiB), per allocator")
    parser.add_argument("--max-batch", type=int, default=64)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "torch_plugin"))
    from loom import _paths  # pylint: disable=import-outside-toplevel
    names = (args.models.split(",") if args.models
             else sorted(measured()["models"]))
    if args.largest:
        found = {name: largest(name, args.largest, args.max_batch)
                 for name in names}
        print(json.dumps(found, indent=2))
        return 0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    results = []
    for name in names:
        results.append(fidelity(name, _paths.loom_tool(), args.out))
        print(table(results[-1:]).splitlines()[-1], file=sys.stderr)
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
