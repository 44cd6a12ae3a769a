"""The step-time tables (bench/results/steptime.md) from profiled runs.

    steptime.py RESULTS.jsonl... [--command TEXT] [--top 15]

Reads the "measure" lines of `compare.py run --profile-steps N` (worker.py
with torch.profiler; profile_steps.py) and writes, per model:
  - each allocator's median step and its ratio to PyTorch's allocator in the
    same run; the GPU's busy and idle time per profiled step; GPU
    activities per step; for loom and its layout variants, the handles and
    mappings it held, the events and synchronisations it did per step (by
    call site when any), its sampled host time per malloc and free;
  - for each other allocator, the `--top` GPU activities (kernels, copies,
    memsets, by name) whose time per step changed most against torch;
  - the issue's targets: loom within 1% of torch on every model, and at or
    below expandable segments on gpt2_interleaved.
No torch needed: tested on the CPU with recorded profiles.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profile_steps  # noqa: E402  pylint: disable=wrong-import-position
from table import environment_lines, latest, order, read_results  # noqa: E402  pylint: disable=wrong-import-position
from models import is_loom, served_plan  # noqa: E402  pylint: disable=wrong-import-position

STEP_TOLERANCE = 0.01  # the "within 1% of PyTorch's allocator"


def ms(us):
    return "—" if us is None else f"{us / 1000:.1f} ms"


def ratio_text(value, base):
    return "—" if not value or not base else f"{value / base:.3f}"


def per_step_count(prof, key):
    """A loom counter over the profiled steps, per step."""
    loom = prof.get("loom") or {}
    steps = prof.get("steps") or 0
    return loom.get(key, 0) / steps if steps else None


def waits_text(prof):
    """Events and synchronisations per step, by site ("0" when none)."""
    loom = prof.get("loom") or {}
    steps = prof.get("steps") or 1
    parts = []
    for key, value in sorted(loom.items()):
        if key.startswith("loom.waits.") and value:
            site_kind = key[len("loom.waits."):]
            parts.append(f"{site_kind} {value / steps:g}")
    return ", ".join(parts) or "0"


def layout_text(prof):
    loom = prof.get("loom") or {}
    if "loom.layout.handles" not in loom:
        return "—"
    sizes = []
    for key, value in loom.items():
        if key.startswith("loom.layout.handle_size.") and \
                key.endswith(".handles"):
            sizes.append((key.split(".")[3], value))
    sizes.sort(key=lambda kv: -kv[1])
    top = ", ".join(f"{n}×{size}" for size, n in sizes[:3])
    return (f"{loom['loom.layout.handles']} handles, "
            f"{loom['loom.layout.mappings']} mappings ({top})")


def host_text(prof):
    """Mean sampled host ns per loom_malloc / loom_free over the profiled
    steps (from the sampled counters' growth)."""
    loom = prof.get("loom") or {}
    means = []
    for entry in ("malloc", "free"):
        samples = loom.get(f"loom.host.{entry}.samples")
        total = loom.get(f"loom.host.{entry}.sampled_ns")
        means.append(None if not samples else round(total / samples))
    if means == [None, None]:
        return "—"
    return " / ".join("—" if m is None else str(m) for m in means) + " ns"


def model_lines(model, runs):
    """The per-allocator table of one model; `runs`: allocator -> line."""
    base = runs.get("torch", {})
    base_prof = base.get("profile") or {}
    base_busy = profile_steps.per_step(base_prof, "busy_us")
    out = [f"### {model}", "",
           "| allocator | median step | vs torch | GPU busy/step | vs torch "
           "| GPU idle in step | GPU activities/step | loom's layout | "
           "loom's waits per step | loom host ns malloc / free |",
           "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for allocator, line in runs.items():
        prof = line.get("profile") or {}
        step = line.get("median_step_s")
        busy = profile_steps.per_step(prof, "busy_us")
        idle = profile_steps.per_step(prof, "idle_us")
        count = profile_steps.per_step(prof, "activities")
        status = ""
        if line.get("error") or line.get("oom"):
            status = " (failed)" if line.get("error") else " (OOM)"
        elif is_loom(allocator) and line.get("loom_state") == "declined":
            status = " (plan declined)"
        elif is_loom(allocator) and not served_plan(line):
            status = f" (not planned: {line.get('loom_state')})"
        elif line.get("profile_error"):
            status = f" (not profiled: {line['profile_error'][:80]})"
        loom = is_loom(allocator)
        out.append(
            f"| {allocator}{status} | "
            f"{'—' if step is None else f'{1000 * step:.1f} ms'} | "
            f"{ratio_text(step, base.get('median_step_s'))} | {ms(busy)} | "
            f"{ratio_text(busy, base_busy)} | {ms(idle)} | "
            f"{'—' if count is None else f'{count:.0f}'} | "
            f"{layout_text(prof) if loom else '—'} | "
            f"{waits_text(prof) if loom and prof else '—'} | "
            f"{host_text(prof) if loom else '—'} |")
    return out + [""]


def changed_kernels(base_prof, prof, top):
    """[(name, calls/step base, calls/step, us/step base, us/step)] of the
    `top` names whose time per step changed most."""
    base_steps = base_prof.get("steps") or 1
    steps = prof.get("steps") or 1
    base_names = base_prof.get("names", {})
    names = prof.get("names", {})
    rows = []
    for name in set(base_names) | set(names):
        bc, bus = base_names.get(name, [0, 0.0])
        c, us = names.get(name, [0, 0.0])
        rows.append((name, bc / base_steps, c / steps, bus / base_steps,
                     us / steps))
    rows.sort(key=lambda r: -abs(r[4] - r[3]))
    return rows[:top]


def kernel_lines(model, runs, top):
    base_prof = (runs.get("torch") or {}).get("profile")
    if not base_prof:
        return []
    out = []
    for allocator, line in runs.items():
        prof = line.get("profile")
        if allocator == "torch" or not prof:
            continue
        out += [f"#### {model}: {allocator} against torch, the {top} GPU "
                f"activities whose time per step changed most", "",
                "| kernel / copy / memset | calls/step torch | calls/step "
                f"{allocator} | µs/step torch | µs/step {allocator} | change |",
                "|---|---:|---:|---:|---:|---:|"]
        for name, bc, c, bus, us in changed_kernels(base_prof, prof, top):
            short = name if len(name) <= 90 else name[:87] + "..."
            short = short.replace("|", "\\|")
            out.append(f"| `{short}` | {bc:g} | {c:g} | {bus:.1f} | "
                       f"{us:.1f} | {us - bus:+.1f} |")
        out.append("")
    return out


def target_lines(by_model):
    out = ["## Targets", "", "| target | model | measured | met |",
           "|---|---|---|---|"]
    for model, runs in by_model.items():
        torch_step = (runs.get("torch") or {}).get("median_step_s")
        loom_step = (runs.get("loom") or {}).get("median_step_s")
        if torch_step and loom_step:
            r = loom_step / torch_step
            out.append(f"| loom's median step within 1% of torch | {model} | "
                       f"{r:.3f}x | {'yes' if r <= 1 + STEP_TOLERANCE else 'NO'} |")
        expandable = (runs.get("expandable") or {}).get("median_step_s")
        if model == "gpt2_interleaved" and expandable and loom_step:
            out.append(f"| loom at or below expandable segments | {model} | "
                       f"{loom_step / expandable:.3f}x expandable's | "
                       f"{'yes' if loom_step <= expandable else 'NO'} |")
    return out + [""]


def make_steptime(lines, command=None, top=15):
    measured = latest(lines, "measure")
    by_model = {}
    for model, allocator in order(measured):
        by_model.setdefault(model, {})[allocator] = measured[(model,
                                                              allocator)]
    out = ["# Step time: where the GPU time goes", ""]
    out += environment_lines(lines, None)
    if command:
        out.append(f"- recipe: `{command}`")
    out += ["",
            "Median step: the timed steps (no profiler). The rest is from the "
            "profiled steps that followed (torch.profiler, CPU and CUDA "
            "activity): GPU busy = the union of the step's kernels, copies "
            "and memsets; GPU idle = the time inside the step's GPU span "
            "when none ran. loom's layout is what it held after the "
            "profiled steps; its waits are the events it recorded and the "
            "synchronisations it did during them, by call site; host ns is "
            "its sampled time inside loom_malloc / loom_free.", "",
            "## Per model", ""]
    for model, runs in by_model.items():
        out += model_lines(model, runs)
    out += target_lines(by_model)
    out += ["## GPU activities that changed", ""]
    for model, runs in by_model.items():
        out += kernel_lines(model, runs, top)
    return "\n".join(out).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--command")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    sys.stdout.write(make_steptime(read_results(args.results), args.command,
                                   args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
