"""The GPU comparison's results as Markdown (bench/results/gpu.md).

`make_table(lines, driver_costs, command)` turns the JSON lines that
`compare.py run` writes (one per run: kind measure, probe, largest,
fidelity, skipped, run, traces) into: the environment and commands, the
driver costs (bench/gpu/driver_costs --json), the training table, the
issue's targets with met / not met, the simulator-fidelity table, and the
failures and gaps. The last line of a kind per (model, allocator) wins, so
results of several runs can be merged. No torch.
"""

import json

import models
from models import ALL_ALLOCATORS as ALLOCATORS, is_loom

GiB = 1 << 30


def read_results(paths):
    lines = []
    for path in paths:
        with open(path, encoding="utf-8") as source:
            for number, text in enumerate(source, 1):
                if not text.strip():
                    continue
                try:
                    lines.append(json.loads(text))
                except ValueError as error:
                    raise SystemExit(f"{path}:{number}: not JSON ({error})")
    return lines


def gib(n):
    return "—" if n is None else f"{n / GiB:.2f} GiB"


def pct(x, digits=2):
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def latest(lines, kind):
    """The last line of `kind` per (model, allocator)."""
    chosen = {}
    for line in lines:
        if line.get("kind") == kind:
            chosen[(line.get("model"), line.get("allocator"))] = line
    return chosen


def rank(key):
    """Sort key of a (model, allocator): the order they are declared in."""
    model, allocator = key
    m = models.MODEL_NAMES.index(model) if model in models.MODEL_NAMES else 99
    a = ALLOCATORS.index(allocator) if allocator in ALLOCATORS else 99
    return m, a


def order(keys):
    return sorted(keys, key=rank)


def environment_lines(lines, driver_costs):
    env = next((l["env"] for l in reversed(lines) if l.get("env")), {})
    runs = [l for l in lines if l.get("kind") == "run"]
    out = []
    if runs:
        out.append(f"- date: {', '.join(sorted({r['date'] for r in runs}))}")
    if env:
        out.append(f"- GPU: {env.get('gpu')}, "
                   f"{gib(env.get('gpu_memory_bytes'))}")
        out.append(f"- PyTorch {env.get('torch')}, CUDA {env.get('cuda')}, "
                   f"Python {env.get('python')}")
    if driver_costs:
        out.append(f"- driver version: {driver_costs.get('driver_version')}")
    for run in runs:
        out.append(f"- command: `bench/gpu/train/compare.py "
                   f"{' '.join(run['argv'])}`")
    return out


def driver_cost_lines(costs):
    out = ["## Driver costs (bench/gpu/driver_costs)", "",
           f"Granularity: {costs['granularity_minimum']} bytes minimum, "
           f"{costs['granularity_recommended']} recommended; "
           f"{costs['rounds']} rounds per size.", "",
           "| bytes | call | median µs | p99 µs |", "|---:|---|---:|---:|"]
    for size in costs["sizes"]:
        for call, figures in size.items():
            if call == "bytes":
                continue
            out.append(f"| {size['bytes']:,} | {call} | "
                       f"{figures['median_us']:.1f} | "
                       f"{figures['p99_us']:.1f} |")
    return out + [""]


def training_lines(lines):
    measured = latest(lines, "measure")
    largest = latest(lines, "largest")
    out = ["## Training memory and speed", "",
           "Peak allocated and reserved over the whole process; efficiency = "
           "peak allocated / peak reserved; step time is the median of the "
           "timed steps after warm-up, and its ratio to PyTorch's allocator "
           "in the same run; loom's driver calls and plan hit rate count the "
           "timed steps only.", "",
           "| model | allocator | micro-batch | peak allocated | peak reserved"
           " | efficiency | median step | vs torch | driver calls/step | "
           "hit rate | largest micro-batch |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = order(set(measured) | set(largest))
    for model, allocator in keys:
        m = measured.get((model, allocator), {})
        base = measured.get((model, "torch"), {})
        ratio = None
        if m.get("median_step_s") and base.get("median_step_s"):
            ratio = m["median_step_s"] / base["median_step_s"]
        big = largest.get((model, allocator), {})
        big_text = "—"
        if "largest" in big:
            big_text = str(big["largest"])
            if big["largest"] >= big.get("limit", 1 << 30):
                big_text = f"≥ {big_text}"
        elif big.get("error"):
            big_text = "error"
        status = ""
        if m.get("oom"):
            status = " (OOM)"
        elif m.get("error"):
            status = " (failed)"
        elif is_loom(allocator) and m.get("loom_state") == "declined":
            status = " (plan declined: it loses on its recording)"
        elif is_loom(allocator) and m.get("loom_state") is not None and \
                not models.served_plan(m):
            status = f" (not planned: {m['loom_state']})"
        elif is_loom(allocator) and m.get("plan_verdict") == "lost":
            status = " (plan lost to the dynamic space)"
        step = m.get("median_step_s")
        out.append(
            f"| {model} | {allocator}{status} | {m.get('micro_batch', '—')} | "
            f"{gib(m.get('allocated_bytes.all.peak'))} | "
            f"{gib(m.get('reserved_bytes.all.peak'))} | "
            f"{pct(m.get('efficiency'))} | "
            f"{'—' if step is None else f'{1000 * step:.1f} ms'} | "
            f"{'—' if ratio is None else f'{ratio:.3f}'} | "
            f"{m.get('driver_calls_per_step', '—') if is_loom(allocator) else '—'} | "
            f"{pct(m.get('hit_rate'), 1) if is_loom(allocator) else '—'} | "
            f"{big_text} |")
    return out + [""]


def target_rows(lines):
    """(target, model, value, met) for each of the issue's targets that the
    results allow to check: loom's (auto mode) and, where they ran,
    loom-plan's (plan mode) and loom-remember's (auto mode's second run),
    their targets marked so."""
    measured = latest(lines, "measure")
    rows = []
    for model in sorted({k[0] for k in measured},
                        key=lambda m: rank((m, "torch"))):
        mine = [(a, measured[(model, a)])
                for a in ("loom", models.PLANNED, models.REMEMBERED)
                if (model, a) in measured]
        if not mine:
            rows.append(("loom ran", model, "no result", False))
        for allocator, loom in mine:
            rows += loom_targets(model, allocator, loom, measured)
    return rows


def loom_targets(model, allocator, loom, measured):
    """The targets of one loom run (auto or plan mode) of `model`."""
    tag = {"loom": "", models.PLANNED: " (plan mode)",
           models.REMEMBERED: " (remember, second run)"}[allocator]
    if loom.get("oom") or loom.get("error"):
        return [(f"loom ran{tag}", model, "no result", False)]
    rows = []
    spec = models.spec(model) if model in models.MODEL_NAMES else None
    dense = spec.dense if spec else True
    goal = 0.99 if dense else 0.98
    eff = loom.get("efficiency")
    rows.append((f"efficiency ≥ {goal:.0%}{tag}", model, pct(eff),
                 eff is not None and eff >= goal))
    expandable = measured.get((model, "expandable"))
    if expandable and expandable.get("reserved_bytes.all.peak"):
        held = loom["reserved_bytes.all.peak"]
        theirs = expandable["reserved_bytes.all.peak"]
        rows.append((f"peak reserved < expandable{tag}", model,
                     f"{gib(held)} vs {gib(theirs)}", held < theirs))
    torch_run = measured.get((model, "torch"))
    if torch_run and torch_run.get("median_step_s") and \
            loom.get("median_step_s"):
        ratio = loom["median_step_s"] / torch_run["median_step_s"]
        rows.append((f"step time within 1% of torch{tag}", model,
                     f"{ratio:.3f}×", ratio <= 1.01))
    if dense and loom.get("driver_calls_per_step") is not None:
        calls = loom["driver_calls_per_step"]
        rows.append((f"0 driver calls per step (dense){tag}", model,
                     f"{calls:g}", calls == 0))
    return rows


def target_lines(lines):
    rows = target_rows(lines)
    out = ["## Targets", "", "| target | model | measured | met |",
           "|---|---|---|---|"]
    for target, model, value, met in rows:
        out.append(f"| {target} | {model} | {value} | "
                   f"{'yes' if met else 'NO'} |")
    return out + [""]


def fidelity_lines(lines):
    chosen = latest(lines, "fidelity")
    if not chosen:
        return []
    out = ["## Simulator fidelity", "",
           "A short run (1 warm-up + 4 steps) with PyTorch's allocation "
           "history recorded from process start; the snapshot imported "
           "(`python3 -m loom import`) and replayed by `loom_tool compare`. "
           "Error = (simulated − real) / real peak reserved. The loom column "
           "is what the simulation predicts loom would reserve on the same "
           "trace.", "",
           "| model | allocator | real peak reserved | simulated | error | "
           "real peak allocated | simulated | loom (simulated) |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for key in order(chosen):
        f = chosen[key]
        if f.get("error"):
            out.append(f"| {key[0]} | {key[1]} | failed: "
                       f"{str(f['error'])[:80]} | | | | | |")
            continue
        loom = f.get("simulated", {}).get("loom", {})
        out.append(f"| {key[0]} | {key[1]} | {gib(f['real_peak_reserved'])} "
                   f"| {gib(f['simulated_peak_reserved'])} | "
                   f"{pct(f['relative_error'])} | {gib(f['real_peak_allocated'])} | "
                   f"{gib(f['simulated_peak_allocated'])} | "
                   f"{gib(loom.get('peak_reserved'))} |")
    return out + [""]


def failure_lines(lines):
    out = []
    for line in lines:
        if line.get("kind") in ("measure", "snapshot") and \
                line.get("error") and not line.get("oom"):
            out.append(f"- {line['kind']} {line.get('model')}/"
                       f"{line.get('allocator')}: "
                       f"{str(line['error']).strip().splitlines()[-1][:300]}")
        if line.get("kind") == "measure" and line.get("plan_error"):
            out.append(f"- loom did not plan {line.get('model')}: "
                       f"{str(line['plan_error'])[:300]}")
        if line.get("kind") == "skipped":
            out.append(f"- skipped (time budget): {line['what']} "
                       f"{line['model']}/{line['allocator']}")
    return ["## Failures and gaps", "", *out, ""] if out else []


def recipe_failures(lines):
    """Why a `run` failed, one line each (empty: it passed): a measure run
    that did not finish (an error, a timeout, out of memory at the model's
    default micro-batch), a loom measure run that did not serve its plan
    (fallback, or still planning) with the reason, a measure the time
    budget left out, a failed fidelity or search. A plan declined (it held
    more than loom without a plan on the iterations it was made from,
    whatif/loom/plan_check.h) is an outcome, marked in the table, not a
    failure."""
    out = []
    for line in lines:
        kind = line.get("kind")
        label = f"{line.get('model')}/{line.get('allocator')}"
        error = str(line.get("error") or "").strip()
        last = error.splitlines()[-1][:300] if error else ""
        if kind == "measure":
            if line.get("oom"):
                out.append(f"{label}: out of memory at micro-batch "
                           f"{line.get('micro_batch')}: {last}")
            elif line.get("returncode") != 0:
                out.append(f"{label}: failed (exit "
                           f"{line.get('returncode')}): {last}")
            elif is_loom(line.get("allocator")) and \
                    line.get("loom_state") != "declined" and \
                    not models.served_plan(line):
                out.append(f"{label}: loom did not serve a plan (state "
                           f"{line.get('loom_state')}): "
                           f"{str(line.get('plan_error'))[:500]}")
        elif kind == "skipped":
            out.append(f"{label}: {line.get('what')} not run (time budget)")
        elif kind in ("fidelity", "largest", "prime") and error:
            out.append(f"{label}: {kind} failed: {last}")
    return out


def make_table(lines, driver_costs=None, command=None):
    out = ["# loom on a GPU: memory, speed and driver costs", ""]
    out += environment_lines(lines, driver_costs)
    if command:
        out.append(f"- recorded with: `{command}`")
    out.append("")
    if driver_costs:
        out += driver_cost_lines(driver_costs)
    out += training_lines(lines)
    out += target_lines(lines)
    out += fidelity_lines(lines)
    out += failure_lines(lines)
    return "\n".join(out).rstrip() + "\n"
