"""loom against PyTorch's allocators in real training, on a GPU.

    compare.py run --out DIR [--models m1,m2] [--allocators a1,a2]
                   [--steps 50] [--warmup 10] [--search] [--fidelity]
                   [--traces] [--scale full|tiny] [--budget SECONDS]
    compare.py table RESULTS.jsonl... [--driver-costs FILE] [--command TEXT]
    compare.py unpack-traces TARBALL --into DIR

`run` (on the GPU machine) trains each model (bench/gpu/train/models.py)
under each allocator, one fresh process per run (worker.py), and appends a
JSON line per run to DIR/results.jsonl. It exits 1, listing why on stderr
and in DIR/failures.txt, unless every run finished and every loom measure
run served its plan (a run in fallback is a failure, with its reason):
  - "measure": --warmup steps, then --steps timed steps at the model's
    default micro-batch: peak allocated and reserved, efficiency, median
    step time, loom's driver calls and plan hit rate in the timed steps;
  - "probe" / "largest" (--search): the largest micro-batch that runs, by
    doubling from the default then bisecting, 2 timed steps per probe;
  - "fidelity" (--fidelity): a short run under torch and under expandable
    with PyTorch's allocation history recorded from process start, the
    snapshot imported (python3 -m loom import) and replayed by loom_tool
    compare's simulators, their peak reserved against the real one;
  - "skipped": what --budget seconds left no time for.
--rounds N measures every model N times per allocator, one process each,
the allocators in a rotated order each round, and writes DIR/ab.md
(ab.py): each allocator's median step against torch's and expandable
segments' with a 95% interval over rounds and steps, and the step-time
targets' verdicts (met, missed, undecided).
--profile-steps N adds N profiled steps to each measure run (worker.py,
profile_steps.py) and writes DIR/steptime.md (steptime.py) and
DIR/profiles.tar.xz (each run's GPU activities and step annotations).
--allocators may name loom's layout variants (models.LOOM_VARIANTS) and
loom-plan, loom in plan mode with --plans DIR: each model's plan file
DIR/<model>.lplan, made beforehand (`loom plan`) from another run's
recording (tests/gpu/run_gpu.sh pack makes them from
bench/data/traces/gpu/h200_auto_2026-11-26/); a model without one is a
failed run that says so. loom-remember is auto mode with remember=True
measured on a job's second run: a first process of the model ("prime",
1 step, not in the table) leaves its whole-run plan in a workdir the
measured process shares. --seed N trains every model from another seed
(weights and data, other than the recordings').
--traces packs loom's recorded traces and the snapshots into
DIR/traces.tar.xz (for bench/data/traces/gpu, with unpack-traces).

`table` (anywhere) turns result files into bench/results/gpu.md (table.py):
the environment, the driver costs (bench/gpu/driver_costs --json), the
training table, the issue's targets with met / not met, the fidelity table.
Only the workers need torch; tested on CPU with a fake worker (--worker).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
import models  # noqa: E402  pylint: disable=wrong-import-position
from models import ALLOCATORS, ALL_ALLOCATORS  # noqa: E402  pylint: disable=wrong-import-position
from table import make_table, read_results, recipe_failures  # noqa: E402  pylint: disable=wrong-import-position
from steptime import make_steptime  # noqa: E402  pylint: disable=wrong-import-position
from ab import make_ab  # noqa: E402  pylint: disable=wrong-import-position
SIMULATED = {"torch": "pytorch", "expandable": "pytorch_expandable"}


# ------------------------------------------------------------------- run


class Runner:
    """Runs workers and appends their results to DIR/results.jsonl."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = self.out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.results = self.out / "results.jsonl"
        self.deadline = time.monotonic() + args.budget
        self.count = 0

    def left(self):
        return self.deadline - time.monotonic()

    def record(self, line):
        with self.results.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line, default=str) + "\n")

    def env(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "torch_plugin"),
                          env.get("PYTHONPATH", "")]))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def worker(self, kind, model, allocator, *, micro_batch=None, steps,
               warmup, snapshot=None, extra=(), tags=None, workdir=None):
        """One worker run; returns its result dict (also recorded, with
        `tags` added). `workdir`: loom's, shared by runs (default: the
        run's own)."""
        self.count += 1
        tag = f"{self.count:03d}-{model}-{allocator}"
        out = self.work / f"{tag}.json"
        workdir = workdir or self.work / f"{tag}.loom"
        command = [sys.executable, str(self.args.worker), "--model", model,
                   "--allocator", allocator, "--steps", str(steps),
                   "--warmup", str(warmup), "--out", str(out),
                   "--workdir", str(workdir), "--scale", self.args.scale,
                   *extra]
        if self.args.seed is not None:
            command += ["--seed", str(self.args.seed)]
        if micro_batch is not None:
            command += ["--micro-batch", str(micro_batch)]
        if snapshot is not None:
            command += ["--snapshot", str(snapshot)]
        timeout = max(10.0, min(self.args.run_timeout, self.left()))
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  env=self.env(), timeout=timeout,
                                  check=False)
            returncode, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as error:
            returncode = None
            stderr = f"timed out after {timeout:.0f} s\n{error.stderr or ''}"
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError):
            result = {"model": model, "allocator": allocator}
        result.update(kind=kind, returncode=returncode,
                      wall_s=time.monotonic() - started, workdir=str(workdir),
                      **(tags or {}))
        if returncode != 0 and "error" not in result:
            result["error"] = (stderr or "")[-4000:]
        if kind == "probe":
            result.pop("step_seconds", None)
        self.record(result)
        print(f"{kind:9s} {model:18s} {allocator:10s} mb="
              f"{result.get('micro_batch')} -> "
              f"{'OOM' if result.get('oom') else 'error' if result.get('error') else 'ok'}"
              f" ({result['wall_s']:.0f} s)", flush=True)
        return result

    def skipped(self, what, model, allocator):
        self.record({"kind": "skipped", "what": what, "model": model,
                     "allocator": allocator})
        print(f"skipped   {model:18s} {allocator:10s} {what}: out of budget",
              flush=True)


def fits(result):
    """True: the run finished; False: out of memory; raises otherwise."""
    if result.get("oom"):
        return False
    if result.get("error") or result.get("returncode") != 0:
        raise RuntimeError(f"{result.get('model')}/{result.get('allocator')} "
                           f"failed: {str(result.get('error'))[-800:]}")
    return True


def largest_fitting(probe, start, limit):
    """The largest n in [1, limit] with probe(n) true, assuming probe is
    monotone (fits up to some size, not beyond), starting at `start`:
    doubles up while it fits, halves down while it does not, then bisects.
    Returns (largest or 0, {n: fits})."""
    seen = {}

    def check(n):
        if n not in seen:
            seen[n] = probe(n)
        return seen[n]

    n = max(1, min(start, limit))
    if check(n):
        low, high = n, None
        while high is None and low < limit:
            n = min(2 * low, limit)
            if check(n):
                low = n
            else:
                high = n
        if high is None:
            return low, seen
    else:
        low, high = 0, n
        while high > 1:
            n = high // 2
            if check(n):
                low = n
                break
            high = n
        if low == 0:
            return 0, seen
    while high - low > 1:
        n = (low + high) // 2
        if check(n):
            low = n
        else:
            high = n
    return low, seen


def rotated(allocators, shift):
    """The allocators' order in round `shift`: rotated by `shift`, so each
    one runs first, second, ... in turn."""
    shift %= len(allocators)
    return list(allocators[shift:]) + list(allocators[:shift])


def plan_options(runner, model, allocator):
    """The worker's --plan for loom-plan (others: none). Raises
    FileNotFoundError when --plans has no plan for the model."""
    if allocator != models.PLANNED:
        return []
    plans = runner.args.plans
    plan = Path(plans) / f"{model}.lplan" if plans else None
    if plan is None or not plan.is_file():
        raise FileNotFoundError(
            f"loom-plan: no plan file for {model} "
            f"({plan if plan else 'compare.py run --plans DIR not given'})")
    return ["--plan", str(plan)]


def no_plan(runner, kind, model, allocator, error):
    """Records a loom-plan run that could not start: no plan file."""
    runner.record({"kind": kind, "model": model, "allocator": allocator,
                   "returncode": 2, "error": str(error)})
    print(f"{kind:9s} {model:18s} {allocator:10s} -> {error}")


def measure(runner, model, allocators, round_=None):
    args = runner.args
    tags = None if round_ is None else {"round": round_}
    for allocator in allocators:
        if runner.left() < 30:
            runner.skipped("measure", model, allocator)
            continue
        try:
            extra = plan_options(runner, model, allocator)
        except FileNotFoundError as error:
            no_plan(runner, "measure", model, allocator, error)
            continue
        if args.profile_steps:
            profiles = runner.out / "profiles"
            profiles.mkdir(exist_ok=True)
            extra += ["--profile-steps", str(args.profile_steps),
                      "--profile-trace",
                      str(profiles / f"{model}.{allocator}.json.gz")]
        workdir = None
        if allocator == models.REMEMBERED:
            # The first run of the job, which leaves its plan: not measured.
            workdir = runner.work / f"{model}.remember.{round_ or 0}.loom"
            prime = runner.worker("prime", model, allocator, steps=1,
                                  warmup=0, extra=extra, tags=tags,
                                  workdir=workdir)
            if prime.get("returncode") != 0:
                continue  # a failure recipe_failures reports (kind prime)
            if runner.left() < 30:
                runner.skipped("measure", model, allocator)
                continue
        runner.worker("measure", model, allocator, steps=args.steps,
                      warmup=args.warmup, extra=extra, tags=tags,
                      workdir=workdir)


def search(runner, model, allocators):
    args = runner.args
    default = models.spec(model, args.scale).micro_batch
    for allocator in allocators:
        try:
            # loom-plan probes other micro-batches with the default one's
            # plan: what a user who changed the micro-batch and kept the
            # plan would get.
            planned = plan_options(runner, model, allocator)
        except FileNotFoundError as error:
            no_plan(runner, "largest", model, allocator, error)
            continue
        record = ["--record-iterations", "2"] \
            if models.is_loom(allocator) and not planned else []

        def probe(n, allocator=allocator, extra=tuple(planned + record)):
            if runner.left() < 30:
                raise TimeoutError("out of budget")
            return fits(runner.worker(
                "probe", model, allocator, micro_batch=n, steps=2, warmup=1,
                extra=list(extra)))
        try:
            largest, seen = largest_fitting(probe, default,
                                            args.max_micro_batch)
        except TimeoutError:
            runner.skipped("search", model, allocator)
            continue
        except RuntimeError as error:
            runner.record({"kind": "largest", "model": model,
                           "allocator": allocator, "error": str(error)})
            continue
        runner.record({"kind": "largest", "model": model,
                       "allocator": allocator, "largest": largest,
                       "limit": args.max_micro_batch,
                       "probes": {str(k): v for k, v in sorted(seen.items())}})


def simulate(snapshot, capacity, env, tool):
    """loom_tool compare's rows on a snapshot (imported to a text trace)."""
    trace = snapshot.with_suffix(".ltt")
    done = subprocess.run(
        [sys.executable, "-m", "loom", "import", str(snapshot), "-o",
         str(trace)], capture_output=True, text=True, env=env, check=False,
        timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"loom import failed: {done.stderr[-2000:]}")
    command = [str(tool), "compare", str(trace), "--json", "--allocators",
               "pytorch,pytorch_expandable,loom", "--loom-time-limit", "10"]
    if capacity:
        command += ["--capacity", str(capacity)]
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"loom_tool compare failed: {done.stderr[-2000:]}")
    trace.unlink()
    return {row["allocator"]: row for row in json.loads(done.stdout)}


def fidelity_line(real, rows):
    """The fidelity record of one real run and the simulators' rows."""
    allocator = real["allocator"]
    simulated = rows[SIMULATED[allocator]]
    real_reserved = real["reserved_bytes.all.peak"]
    return {
        "kind": "fidelity", "model": real["model"], "allocator": allocator,
        "micro_batch": real.get("micro_batch"),
        "real_peak_reserved": real_reserved,
        "real_peak_allocated": real["allocated_bytes.all.peak"],
        "simulated_peak_reserved": simulated["peak_reserved_bytes"],
        "simulated_peak_allocated": simulated["peak_allocated_bytes"],
        "relative_error": (simulated["peak_reserved_bytes"] -
                           real_reserved) / real_reserved
        if real_reserved else None,
        "simulated": {name: {"peak_reserved": row["peak_reserved_bytes"],
                             "efficiency": row["efficiency"]}
                      for name, row in rows.items()},
    }


def fidelity(runner, model, traces):
    args = runner.args
    sys.path.insert(0, str(ROOT / "torch_plugin"))
    from loom import _paths  # pylint: disable=import-outside-toplevel
    tool = _paths.loom_tool()
    for allocator in ("torch", "expandable"):
        if allocator not in args.allocators:
            continue
        if runner.left() < 60:
            runner.skipped("fidelity", model, allocator)
            continue
        snapshot = traces / f"{model}.{allocator}.pickle"
        real = runner.worker("snapshot", model, allocator, steps=4, warmup=1,
                             snapshot=snapshot)
        try:
            if not fits(real):
                raise RuntimeError(f"out of memory at micro-batch "
                                   f"{real.get('micro_batch')}")
            rows = simulate(snapshot, real.get("env", {}).get(
                "gpu_memory_bytes"), runner.env(), tool)
        except RuntimeError as error:
            runner.record({"kind": "fidelity", "model": model,
                           "allocator": allocator, "error": str(error)})
            continue
        runner.record(fidelity_line(real, rows))


def keep_loom_trace(runner, model, traces):
    """Copies the trace files of the model's loom measure run (the trace
    and its fingerprint) into `traces`."""
    for line in read_results([runner.results]):
        if (line.get("kind") == "measure" and line.get("model") == model
                and line.get("allocator") == "loom" and line.get("trace")):
            trace = Path(line["trace"])
            for path in sorted(trace.parent.glob(trace.name + "*")):
                shutil.copy(path, traces / f"{model}.loom.{path.name}")


def pack_traces(traces, tarball, limit=15 << 20):
    """traces/* -> tarball (xz); the largest files are left out until it
    fits in `limit` bytes (what the GPU tool brings back). Returns the names
    left out."""
    files = sorted(traces.iterdir(), key=lambda p: p.stat().st_size)
    left_out = []
    while True:
        with tarfile.open(tarball, "w:xz") as tar:
            for path in files:
                tar.add(path, arcname=path.name)
        if tarball.stat().st_size <= limit or not files:
            return left_out
        left_out.append(files.pop().name)


def cmd_run(args):
    if args.rounds < 1:
        raise SystemExit(f"--rounds: at least 1, not {args.rounds}")
    args.models = parse_list(args.models, models.MODEL_NAMES, "model")
    args.allocators = parse_list(args.allocators, models.ALLOCATORS,
                                 "allocator", ALL_ALLOCATORS)
    runner = Runner(args)
    traces = runner.out / "traces"
    traces.mkdir(exist_ok=True)
    runner.record({"kind": "run", "argv": sys.argv[1:],
                   "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                   "host": os.uname().nodename})
    for model in args.models:
        if args.rounds > 1:
            for round_ in range(args.rounds):
                measure(runner, model, rotated(args.allocators, round_),
                        round_)
        else:
            measure(runner, model, args.allocators)
        if args.traces:
            keep_loom_trace(runner, model, traces)
        if args.search:
            search(runner, model, args.allocators)
        if args.fidelity:
            fidelity(runner, model, traces)
    if args.traces and any(traces.iterdir()):
        left_out = pack_traces(traces, runner.out / "traces.tar.xz")
        runner.record({"kind": "traces", "left_out": left_out})
    if not args.keep_work:
        shutil.rmtree(runner.work, ignore_errors=True)
        shutil.rmtree(traces, ignore_errors=True)
    lines = read_results([runner.results])
    table = make_table(lines)
    (runner.out / "gpu.md").write_text(table)
    print(table)
    if args.profile_steps:
        profiles = runner.out / "profiles"
        if profiles.is_dir() and any(profiles.iterdir()):
            pack_traces(profiles, runner.out / "profiles.tar.xz")
            shutil.rmtree(profiles, ignore_errors=True)
        text = make_steptime(lines)
        (runner.out / "steptime.md").write_text(text)
        print(text)
    if args.rounds > 1:
        text = make_ab(lines)
        (runner.out / "ab.md").write_text(text)
        print(text)
    # Loud: anything short of every run measured and every loom run served
    # from its plan fails the run (exit 1), and says why.
    failures = recipe_failures(lines)
    if failures:
        (runner.out / "failures.txt").write_text("\n".join(failures) + "\n")
        print(f"FAILED: {len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    return 0


def parse_list(text, default, what, allowed=None):
    """Names from "a,b,c" (empty: `default`), each one of `allowed`
    (default: `default`)."""
    allowed = allowed or default
    names = [n for n in (text or "").split(",") if n] or list(default)
    for name in names:
        if name not in allowed:
            raise SystemExit(f"unknown {what} {name!r} ({', '.join(allowed)})")
    return names


def cmd_table(args):
    costs = None
    if args.driver_costs:
        costs = json.loads(Path(args.driver_costs).read_text())
    sys.stdout.write(make_table(read_results(args.results), costs,
                                args.command))
    return 0


def cmd_unpack(args):
    into = Path(args.into)
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.tarball, "r:xz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or \
                    member.name.startswith("."):
                raise SystemExit(f"{args.tarball}: unexpected member "
                                 f"{member.name!r}")
        for member in tar.getmembers():
            target = into / member.name
            with tar.extractfile(member) as source, \
                    open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
            print(target)
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="loom against PyTorch's allocators in real training")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    run = sub.add_parser("run", help="train and measure (GPU machine)")
    run.add_argument("--out", required=True)
    run.add_argument("--models", default="")
    run.add_argument("--allocators", default="")
    run.add_argument("--steps", type=int, default=50)
    run.add_argument("--warmup", type=int, default=10)
    run.add_argument("--search", action="store_true")
    run.add_argument("--max-micro-batch", type=int, default=64)
    run.add_argument("--fidelity", action="store_true")
    run.add_argument("--traces", action="store_true")
    run.add_argument("--profile-steps", type=int, default=0,
                     help="profile N steps after the timed ones "
                     "(torch.profiler, CUDA activity): DIR/steptime.md, "
                     "DIR/profiles.tar.xz")
    run.add_argument("--rounds", type=int, default=1,
                     help="measure each model N times per allocator, in "
                     "rotated orders: DIR/ab.md (ratios with intervals)")
    run.add_argument("--scale", choices=("full", "tiny"), default="full")
    run.add_argument("--budget", type=float, default=540,
                     help="seconds; runs that would start later are skipped")
    run.add_argument("--run-timeout", type=float, default=400)
    run.add_argument("--keep-work", action="store_true")
    run.add_argument("--plans", default=None,
                     help="loom-plan's plan files: DIR/<model>.lplan")
    run.add_argument("--seed", type=int, default=None,
                     help="the workers' seed (weights and data; default "
                     "the worker's, that of the recorded traces)")
    run.add_argument("--worker", default=str(HERE / "worker.py"),
                     help=argparse.SUPPRESS)
    table = sub.add_parser("table", help="results -> bench/results/gpu.md")
    table.add_argument("results", nargs="+")
    table.add_argument("--driver-costs")
    table.add_argument("--command")
    unpack = sub.add_parser("unpack-traces", help="traces.tar.xz -> DIR")
    unpack.add_argument("tarball")
    unpack.add_argument("--into", required=True)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return {"run": cmd_run, "table": cmd_table,
            "unpack-traces": cmd_unpack}[args.subcommand](args)


if __name__ == "__main__":
    sys.exit(main())
