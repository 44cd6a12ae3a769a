"""`loom compare`: the allocator comparison, with `--plot out.png`.

Everything is computed by `loom_tool compare` (C++); this module only adds
the picture: it runs loom_tool with `--series` (and `--rows-json`, for the
caption) into temporary files and draws memory over time for every
allocator (live requested bytes, the allocator's allocated bytes and its
reserved physical memory; time in trace events, numbered on every panel),
plus a bar summary of the peaks. The legend has a row of its own above the
panels and lists only the marks drawn (iteration boundaries only when the
trace has any); a caption under the panels says what each allocator row is,
where loom's plan came from, and why loom unplanned holds less than planned
loom when it does (`caption_lines`). The PNG is written with matplotlib's Agg backend, so
no display is needed. Other options and the table/JSON output of loom_tool
pass through unchanged; the plot never goes to stdout. Without matplotlib
(the `plots` extra) the table is printed, then one line says the picture
was not written and how to get matplotlib (exit status 1).

Hook for loom's own plan picture (time x address map): pass `extra_panels`
to `plot_series`, a list of callables `(axes) -> None`, each drawing into a
panel of its own below the memory-over-time panels.
"""

import csv
import os
import sys
import tempfile
import textwrap
from collections import OrderedDict

from loom import _extras

SERIES_COLUMNS = ("allocator", "time", "iteration", "requested_bytes",
                  "allocated_bytes", "reserved_bytes")

# Colours of the series (colour-blind safe).
_REQUESTED = "#9ecae1"
_ALLOCATED = "#3182bd"
_RESERVED = "#e6550d"


class SeriesError(ValueError):
    """The series CSV is missing, malformed or empty."""


def read_series(path):
    """Reads loom_tool's --series CSV.

    Returns an OrderedDict allocator -> dict of column name -> list of ints,
    in file order. Raises SeriesError on a bad file.
    """
    series = OrderedDict()
    try:
        with open(path, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None or tuple(header) != SERIES_COLUMNS:
                raise SeriesError(f"{path}: expected the header "
                                  f"{','.join(SERIES_COLUMNS)}, got {header}")
            for line, row in enumerate(reader, start=2):
                if len(row) != len(SERIES_COLUMNS):
                    raise SeriesError(f"{path}:{line}: expected "
                                      f"{len(SERIES_COLUMNS)} fields")
                try:
                    values = [int(v) for v in row[1:]]
                except ValueError as error:
                    raise SeriesError(f"{path}:{line}: {error}") from None
                columns = series.setdefault(
                    row[0], {name: [] for name in SERIES_COLUMNS[1:]})
                for name, value in zip(SERIES_COLUMNS[1:], values):
                    columns[name].append(value)
    except OSError as error:
        raise SeriesError(f"{path}: {error.strerror}") from None
    if not series:
        raise SeriesError(f"{path}: no samples")
    return series


def _unit(max_bytes):
    for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if max_bytes >= size:
            return name, float(size)
    return "B", 1.0


def _human(value):
    name, size = _unit(value)
    return f"{value / size:.2f} {name}" if name != "B" else f"{value} B"


# What each allocator row is, for the caption under the picture.
ROW_MEANINGS = {
    "pytorch": "PyTorch's caching allocator (its rules replayed, default "
               "settings unless --alloc-conf)",
    "pytorch_expandable": "the same with expandable_segments:True "
                          "(one growing virtual range, 20 MiB pages)",
    "gmlake": "a GMLake-style stitcher (freed blocks stitched into larger "
              "ones by remapping)",
    "loom": "loom serving its plan (a fixed address per planned request); "
            "what the plan does not cover goes to its dynamic space",
    "loom_unplanned": "loom with no plan: every request from its dynamic "
                      "space (best fit over virtual addresses, pages "
                      "mapped on demand)",
}

TIME_LABEL = "time (trace events: each allocation or free is one)"


def caption_lines(names, rows=None):
    """One line per allocator row saying what it is; with `rows` (compare's
    JSON rows) loom's line says where its plan came from and how many
    requests its dynamic space served, and a last line says why loom
    unplanned is below planned loom where it is."""
    by_name = {r.get("allocator"): r for r in rows or ()}
    lines = []
    for name in names:
        text = ROW_MEANINGS.get(name, "")
        row = by_name.get(name, {})
        counters = row.get("counters") or {}
        if name == "loom" and row.get("plan_from") and \
                counters.get("plan_not_served"):
            text = (f"loom without its plan (planned from "
                    f"{row['plan_from']}, declined: on that trace it held "
                    f"more than loom with no plan), so the same as "
                    f"loom_unplanned")
        elif name == "loom" and row.get("plan_from"):
            text = f"loom serving its plan, planned from {row['plan_from']}"
            dynamic = counters.get("dynamic_requests", 0)
            if dynamic:
                text += (f"; {dynamic} requests of modules marked dynamic "
                         f"(sizes change every iteration) from its dynamic "
                         f"space beside the plan's region")
        if text:
            lines.append(f"{name}: {text}")
    note = unplanned_note(rows)
    if note:
        lines.append(note)
    return lines


def unplanned_note(rows):
    """Why loom unplanned holds less than planned loom, when it does, or
    why loom's plan was declined, when it was (None otherwise)."""
    by_name = {r.get("allocator"): r for r in rows or ()}
    loom, unplanned = by_name.get("loom"), by_name.get("loom_unplanned")
    if not loom or not unplanned:
        return None
    counters = loom.get("counters") or {}
    if counters.get("plan_not_served"):
        with_plan = counters.get("plan_check_planned_bytes", 0)
        without = counters.get("plan_check_unplanned_bytes", 0)
        dynamic = counters.get("dynamic_requests", 0)
        why = (f"its {dynamic} dynamic requests (sizes change every "
               f"iteration) would be served beside the plan's region, "
               f"borrowing its memory only in whole chunks idle until they "
               f"end; one space serving everything holds less. "
               if dynamic else "")
        return (f"why loom's plan is declined: replayed on the trace it was "
                f"made from, the plan held {_human(with_plan)} at its peak "
                f"and loom without a plan {_human(without)}; {why}A plan "
                f"that costs memory on its own recording is not served, so "
                f"loom is loom_unplanned here (whatif/loom/plan_check.h, "
                f"bench/results/misses.md)")
    if unplanned["peak_reserved_bytes"] >= loom["peak_reserved_bytes"]:
        return None
    points = 100 * (unplanned["efficiency"] - loom["efficiency"])
    gap = _human(loom["peak_reserved_bytes"] - unplanned["peak_reserved_bytes"])
    dynamic = (loom.get("counters") or {}).get("dynamic_requests", 0)
    if dynamic:
        return (f"why loom_unplanned is below loom ({gap}, {points:.2f} "
                f"points): loom's {dynamic} dynamic requests are served "
                f"beside the plan's region; they may borrow the region's "
                f"memory only in whole chunks that stay idle until they end, "
                f"and otherwise take new memory held next to the region. "
                f"loom_unplanned serves every request from one space, so "
                f"nothing is held apart (bench/results/misses.md)")
    return (f"why loom_unplanned is below loom ({gap}, {points:.2f} points): "
            f"the plan's layout holds granules this run leaves partly empty "
            f"(bench/results/misses.md)")


def build_figure(series, title, extra_panels=(), captions=()):
    """The figure for `series` (from read_series), not yet saved.

    Layout, top to bottom: a legend row (outside every data area), one
    memory-over-time panel per allocator (time axis numbered on each, in
    trace events) with the peaks beside them, the `extra_panels`, and a
    caption row with the `captions` lines (what each allocator row is).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = list(series)
    captions = [textwrap.fill(line, 150, subsequent_indent="    ")
                for line in captions]
    caption_count = sum(line.count("\n") + 1 for line in captions)
    rows = len(names) + len(extra_panels)
    peak_reserved = max(max(c["reserved_bytes"], default=0)
                        for c in series.values())
    peak_requested = max(max(c["requested_bytes"], default=0)
                         for c in series.values())
    unit_name, unit = _unit(max(peak_reserved, peak_requested, 1))
    last_time = max(c["time"][-1] for c in series.values())

    caption_height = 0.17 * caption_count + 0.15 if captions else 0.01
    heights = [0.45] + [2.4] * rows + [caption_height]
    fig = plt.figure(figsize=(12, sum(heights) + 1.2),
                     constrained_layout=True)
    grid = fig.add_gridspec(rows + 2, 2, width_ratios=(4.2, 1.3),
                            height_ratios=heights)
    first = None
    boundaries = False
    memory_axes = []
    for row, name in enumerate(names):
        cols = series[name]
        ax = fig.add_subplot(grid[row + 1, 0], sharex=first, sharey=first)
        memory_axes.append(ax)
        first = first or ax
        t = cols["time"]
        req = [v / unit for v in cols["requested_bytes"]]
        alloc = [v / unit for v in cols["allocated_bytes"]]
        res = [v / unit for v in cols["reserved_bytes"]]
        ax.fill_between(t, 0, req, step="post", color=_REQUESTED, lw=0)
        ax.step(t, alloc, where="post", color=_ALLOCATED, lw=1.0)
        ax.step(t, res, where="post", color=_RESERVED, lw=1.6)
        iterations = cols["iteration"]
        for i in range(1, len(iterations)):
            if iterations[i] != iterations[i - 1]:
                ax.axvline(t[i], color="0.45", lw=0.8, ls=":")
                boundaries = True
        peak_res = max(cols["reserved_bytes"])
        peak_req = max(cols["requested_bytes"])
        efficiency = peak_req / peak_res if peak_res else 1.0
        ax.set_title(f"{name}: peak reserved {_human(peak_res)}, "
                     f"efficiency {efficiency:.1%}", loc="left", fontsize=10)
        if t[-1] < last_time:
            # The text on the side with room, inside the panel.
            late = t[-1] > 0.6 * last_time
            ax.annotate("replay stopped: out of memory", xy=(t[-1], res[-1]),
                        xytext=(-8 if late else 8, -14),
                        textcoords="offset points",
                        ha="right" if late else "left", va="top",
                        color=_RESERVED, fontsize=9,
                        arrowprops={"arrowstyle": "->", "color": _RESERVED})
        ax.set_ylabel(f"memory ({unit_name})")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0, top=max(peak_reserved, peak_requested, 1)
                    / unit * 1.08)
        ax.tick_params(labelbottom=True, labelsize=8)
    first.set_xlim(0, max(last_time, 1))
    memory_axes[-1].set_xlabel(TIME_LABEL)

    for i, draw in enumerate(extra_panels):
        draw(fig.add_subplot(grid[len(names) + 1 + i, :]))

    bars = fig.add_subplot(grid[1:len(names) + 1, 1])
    peaks = [max(series[n]["reserved_bytes"]) / unit for n in names]
    positions = range(len(names))
    bars.barh(positions, peaks, height=0.55, color=_RESERVED, alpha=0.85)
    bars.axvline(peak_requested / unit, color=_ALLOCATED, lw=1.5, ls="--")
    for y, value in zip(positions, peaks):
        bars.text(value, y, f" {value:.2f}", va="center", fontsize=8)
    bars.set_yticks(list(positions))
    bars.set_yticklabels(names, fontsize=9)
    bars.invert_yaxis()
    bars.set_xlabel(f"peak memory ({unit_name})")
    bars.set_xlim(0, max(peaks + [peak_requested / unit]) * 1.25)
    bars.set_title("peaks", fontsize=10)
    bars.grid(axis="x", alpha=0.3)

    # The legends, in a row of their own above the panels: nothing covers
    # data, and only marks the picture has are listed.
    handles = [Patch(color=_REQUESTED, label="live requested (the program)"),
               Line2D([], [], color=_ALLOCATED, lw=1.0,
                      label="allocated (the allocator's blocks)"),
               Line2D([], [], color=_RESERVED, lw=1.6,
                      label="reserved (physical memory held)")]
    if boundaries:
        handles.append(Line2D([], [], color="0.45", lw=0.8, ls=":",
                              label="iteration boundary"))
    key = fig.add_subplot(grid[0, 0])
    key.axis("off")
    key.legend(handles=handles, loc="center", ncol=len(handles), fontsize=8,
               frameon=False)
    peak_key = fig.add_subplot(grid[0, 1])
    peak_key.axis("off")
    peak_key.legend(handles=[
        Patch(color=_RESERVED, alpha=0.85, label="peak reserved"),
        Line2D([], [], color=_ALLOCATED, lw=1.5, ls="--",
               label="peak live requested")],
        loc="center", ncol=1, fontsize=7, frameon=False)

    caption = fig.add_subplot(grid[rows + 1, :])
    caption.axis("off")
    if captions:
        caption.text(0, 1, "\n".join(captions), va="top", ha="left",
                     fontsize=8, transform=caption.transAxes, wrap=False)

    fig.suptitle(title, fontsize=12)
    return fig


def plot_series(series, out_path, title, extra_panels=(), captions=()):
    """Draws `series` (from read_series) into the PNG `out_path`."""
    import matplotlib.pyplot as plt
    fig = build_figure(series, title, extra_panels, captions)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def _take_option(args, name):
    """Removes `--name value` / `--name=value` from args; returns the value."""
    value = None
    rest = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == name:
            if i + 1 >= len(args):
                raise ValueError(f"{name} needs a value")
            value = args[i + 1]
            i += 2
            continue
        if arg.startswith(name + "="):
            value = arg[len(name) + 1:]
        else:
            rest.append(arg)
        i += 1
    return value, rest


# loom_tool compare options that take a separate value.
_VALUE_OPTIONS = {"--series", "--capacity", "--alloc-conf", "--torch-version",
                  "--allocators", "--frag-limit", "--reuse-limit", "--samples"}


def _positional(args):
    """The first positional argument of loom_tool compare (the workload)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def read_plan_csv(path):
    """(lower, upper, size, offset) per buffer of a plan CSV, or [] if none."""
    import csv
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                rows.append((int(row["lower"]), int(row["upper"]),
                             int(row["size"]), int(row["offset"])))
    except (OSError, KeyError, ValueError):
        return []
    return rows


def read_rows(path):
    """compare's JSON rows written by --rows-json, or [] if unreadable."""
    import json
    try:
        with open(path, encoding="utf-8") as handle:
            rows = json.load(handle)
    except (OSError, ValueError):
        return []
    return rows if isinstance(rows, list) else []


def plan_panel(buffers, max_boxes=20000):
    """A panel drawer: loom's plan as a time x address map (one box per
    buffer: its lifetime across, its bytes up), the largest buffers first
    when there are too many to draw."""
    def draw(ax):
        from matplotlib.collections import PolyCollection
        boxes = sorted(buffers, key=lambda b: -(b[1] - b[0]) * b[2])[:max_boxes]
        top = max((b[3] + b[2] for b in boxes), default=1)
        unit, scale = _unit(top)
        verts, colours = [], []
        palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3",
                   "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
        for n, (lower, upper, size, offset) in enumerate(boxes):
            y0, y1 = offset / scale, (offset + size) / scale
            verts.append([(lower, y0), (upper, y0), (upper, y1), (lower, y1)])
            colours.append(palette[n % len(palette)])
        ax.add_collection(PolyCollection(verts, facecolors=colours,
                                         edgecolors="white", linewidths=0.2))
        ax.set_xlim(min((b[0] for b in boxes), default=0),
                    max((b[1] for b in boxes), default=1))
        ax.set_ylim(0, top / scale * 1.02)
        ax.set_ylabel(f"address ({unit})")
        ax.set_xlabel("time (trace events, counted from the start of the "
                      "planned span)")
        ax.set_title(f"loom's plan: {len(buffers)} buffers placed in "
                     f"{top / scale:.2f} {unit} (time x address)", loc="left")
    return draw


def run(args, run_tool):
    """`loom compare [loom_tool options] [--plot out.png]`."""
    try:
        plot_path, args = _take_option(list(args), "--plot")
        series_path, args = _take_option(args, "--series")
    except ValueError as error:
        print(f"loom compare: {error}", file=sys.stderr)
        return 2
    if plot_path is None:
        if series_path is not None:
            args += ["--series", series_path]
        return run_tool(["compare", *args])
    if any(a in ("-h", "--help") for a in args):
        return run_tool(["compare", *args])
    if not _extras.importable("matplotlib"):
        # The comparison still runs and prints; only the picture is missing
        # (exit status 1: the file asked for was not written).
        if series_path is not None:
            args += ["--series", series_path]
        code = run_tool(["compare", *args])
        if code != 0:
            return code
        print(_extras.message("loom compare", "--plot", ["matplotlib"],
                              outcome=f"{plot_path} not written"),
              file=sys.stderr)
        return 1
    temporary = None
    handle, plan_csv = tempfile.mkstemp(prefix="loom-plan-", suffix=".csv")
    os.close(handle)
    handle, rows_json = tempfile.mkstemp(prefix="loom-rows-", suffix=".json")
    os.close(handle)
    if series_path is None:
        handle, temporary = tempfile.mkstemp(prefix="loom-series-",
                                             suffix=".csv")
        os.close(handle)
        series_path = temporary
    try:
        code = run_tool(["compare", *args, "--series", series_path,
                         "--loom-plan-csv", plan_csv,
                         "--rows-json", rows_json])
        if code != 0:
            return code
        try:
            series = read_series(series_path)
        except SeriesError as error:
            print(f"loom compare: {error}", file=sys.stderr)
            return 1
        workload = _positional(args)
        title = f"memory over time: {workload}" if workload else "memory over time"
        try:
            buffers = read_plan_csv(plan_csv)
            panels = [plan_panel(buffers)] if buffers else []
            plot_series(series, plot_path, title, extra_panels=panels,
                        captions=caption_lines(list(series),
                                               read_rows(rows_json)))
        except OSError as error:
            print(f"loom compare: cannot write {plot_path}: {error.strerror}",
                  file=sys.stderr)
            return 1
        print(f"loom compare: plot written to {plot_path}", file=sys.stderr)
        return 0
    finally:
        for path in (temporary, plan_csv, rows_json):
            if path is not None and os.path.exists(path):
                os.unlink(path)
