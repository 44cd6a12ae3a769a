"""`loom record-cpu`: a model by name, a few training steps on the CPU,
recorded as a loom trace (loom.tools.record_cpu, loom.tools.cpu_models).

  loom record-cpu --model TYPE [--set key=value,...] [--steps N]
                  [--batch B] [--seq S] [--recompute]
                  [--schedule plain|1f1b|interleaved:CHUNKS]
                  [--stages P] [--rank R] [--microbatches M]
                  [--dtype fp32|bf16|bf16-pure] [--attn IMPL]
                  [--experts IMPL] [--dynamic PATTERN] [--full-size]
                  [--seed N] [--real] [--device cpu|cuda] [--json]
                  [--config FILE] [--tp N] [--pp N] [--dp N --zero S]
                  [--optimizer adamw|sgd]
                  -o out.ltb|out.ltt

The step runs on FakeTensors (loom.tools.fake_record: shapes only, no
arithmetic) unless --real. --config, --tp, --pp (= --stages), --dp/--zero
and --optimizer: one rank of a multi-GPU job (loom.tools.parallel_shapes).

Prints one line: the file, requests, iterations, requests per iteration,
peak live bytes, seconds (with --json, that summary as a JSON object).
Needs PyTorch and transformers (the wheel's `record` extra): without them,
one line says which is missing and how to get it (exit status 1). Exit
status 2 for bad arguments (an unknown model
type, a --set key the config lacks, ...), 1 when the step or the writing
fails; the message is one line, without a traceback.

`--device cuda` runs the same step on a GPU, recorded by loom itself
(loom.enable(mode="record"), the same markers): the GPU trace to compare
a CPU recording with (loom.tools.record_cpu.compare_traces).
"""

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

from loom import _extras
from loom.errors import LoomError
from loom.tools import cpu_models
from loom.tools import parallel_shapes
from loom.tools import trace as loom_trace

PROG = "loom record-cpu"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise cpu_models.ModelError(message)


def positive_int(text):
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got "
                                         f"{text!r}")
    return value


def _natural(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got "
                                         f"{text!r}")
    return value


def parser():
    """The parser of `loom record-cpu`."""
    p = _Parser(
        prog=PROG,
        description="Runs a few training steps of a model on the CPU and "
        "records, as a loom trace, every request PyTorch's CUDA caching "
        "allocator would receive (sizes as requested, dtypes as under CUDA "
        "autocast), with iteration, phase and module markers (MoE blocks "
        "dynamic). The model is any model_type transformers' AutoConfig "
        "knows, with random weights and tiny sizes (same structure; "
        "--full-size: the config's own); --set overrides any config key. "
        "The step runs on FakeTensors (shapes only, no data: seconds at "
        "full size); --real runs the arithmetic (needed when sizes follow "
        "the data, e.g. --experts eager).")
    add_step_arguments(p)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: run the step on the GPU, recorded by loom "
                   "(the reference for a CPU recording)")
    p.add_argument("-o", "--output", required=True,
                   help="trace to write (.ltt text, else binary)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON")
    return p


# The destinations of add_step_arguments' options, --model's first.
STEP_OPTIONS = ("model", "set", "steps", "batch", "seq", "recompute",
                "schedule", "stages", "rank", "microbatches", "dtype", "attn",
                "experts", "dynamic", "full_size", "seed", "real",
                "no_cuda_workspaces", *parallel_shapes.OPTIONS)


def add_step_arguments(p, model_required=True, full_size=False):
    """The options that say which model and which training step to record
    (`--model` ... `--real`; dests in STEP_OPTIONS), shared by `loom
    record-cpu` and `loom what-if --model`. `full_size`: the config's own
    sizes by default (`--tiny` shrinks them; what-if), else tiny ones
    (`--full-size` keeps the config's; record-cpu)."""
    p.add_argument("--model", required=False, metavar="TYPE",
                   help="a transformers model_type: llama, qwen2, qwen3, "
                   "mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, "
                   "gpt_oss, ...")
    p.add_argument("--set", action="append", default=[], metavar="K=V,...",
                   help="config values (JSON values; repeatable), e.g. "
                   "--set hidden_size=256,num_hidden_layers=8")
    p.add_argument("--steps", type=positive_int, default=4,
                   help="training steps = iterations (default 4)")
    p.add_argument("--batch", type=positive_int, default=2,
                   help="sequences per micro-batch (default 2)")
    p.add_argument("--seq", type=positive_int, default=128,
                   help="tokens per sequence (default 128)")
    p.add_argument("--recompute", action="store_true",
                   help="activation recomputation (HF gradient "
                   "checkpointing, non-reentrant)")
    p.add_argument("--schedule", default="plain",
                   help="plain, 1f1b or interleaved:CHUNKS (Megatron's "
                   "orders, one pipeline rank; default plain)")
    p.add_argument("--stages", "--pp", type=positive_int, default=None,
                   help="pipeline stages (1f1b/interleaved; default 2; "
                   "with the plain schedule: 1f1b)")
    p.add_argument("--rank", type=_natural, default=0,
                   help="the pipeline rank recorded (default 0)")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="micro-batches per step (default 1; pipelines: "
                   "2 x stages)")
    p.add_argument("--dtype", choices=cpu_models.DTYPES, default="fp32",
                   help="fp32 (default); bf16: autocast over fp32 weights "
                   "with CUDA's policy; bf16-pure: bf16 weights")
    p.add_argument("--attn", default=None, metavar="IMPL",
                   help="attn_implementation (sdpa, eager; default: "
                   "transformers')")
    p.add_argument("--experts", default=None, metavar="IMPL",
                   help="experts_implementation of MoE models (eager: a "
                   "loop over the experts hit, sizes change with the "
                   "routing; grouped_mm, batched_mm; default: transformers')")
    p.add_argument("--dynamic", action="append", default=[],
                   metavar="PATTERN",
                   help="more dynamic modules (fnmatch on qualified or class "
                   "names, or re:REGEX); repeatable")
    if full_size:
        p.add_argument("--tiny", dest="full_size", action="store_false",
                       help="tiny sizes (hidden 128, 4 layers, ...) instead "
                       "of the config's own")
    else:
        p.add_argument("--full-size", action="store_true",
                       help="the config's own sizes instead of the tiny ones")
    p.add_argument("--seed", type=_natural, default=0,
                   help="seed of the weights and data (default 0)")
    p.add_argument("--real", action="store_true",
                   help="run the real arithmetic on the CPU (default: "
                   "FakeTensors, shapes only, no data; --real for models "
                   "whose sizes depend on the data)")
    p.add_argument("--no-cuda-workspaces", action="store_true",
                   help="leave out the cuBLAS workspaces a CUDA run "
                   "allocates (recorded by default on FakeTensors, never "
                   "with --real): a FakeTensor trace then equals a --real "
                   "one, request for request")
    parallel_shapes.add_arguments(p, positive_int)
    del model_required  # --model or --config: parallel_shapes checks


def spec_from_args(args):
    """A StepSpec from parsed arguments (ModelError for bad combinations)."""
    schedule, chunks = args.schedule, 1
    if schedule.startswith("interleaved"):
        head, sep, tail = schedule.partition(":")
        if head != "interleaved" or not sep or not tail.isdigit() or \
                int(tail) < 1:
            raise cpu_models.ModelError(
                f"--schedule {schedule}: expected interleaved:CHUNKS "
                f"(e.g. interleaved:2)")
        schedule, chunks = "interleaved", int(tail)
    elif schedule not in ("plain", "1f1b"):
        raise cpu_models.ModelError(f"--schedule {schedule}: expected plain, "
                                    f"1f1b or interleaved:CHUNKS")
    pipeline = schedule != "plain"
    if not pipeline and (args.stages not in (None, 1) or args.rank):
        raise cpu_models.ModelError("--stages and --rank need a pipeline "
                                    "schedule (1f1b, interleaved:C)")
    stages = args.stages or (2 if pipeline else 1)
    microbatches = args.microbatches or (2 * stages if pipeline else 1)
    if args.rank >= stages:
        raise cpu_models.ModelError(f"--rank {args.rank}: the pipeline has "
                                    f"{stages} stages")
    return cpu_models.StepSpec(
        model_type=args.model,
        overrides=cpu_models.parse_overrides(args.set),
        batch=args.batch, seq=args.seq, recompute=args.recompute,
        schedule=schedule, chunks=chunks, stages=stages, rank=args.rank,
        microbatches=microbatches, dtype=args.dtype, attn=args.attn,
        experts=args.experts, tiny=not args.full_size, seed=args.seed,
        real=args.real,
        cuda_workspaces=False if args.no_cuda_workspaces else None)


def rank_spec_from_args(args):
    """(StepSpec, parallel_shapes.Parallel) from parsed arguments: --config,
    --pp, --tp, --dp/--zero, --optimizer as well (loom.tools.parallel_shapes;
    ModelError for bad combinations)."""
    values = parallel_shapes.before_spec(args)
    return parallel_shapes.after_spec(spec_from_args(args), args, values)


def record_rank(spec, parallel, steps, dynamic=(), argv=(),
                command="./loom record-cpu"):
    """record_steps with `parallel`'s optimizer, then its ZeRO rewrite;
    returns a parallel_shapes.Recording (`.trace`, `.summary()`,
    `.write(path)`)."""
    found = []
    recorder = record_steps(spec, steps, dynamic, argv, command=command,
                            prepare=parallel_shapes.preparer(parallel, found))
    return parallel_shapes.finish(recorder.trace, parallel, found[0])


def provenance(argv, spec, config, command="./loom record-cpu"):
    """The trace header: the exact command, versions, the step and the
    config's sizes."""
    import platform  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    import loom  # pylint: disable=import-outside-toplevel
    sizes = {k: getattr(config, k) for k in sorted(config.to_dict())
             if isinstance(getattr(config, k, None), (int, float, bool))
             and not k.startswith("_") and k not in ("transformers_version",)}
    schedule = spec.schedule
    if schedule == "interleaved":
        schedule += f":{spec.chunks}"
    text = (f"{command} {shlex.join(argv)} | loom "
            f"{loom.__version__}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, python "
            f"{platform.python_version()} | {spec.model_type} random weights "
            f"(seed {spec.seed}), no data; schedule {schedule}"
            f", stages {spec.stages}, rank {spec.rank}, microbatches "
            f"{spec.microbatches}, batch {spec.batch}, seq {spec.seq}, dtype "
            f"{spec.dtype}, recompute {spec.recompute}, "
            f"{'real arithmetic' if spec.real else 'FakeTensors (no data)'}"
            f", stream 0 | config "
            f"{sizes}")
    return text[:60000]


def main(argv):
    """`loom record-cpu`; returns the exit status."""
    argv = list(argv)
    try:
        args = parser().parse_args(argv)
        if missing_recorder(PROG):
            return 1
        spec, parallel = rank_spec_from_args(args)
        if args.device == "cuda":
            if parallel.zero or parallel.optimizer != "adamw":
                raise cpu_models.ModelError("--device cuda records AdamW "
                                            "without --zero")
            return _record_cuda(args, spec, argv)
        return _record_cpu(args, spec, parallel, argv)
    except FAILURES as error:
        return failure_status(PROG, error)


def missing_recorder(prog):
    """0 when PyTorch and transformers import here; else prints the one line
    that says which are missing and how to get them, and returns 1."""
    missing = _extras.missing(("torch", "transformers"))
    if not missing:
        return 0
    print(_extras.message(prog, "recording a model", missing),
          file=sys.stderr)
    return 1


# What a recording command reports as one line (failure_status), not a
# traceback.
FAILURES = (cpu_models.ModelError, LoomError, loom_trace.TraceError, OSError)


def failure_status(prog, error):
    """Prints one of FAILURES as one line for `prog`; returns the exit status:
    2 for bad arguments (cpu_models.ModelError), 1 otherwise."""
    if isinstance(error, OSError):
        print(f"{prog}: {error.filename or ''}: {error.strerror}",
              file=sys.stderr)
        return 1
    print(f"{prog}: {error}", file=sys.stderr)
    return 2 if isinstance(error, cpu_models.ModelError) else 1


def _run_steps(trainer, steps):
    for index in range(steps):
        trainer.step(index)


def _record_cpu(args, spec, parallel, argv):
    started = time.time()
    recorder = record_rank(spec, parallel, args.steps, args.dynamic, argv)
    recorder.write(args.output)
    _report(args, spec, "cpu", recorder.summary(), time.time() - started,
            sharded=recorder.sharded)
    return 0


def record_steps(spec, steps, dynamic=(), argv=(),
                 command="./loom record-cpu", prepare=None):
    """Records `steps` training steps of `spec` (a cpu_models.StepSpec) on
    the CPU; returns the stopped Recorder (`.trace`, `.summary()`). The
    trace's provenance names `command` and `argv`. `prepare(trainer,
    recorder)` runs once recording has started, before the first step.
    ModelError when the model cannot be built, LoomError when a step
    fails."""
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import record_cpu
    trainer = _trainer(spec)
    recorder = record_cpu.Recorder(
        None, tensors=trainer.tracked, real=spec.real,
        cuda_workspaces=spec.cuda_workspaces,
        provenance=provenance(list(argv), spec, trainer.config, command))
    recorder.start()
    try:
        recorder.watch_modules(trainer.model, dynamic)
        if prepare is not None:
            prepare(trainer, recorder)
        trainer.sink = recorder
        _run_steps(trainer, steps)
    except LoomError:
        raise
    except Exception as error:  # pylint: disable=broad-except
        kind = type(error).__name__
        hint = ""
        if kind in ("DynamicOutputShapeException",
                    "DataDependentOutputException"):
            hint = (" (the step's sizes depend on its data, which a "
                    "recording without arithmetic does not have: record "
                    "with --real)")
        raise LoomError(f"the training step failed: {kind}: "
                        f"{' '.join(str(error).split())}{hint}") from None
    finally:
        recorder.stop()
    return recorder


def _trainer(spec):
    try:
        # pylint: disable-next=import-outside-toplevel
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()  # config advice is not for us
    except ImportError:
        pass  # Trainer says that transformers is missing
    try:
        return cpu_models.Trainer(spec)
    except (LoomError, ImportError):
        raise
    except Exception as error:  # pylint: disable=broad-except
        raise cpu_models.ModelError(
            f"model type {spec.model_type!r}: {type(error).__name__}: "
            f"{' '.join(str(error).split())}") from None


def _report(args, spec, device, summary, seconds, sharded=None):
    """The summary of the trace written: one line, or JSON (--json).
    `sharded`: what --dp/--zero shrank ({what: [bytes, shard bytes]},
    parallel_shapes.Recording.sharded), as what-if --json reports it."""
    path = args.output
    per = summary["requests_per_iteration"]
    sharded = {k: {"bytes": v[0], "shard_bytes": v[1]}
               for k, v in (sharded or {}).items()}
    if args.json:
        print(json.dumps({
            "output": path, "model": spec.model_type, "device": device,
            "requests": summary["requests"],
            "iterations": summary["iterations"],
            "requests_per_iteration": list(per),
            "peak_live_bytes": summary["peak_live_bytes"],
            "setup_bytes": summary["setup_bytes"],
            "sharded": sharded,
            "events": summary["events"], "seconds": round(seconds, 3)},
            indent=2))
        return
    shards = "".join(
        f", {what} {v['bytes']} -> {v['shard_bytes']} bytes per rank"
        for what, v in sharded.items())
    print(f"{path}: {summary['requests']} requests, {summary['iterations']} "
          f"iterations ({', '.join(str(n) for n in per)} requests each), "
          f"peak live {summary['peak_live_bytes']} bytes, set-up "
          f"{summary['setup_bytes']} bytes{shards}, {summary['events']} "
          f"events, {seconds:.1f} s")


class _LoomMarkers:
    """The markers of a step, sent to loom's run-time plugin."""

    def __init__(self, loom):
        self.loom = loom

    def begin_iteration(self):
        self.loom.begin_iteration()

    def end_iteration(self):
        self.loom.end_iteration()

    def phase(self, name):
        self.loom.phase(name)

    def module_enter(self, name, dynamic=False):
        self.loom.module_enter(name, dynamic)

    def module_exit(self, name):
        self.loom.module_exit(name)


def _record_cuda(args, spec, argv):
    """The same steps on the GPU, recorded by loom (record mode)."""
    return _record_with_loom(args, spec, argv, "cuda")


def _real(spec):
    """`spec` with real arithmetic (a step run by loom on a device)."""
    import dataclasses  # pylint: disable=import-outside-toplevel
    return dataclasses.replace(spec, real=True)


def _record_with_loom(args, spec, argv, device, **options):
    """The steps on `device`, recorded by loom's run-time plugin
    (loom.enable(mode="record", **options)) with the same markers as on
    the CPU: the module markers come from the same hooks. (A test runs it
    on the CPU with the host backend: the markers, nothing allocated.)"""
    import loom  # pylint: disable=import-outside-toplevel
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import record_cpu
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="loom-record-") as workdir:
        loom.enable(mode="record", workdir=workdir, atexit=False,
                    trace_format="text" if args.output.endswith(".ltt")
                    else "binary", **options)
        import torch  # pylint: disable=import-outside-toplevel
        spec = _real(spec)
        with torch.device(device):
            trainer = _trainer(spec)
        trainer.device = device
        markers = _LoomMarkers(loom)
        _, removers = record_cpu.hook_modules(trainer.model, markers,
                                              args.dynamic)
        trainer.sink = markers
        try:
            _run_steps(trainer, args.steps)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        except LoomError:
            raise
        except Exception as error:  # pylint: disable=broad-except
            raise LoomError(f"the training step failed: "
                            f"{type(error).__name__}: "
                            f"{' '.join(str(error).split())}") from None
        finally:
            for remove in removers:
                remove()
        loom.finish()
        files = [f for f in os.listdir(workdir) if f.startswith("trace.")
                 and not f.endswith(".json")]
        if not files:
            raise LoomError(f"loom wrote no trace ({loom.status()})")
        trace = loom_trace.read_trace(os.path.join(workdir, files[0]))
        trace.provenance = provenance(argv, spec, trainer.config) + \
            f" | recorded on {device} by loom (record mode)"
        loom_trace.write_trace(trace, args.output)
        summary = record_cpu.summarize(trace.events)
        _report(args, spec, device, summary, time.time() - started)
    return 0
