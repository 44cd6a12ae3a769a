"""`loom compare`: the allocator comparison, with `--plot out.png`.

Everything is computed by `loom_tool compare` (C++); this module only adds
the picture: it runs loom_tool with `--series` into a temporary CSV and
draws memory over time for every allocator (live requested bytes, the
allocator's allocated bytes and its reserved physical memory), plus a bar
summary of the peaks. The PNG is written with matplotlib's Agg backend, so
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


def plot_series(series, out_path, title, extra_panels=()):
    """Draws `series` (from read_series) into the PNG `out_path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(series)
    rows = len(names) + len(extra_panels)
    peak_reserved = max(max(c["reserved_bytes"], default=0)
                        for c in series.values())
    peak_requested = max(max(c["requested_bytes"], default=0)
                         for c in series.values())
    unit_name, unit = _unit(max(peak_reserved, peak_requested, 1))
    last_time = max(c["time"][-1] for c in series.values())

    fig = plt.figure(figsize=(12, 2.4 * rows + 1.4), constrained_layout=True)
    grid = fig.add_gridspec(rows, 2, width_ratios=(4.2, 1.3))
    first = None
    for row, name in enumerate(names):
        cols = series[name]
        ax = fig.add_subplot(grid[row, 0], sharex=first, sharey=first)
        first = first or ax
        t = cols["time"]
        req = [v / unit for v in cols["requested_bytes"]]
        alloc = [v / unit for v in cols["allocated_bytes"]]
        res = [v / unit for v in cols["reserved_bytes"]]
        ax.fill_between(t, 0, req, step="post", color=_REQUESTED, lw=0,
                        label="live requested (program)")
        ax.step(t, alloc, where="post", color=_ALLOCATED, lw=1.0,
                label="allocated (allocator's blocks)")
        ax.step(t, res, where="post", color=_RESERVED, lw=1.6,
                label="reserved (physical memory)")
        iterations = cols["iteration"]
        for i in range(1, len(iterations)):
            if iterations[i] != iterations[i - 1]:
                ax.axvline(t[i], color="0.6", lw=0.7, ls=":")
        peak_res = max(cols["reserved_bytes"])
        peak_req = max(cols["requested_bytes"])
        efficiency = peak_req / peak_res if peak_res else 1.0
        ax.set_title(f"{name}: peak reserved {_human(peak_res)}, "
                     f"efficiency {efficiency:.1%}", loc="left", fontsize=10)
        if t[-1] < last_time:
            ax.annotate("replay stopped: out of memory", xy=(t[-1], res[-1]),
                        xytext=(8, -14), textcoords="offset points",
                        color=_RESERVED, fontsize=9,
                        arrowprops={"arrowstyle": "->", "color": _RESERVED})
        ax.set_ylabel(unit_name)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if row == 0:
            ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
        if row < len(names) - 1 or extra_panels:
            ax.tick_params(labelbottom=False)
    first.set_xlim(0, max(last_time, 1))
    bottom = fig.axes[len(names) - 1]
    bottom.set_xlabel("time (trace event; dotted lines: iterations)")

    for i, draw in enumerate(extra_panels):
        draw(fig.add_subplot(grid[len(names) + i, :]))

    bars = fig.add_subplot(grid[0:len(names), 1])
    peaks = [max(series[n]["reserved_bytes"]) / unit for n in names]
    positions = range(len(names))
    bars.barh(positions, peaks, height=0.55, color=_RESERVED, alpha=0.85,
              label="peak reserved")
    bars.axvline(peak_requested / unit, color=_ALLOCATED, lw=1.5, ls="--",
                 label="peak live requested")
    for y, value in zip(positions, peaks):
        bars.text(value, y, f" {value:.2f}", va="center", fontsize=8)
    bars.set_yticks(list(positions))
    bars.set_yticklabels(names, fontsize=9)
    bars.invert_yaxis()
    bars.set_xlabel(unit_name)
    bars.set_xlim(0, max(peaks + [peak_requested / unit]) * 1.25)
    bars.set_title("peaks", fontsize=10)
    bars.legend(loc="lower right", fontsize=7)
    bars.grid(axis="x", alpha=0.3)

    fig.suptitle(title, fontsize=12)
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
        ax.set_ylabel(unit)
        ax.set_xlabel("time (trace event, relative to the planned span)")
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
    if series_path is None:
        handle, temporary = tempfile.mkstemp(prefix="loom-series-",
                                             suffix=".csv")
        os.close(handle)
        series_path = temporary
    try:
        code = run_tool(["compare", *args, "--series", series_path,
                         "--loom-plan-csv", plan_csv])
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
            plot_series(series, plot_path, title, extra_panels=panels)
        except OSError as error:
            print(f"loom compare: cannot write {plot_path}: {error.strerror}",
                  file=sys.stderr)
            return 1
        print(f"loom compare: plot written to {plot_path}", file=sys.stderr)
        return 0
    finally:
        for path in (temporary, plan_csv):
            if path is not None and os.path.exists(path):
                os.unlink(path)
