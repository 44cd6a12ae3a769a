"""Reading recorded traces in the tests: a trace's events of one kind and
its complete iterations (loom.tools.trace objects)."""

from loom.tools import trace as loom_trace


def events_of(trace, kind):
    """The trace's events of `kind`, in order."""
    return [e for e in trace.events if e.kind == kind]


def iteration_spans(trace):
    """[(begin index, end index)] of the complete iterations."""
    spans, begin = [], None
    for index, event in enumerate(trace.events):
        if event.kind == loom_trace.ITER_BEGIN:
            begin = index
        elif event.kind == loom_trace.ITER_END:
            spans.append((begin, index))
    return spans
