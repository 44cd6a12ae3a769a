"""Host time of loom's markers in a training step, on the CPU (issue 21).

    python3 bench/gpu/train/markers_host.py [--model moe] [--layers N]
        [--dims V,W,L,H,KV,FFN] [--micro-batch N] [--seq N]
        [--experts IMPL] [--dynamic P,...] [--steps N] [--rounds N]
        [--baseline DIR] [--package DIR] [--out FILE]

Builds the model of the GPU comparison (models.build, device="cpu") with
tiny widths (--dims; by default so small that the step is host work, as
on a host-bound GPU) and the full model's layer count (--layers), so the
number of hooked module calls per step is the GPU run's; enables loom on
the host backend (libloom configured, recording stopped at once as after
auto mode's switch to the plan, so its markers cost what they cost on a
planned GPU run) and times training steps in alternating blocks:

  plain    loom enabled, nothing watched (CPU tensors never reach libloom,
           so this is the model without loom);
  watched  loom.watch(model, dynamic=models.dynamic_modules(spec)) and
           loom.watch(optimizer), as worker.py does;
  watched_baseline  (--baseline DIR) the same with another version's
           markers.py and _native.py (DIR: its loom package, e.g. from
           `git archive REV torch_plugin/loom | tar -x -C /tmp/old`, then
           DIR=/tmp/old/torch_plugin/loom), the session's Native swapped
           for the old one's during those steps: a before/after comparison
           in one process, where the machine's drift cannot tell them
           apart.

Each round runs --steps steps of each (the order alternates between
rounds); the report gives the median step of each, in wall time and in the
main thread's CPU time (torch runs one thread; the CPU time is what counts
on a shared machine, where other processes take the cores at random), and
their difference. Then one watched step with libloom's marker calls
counted (iteration begin/end, phase, module enter/exit, by name), and the
CPU cost of one marker call at each layer (the bare ctypes call into
libloom; Native's method, which encodes the name; the Session's, with its
lock and nesting stack) and of the hooks per module call, from a toy model
(a dynamic module around an act_fn, forward and backward) timed bare, with
no-op module hooks, and watched: root only, the module, the module and its
child. Configurations take turns in short blocks and the medians are
reported.

Prints a JSON report (and writes it to --out).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import models  # noqa: E402  pylint: disable=wrong-import-position

MARKERS = ("iteration_begin", "iteration_end", "phase", "module_enter",
           "module_exit")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="moe",
                        choices=("moe", "llama1b", "llama1b_recompute"))
    parser.add_argument("--layers", type=int, default=None,
                        help="layer count (default: the full model's)")
    parser.add_argument("--dims", default="256,32,0,2,1,64",
                        help="vocab,width,layers,heads,kv_heads,ffn (layers "
                        "0: --layers); the default is tiny enough that the "
                        "step is host work, as on a host-bound GPU")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="another version's loom package directory: its "
                        "markers.py and _native.py make a third "
                        "configuration, watched_baseline, taking turns with "
                        "the others in this process")
    parser.add_argument("--package", default=None,
                        help="the directory holding the `loom` package "
                        "(default: this checkout's torch_plugin/), e.g. an "
                        "older version's, for a before/after comparison")
    parser.add_argument("--experts", default=None,
                        help="transformers' experts_implementation "
                        "(default: transformers' own, grouped_mm)")
    parser.add_argument("--dynamic", default=None,
                        help="comma-separated dynamic patterns (default: "
                        "models.dynamic_modules)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--micro-iterations", type=int, default=4000)
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def model_spec(args):
    full = models.spec(args.model, "full")
    spec = models.spec(args.model, "tiny")
    dims = [int(d) for d in args.dims.split(",")]
    if len(dims) != 6:
        raise SystemExit("--dims takes 6 numbers")
    dims[2] = dims[2] or args.layers or full.dims[2]
    return dataclasses.replace(spec, dims=tuple(dims), seq=args.seq,
                               micro_batch=args.micro_batch)


def build(torch, args, spec):
    trainer = models.build(torch, spec, spec.micro_batch, device="cpu")
    if args.experts:
        trainer.model.set_experts_implementation(args.experts)
    return trainer


class Counter:
    """Counts the calls to `native`'s marker methods (instance attributes
    shadow the class's; remove() takes them off), by method and name."""

    def __init__(self, native):
        self.native = native
        self.counts = {}

    def install(self):
        for method in MARKERS:
            original = getattr(type(self.native), method)

            def counted(*args, _m=method, _f=original):
                key = _m if _m.startswith("iteration") else \
                    f"{_m}:{args[0]}"
                self.counts[key] = self.counts.get(key, 0) + 1
                return _f(self.native, *args)

            setattr(self.native, method, counted)

    def remove(self):
        for method in MARKERS:
            self.native.__dict__.pop(method, None)

    def by_kind(self):
        out = dict.fromkeys(MARKERS, 0)
        for key, count in self.counts.items():
            out[key.split(":")[0]] += count
        return out


def clock():
    """(wall, this thread's CPU) seconds: the CPU time leaves out what
    other processes take from a shared machine's cores (torch runs one
    thread here, and autograd on the CPU runs on the calling thread)."""
    return time.perf_counter(), time.thread_time()


def time_steps(trainer, steps, start, out):
    for i in range(steps):
        wall, cpu = clock()
        trainer.step(start + i)
        wall2, cpu2 = clock()
        out["wall"].append(wall2 - wall)
        out["cpu"].append(cpu2 - cpu)


def watch(markers, trainer, patterns):
    return [markers.watch(trainer.model, dynamic=patterns),
            markers.watch(trainer.optimizer)]


def step_times(configs, trainer, args, patterns):
    """Steps under each configuration (name -> the markers module whose
    watch() to use, None: nothing watched), taking turns in blocks of
    --steps (the order rotates each round); returns the times."""
    times = {c: {"wall": [], "cpu": []} for c in configs}
    scratch = {"wall": [], "cpu": []}
    step = 0
    names = list(configs)
    for round_ in range(-1, args.rounds):  # round -1: the warm-up
        shift = max(round_, 0) % len(names)
        for config in names[shift:] + names[:shift]:
            markers = configs[config]
            getattr(markers, "begin", nothing)()
            handles = watch(markers, trainer, patterns) if markers else []
            out = times[config] if round_ >= 0 else scratch
            count = args.steps if round_ >= 0 else args.warmup
            time_steps(trainer, count, step, out)
            step += count
            for handle in handles:
                handle.remove()
            getattr(markers, "end", nothing)()
    return times


def count_markers(markers, session, trainer, patterns):
    """libloom's marker calls in one step watched by `markers` (after a
    step to settle the open iteration)."""
    getattr(markers, "begin", nothing)()
    handles = watch(markers, trainer, patterns)
    trainer.step(0)
    counter = Counter(session.native)
    counter.install()
    try:
        trainer.step(1)
    finally:
        counter.remove()
        for handle in handles:
            handle.remove()
        getattr(markers, "end", nothing)()
    return {"total": sum(counter.counts.values()),
            "by_kind": counter.by_kind(),
            "by_name": dict(sorted(counter.counts.items())),
            "dynamic_modules": handles[0].dynamic_modules,
            "nested_modules": getattr(handles[0], "nested_modules", [])}


def interleaved(configs, iterations, rounds=15):
    """Median microseconds of CPU time per call of each configuration's
    function: `configs` maps a name to (set_up, function, tear_down); the
    configurations take turns, `iterations` calls at a time."""
    samples = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (set_up, function, tear_down) in configs.items():
            state = set_up()
            function()  # first call outside the clock
            _, t0 = clock()
            for _ in range(iterations):
                function()
            _, t1 = clock()
            tear_down(state)
            samples[name].append((t1 - t0) / iterations * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def nothing():
    return None


def marker_costs(loom, session, torch, iterations):
    """Microseconds (CPU) per marker call at each layer, and per hooked
    module call (forward and backward of a toy model shaped like
    transformers' experts: a dynamic module around an act_fn)."""
    native = session.native
    enter, leave = native.lib.loom_module_enter, native.lib.loom_module_exit
    name = "model.layers.0.mlp.experts"
    raw = name.encode()
    calls = interleaved({
        "ctypes_enter_exit_pair": (nothing, lambda: (enter(raw, 1),
                                                     leave(raw)),
                                   lambda _: None),
        "native_enter_exit_pair": (nothing, lambda: (
            native.module_enter(name, True), native.module_exit(name)),
            lambda _: None),
        "session_enter_exit_pair": (nothing, lambda: (
            session.module_enter(name, True), session.module_exit(name)),
            lambda _: None),
        "session_phase": (nothing, lambda: session.phase("forward"),
                          lambda _: None),
    }, iterations)

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act_fn = torch.nn.SiLU()

        def forward(self, x):
            return self.act_fn(x) * 2

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = Experts()

        def forward(self, x):
            return self.experts(x)

    model = Model()
    weight = torch.randn(4, 4, requires_grad=True)

    def run():  # a fresh non-leaf input, as a layer's activations are
        model(weight * 1.0).sum().backward()

    def watching(patterns):
        return (lambda: loom.watch(model, dynamic=patterns), run,
                lambda handle: handle.remove())

    def noop_hooks():
        experts = model.experts
        return [experts.register_forward_pre_hook(lambda *_: None),
                experts.register_forward_hook(lambda *_: None)]

    toy = interleaved({
        "bare": (nothing, run, lambda _: None),
        "noop_module_hooks": (noop_hooks, run,
                              lambda hs: [h.remove() for h in hs]),
        "root_only": watching([]),
        "experts": watching(["experts"]),
        "experts_and_children": watching(["experts", "experts.*"]),
    }, max(iterations // 20, 100))
    return {"calls_us": calls, "toy_forward_backward_us": toy,
            "per_dynamic_module_us": toy["experts"] - toy["root_only"],
            "nested_child_us": toy["experts_and_children"] -
            toy["experts"]}


def load_module(path, name):
    """Another version's loom module at `path` (its `from loom import ...`
    find this process's loom: it marks into this session)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Baseline:
    """watch() of another version, with its Native in the session while
    its hooks are on."""

    def __init__(self, directory, session):
        directory = Path(directory)
        self.markers = load_module(directory / "markers.py",
                                   "baseline_markers")
        native = load_module(directory / "_native.py", "baseline_native")
        self.native = native.Native(session.native.path)  # same libloom
        self.session = session

    def watch(self, obj, **kwargs):
        return self.markers.watch(obj, **kwargs)

    def begin(self):
        self.saved, self.session.native = self.session.native, self.native

    def end(self):
        self.session.native = self.saved


def git_commit():
    try:
        return subprocess.run(["git", "-C", str(HERE), "describe", "--always",
                               "--dirty"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv):
    args = parse_args(argv)
    sys.path.insert(0, args.package or str(HERE.parents[2] / "torch_plugin"))
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    import loom  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)  # no OpenMP spinning against a busy core
    workdir = tempfile.mkdtemp(prefix="loom-markers-")
    loom.enable(mode="record", backend="host", workdir=workdir,
                granularity="64KiB", device_memory="1GiB", atexit=False)
    # This benchmark times loom's internals: the session and its Native.
    from loom import _state  # pylint: disable=import-outside-toplevel
    session = _state.current()
    native = session.native
    native.free(native.malloc(64, 0, None), 64, 0, None)  # the allocator
    native.stop_recording()  # as after auto mode's switch to the plan
    spec = model_spec(args)
    trainer = build(torch, args, spec)
    patterns = args.dynamic.split(",") if args.dynamic else \
        models.dynamic_modules(spec)
    configs = {"plain": None, "watched": loom}
    if args.baseline:
        configs["watched_baseline"] = Baseline(args.baseline, session)
    times = step_times(configs, trainer, args, patterns)
    median = {c: {k: 1e3 * statistics.median(v) for k, v in t.items()}
              for c, t in times.items()}
    plain, watched = median["plain"]["cpu"], median["watched"]["cpu"]
    report = {
        "machine": f"{platform.node()} {platform.machine()}, "
                   f"{os.cpu_count()} CPUs",
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "commit": git_commit(),
        "loom_package": str(Path(_state.__file__).parent),
        "model": args.model, "layers": spec.dims[2],
        "dims": spec.dims, "micro_batch": spec.micro_batch, "seq": spec.seq,
        "experts": getattr(trainer.model.config, "_experts_implementation",
                           None),
        "patterns": patterns, "steps_per_config": len(times["plain"]["cpu"]),
        "median_step_ms": median,
        "markers_ms_per_step": watched - plain,
        "markers_share": (watched - plain) / plain,
        "baseline_markers_ms_per_step":
            median["watched_baseline"]["cpu"] - plain
            if args.baseline else None,
        "step_ms": {c: {k: [round(1e3 * x, 3) for x in v]
                        for k, v in t.items()} for c, t in times.items()},
        "markers_per_step": count_markers(loom, session, trainer,
                                          patterns),
        "baseline_markers_per_step": count_markers(
            configs["watched_baseline"], session, trainer, patterns)
        if args.baseline else None,
        "cost": marker_costs(loom, session, torch, args.micro_iterations),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
