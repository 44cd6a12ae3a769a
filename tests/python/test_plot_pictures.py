"""The memory-over-time pictures of `loom compare --plot` and `loom demo`
read without the text (issue 24, item 5): time axes numbered with a unit,
the legend outside every data area, no legend entry for a mark the picture
lacks, a caption saying what each allocator row is, and why loom unplanned
holds less than planned loom where it does. The figure is inspected as
matplotlib lays it out (`compare_plot.build_figure`); the last test runs
loom_tool (the `loom_tool` fixture fails it when not built)."""

import os
import subprocess
import sys

import pytest

from loom import _paths
from loom.tools import compare_plot

matplotlib = pytest.importorskip("matplotlib")
MIB = 1 << 20
NAMES = ("pytorch", "pytorch_expandable", "gmlake", "loom", "loom_unplanned")


def _series(iterations):
    """Five allocators, 40 events; `iterations` gives each event's
    iteration (-1 before the first marker)."""
    series = {}
    for n, name in enumerate(NAMES):
        requested = [(1 + (t % 10)) * MIB for t in range(40)]
        series[name] = {
            "time": list(range(40)),
            "iteration": [iterations(t) for t in range(40)],
            "requested_bytes": requested,
            "allocated_bytes": [r + n * MIB for r in requested],
            "reserved_bytes": [12 * MIB + n * MIB] * 40,
        }
    return series


def _figure(iterations=lambda t: -1, captions=()):
    fig = compare_plot.build_figure(_series(iterations), "test",
                                    captions=captions)
    fig.canvas.draw()
    return fig


def _memory_axes(fig):
    return [ax for ax in fig.axes
            if ax.get_title(loc="left").split(":")[0] in NAMES]


def _legends(fig):
    return [ax.get_legend() for ax in fig.axes if ax.get_legend()]


def _labels(fig):
    return [t.get_text() for legend in _legends(fig)
            for t in legend.get_texts()]


def test_every_time_axis_is_numbered_and_says_its_unit():
    fig = _figure()
    axes = _memory_axes(fig)
    assert len(axes) == len(NAMES)
    for ax in axes:
        shown = [t.get_text() for t in ax.get_xticklabels()
                 if t.get_visible() and t.get_text()]
        assert any(text.strip().isdigit() for text in shown), shown
        assert "(" in ax.get_ylabel() and "MiB" in ax.get_ylabel()
    assert "trace events" in axes[-1].get_xlabel()
    matplotlib.pyplot.close(fig)


def test_the_legend_covers_no_data():
    fig = _figure()
    renderer = fig.canvas.get_renderer()
    data = [ax.get_window_extent(renderer) for ax in fig.axes
            if ax.axison]
    legends = _legends(fig)
    assert len(legends) == 2
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for area in data:
            assert not box.overlaps(area), (box, area)
    matplotlib.pyplot.close(fig)


def test_iteration_boundaries_are_in_the_legend_only_when_drawn():
    fig = _figure()
    assert "iteration boundary" not in _labels(fig)
    assert not any(line.get_linestyle() == ":" for ax in _memory_axes(fig)
                   for line in ax.get_lines())
    matplotlib.pyplot.close(fig)
    fig = _figure(iterations=lambda t: t // 10)
    assert "iteration boundary" in _labels(fig)
    assert any(line.get_linestyle() == ":" for ax in _memory_axes(fig)
               for line in ax.get_lines())
    for ax in fig.axes:
        assert "dotted" not in ax.get_xlabel()
    matplotlib.pyplot.close(fig)


def test_the_caption_says_what_each_row_is():
    rows = [{"allocator": "loom", "plan_from": "first 3 iterations",
             "peak_reserved_bytes": 14 * MIB, "efficiency": 0.90,
             "counters": {"dynamic_requests": 7}},
            {"allocator": "loom_unplanned", "peak_reserved_bytes": 12 * MIB,
             "efficiency": 0.95}]
    lines = compare_plot.caption_lines(NAMES, rows)
    for name in NAMES:
        assert any(line.startswith(f"{name}: ") for line in lines), name
    assert "planned from first 3 iterations" in lines[3]
    assert "7 requests" in lines[3]
    assert lines[-1].startswith("why loom_unplanned is below loom "
                                "(2.00 MiB, 5.00 points)")
    fig = _figure(captions=lines)
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "loom_unplanned: loom with no plan" in texts
    assert "why loom_unplanned is below loom" in texts
    matplotlib.pyplot.close(fig)


def test_a_declined_plan_is_said_so():
    """A loom row whose plan lost on the trace it was made from
    (whatif/loom/plan_check.h) ran without it: the caption and the note
    say so, with both peaks of the check."""
    rows = [{"allocator": "loom", "plan_from": "builtin:moe:seed=2",
             "peak_reserved_bytes": 12 * MIB, "efficiency": 0.95,
             "counters": {"dynamic_requests": 7, "plan_not_served": 1,
                          "plan_check_planned_bytes": 14 * MIB,
                          "plan_check_unplanned_bytes": 12 * MIB}},
            {"allocator": "loom_unplanned", "peak_reserved_bytes": 12 * MIB,
             "efficiency": 0.95}]
    lines = compare_plot.caption_lines(NAMES, rows)
    assert "loom without its plan (planned from builtin:moe:seed=2, " \
        "declined" in lines[3]
    note = compare_plot.unplanned_note(rows)
    assert note.startswith("why loom's plan is declined: replayed on the "
                           "trace it was made from, the plan held 14.00 MiB")
    assert "loom without a plan 12.00 MiB; its 7 dynamic requests" in note
    assert lines[-1] == note


def test_no_why_note_when_planned_loom_holds_no_more():
    rows = [{"allocator": "loom", "peak_reserved_bytes": 12 * MIB,
             "efficiency": 0.95, "counters": {"dynamic_requests": 7}},
            {"allocator": "loom_unplanned", "peak_reserved_bytes": 13 * MIB,
             "efficiency": 0.90}]
    assert compare_plot.unplanned_note(rows) is None
    assert compare_plot.unplanned_note([]) is None
    assert not any(line.startswith("why")
                   for line in compare_plot.caption_lines(NAMES, rows))


def test_compare_explains_own_alloc_peak(loom_tool):
    example = (_paths.REPO_ROOT / "bench/data/minimalloc/examples/"
               "input.12.csv")
    env = dict(os.environ, PYTHONPATH=str(_paths.PACKAGE_DIR.parent))
    result = subprocess.run(
        [sys.executable, "-m", "loom", "compare", str(example)],
        capture_output=True, text=True, check=False, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "own alloc peak" in result.stdout.splitlines()[
        next(i for i, line in enumerate(result.stdout.splitlines())
             if line.startswith("allocator "))]
    assert "\nown alloc peak = peak of the allocator's own allocated " \
        "bytes" in result.stdout
