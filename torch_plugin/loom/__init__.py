"""loom: a planned, virtual-memory GPU allocator for PyTorch training.

    import loom
    loom.enable(mode="auto")          # first thing, before CUDA is touched
    ...
    loom.watch(optimizer)             # or loom.step() after each iteration

This package is the run-time plugin (enable, modes, markers, stats, the
hand-over to PyTorch). The offline tools (snapshot import and export, plots,
the command line) are the subpackage `loom.tools`, imported only when used
(export_snapshot, import_snapshot and record_cpu below load it on first
call).

The package imports torch lazily (only loom.enable() with the CUDA backend
and loom.pool() need it): everything else (trace import, analysis,
planning, comparison, the command line, and the whole allocator on the host
backend) works on a machine without torch or CUDA. docs/plugin.md is the
user guide.
"""

__version__ = "0.1.0"

import contextlib

from loom import _state
from loom import config as _config
from loom import control as _control
from loom.errors import LoomError  # noqa: F401
from loom.control import enable, finish, status, wait_for_plan  # noqa: F401
from loom.control import _configure_native, _reset  # noqa: F401
from loom.markers import (step, phase, watch, begin_iteration,  # noqa: F401
                          end_iteration, module_enter, module_exit)
from loom.stats import (memory_stats, reset_peak_memory_stats,  # noqa: F401
                        memory_summary)
from loom.integrations import hf_callback, megatron_forward_step  # noqa: F401

__all__ = [
    "LoomError", "enable", "finish", "status", "wait_for_plan", "pool",
    "step", "phase",
    "watch", "begin_iteration", "end_iteration", "module_enter",
    "module_exit", "memory_stats", "reset_peak_memory_stats",
    "memory_summary", "export_snapshot", "import_snapshot", "hf_callback",
    "megatron_forward_step", "record_cpu",
]


@contextlib.contextmanager
def pool(device=None, **options):
    """Scoped alternative to enable(): CUDA allocations of the current thread
    inside the block go to a torch.cuda.MemPool served by loom (PyTorch >=
    2.5). PyTorch's caching allocator still runs on top and asks loom for
    whole segments (2 MiB, 20 MiB or the request rounded to 2 MiB), so loom
    sees segments, not tensors: no plan, loom's dynamic space serves them
    (VMM-backed, physical pages reused across segments). Only this thread
    is routed (autograd's backward threads are not); empty_cache() does not
    release a pool's segments; keep tensors made in the pool from outliving
    it. `options` configure loom (backend, cap, fraction) on first use."""
    from loom import _torch  # pylint: disable=import-outside-toplevel
    session = _state.current()
    if session is None:
        _torch.pool_torch()
        config = _config.parse_config("pool", ".loom", None, device,
                                      atexit=False, **options)
        session = _control._start(config)  # pylint: disable=protected-access
    elif options:
        raise LoomError("loom.pool(): loom is already configured; options are "
                        "taken on first use only")
    with _torch.pool(session, device) as mem_pool:
        yield mem_pool


def record_cpu(path=None, **options):
    """Records a training step run on the CPU as the loom trace of the
    requests PyTorch's CUDA caching allocator would receive: a context
    manager (loom.tools.record_cpu.Recorder; needs torch, no GPU).

        with loom.record_cpu("step.ltb", model=model, optimizer=opt):
            for batch in batches:     # a few iterations
                ...                   # forward, backward, opt.step()

    `model` and `optimizer` give the set-up tensors and the iteration,
    phase and module markers (MoE blocks flagged dynamic); see
    docs/plugin.md, "Recording on the CPU", for the options and for what
    a CPU recording cannot see; loom.tools.predict compares every
    allocator on the recording (compare_allocators(rec, device_memory))
    and finds the largest batch that fits (largest_batch). Loads
    loom.tools on first call."""
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import record_cpu as _record_cpu
    return _record_cpu.Recorder(path, **options)


def import_snapshot(path, device=None):
    """Converts a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot
    pickle, loaded with a restricted unpickler) to a loom trace: returns a
    loom.tools.snapshot_import.ImportResult (`.trace`, `.addresses`, ...).
    `device`: the device to import (default: the one with most entries)."""
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import snapshot_import
    return snapshot_import.import_snapshot(path, device)


def export_snapshot(trace=None, path=None, addresses=None, granularity=None,
                    segment_mode="alloc"):
    """Writes a PyTorch memory-snapshot pickle (for pytorch.org/memory_viz).

    export_snapshot(trace, path, ...): `trace` is a loom.tools.trace.Trace
    or the path of a trace file, either form (see
    loom.tools.snapshot_export).
    export_snapshot(path): the current run, as recorded so far (record or
    auto mode). The trace holds no addresses, so blocks are laid out first
    fit unless `addresses` ({request id: address}) are given."""
    if path is None:
        if trace is None:
            raise LoomError("export_snapshot: give the output path")
        return _export_current(trace, addresses, granularity, segment_mode)
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import snapshot_export
    return snapshot_export.export_snapshot(trace, path, addresses,
                                           granularity, segment_mode)


def _export_current(path, addresses, granularity, segment_mode):
    import os  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import snapshot_export
    session = _state.require("loom.export_snapshot(path)")
    if session.config.record_events == 0:
        raise LoomError("loom.export_snapshot(path): this run records no "
                        "trace (enable loom with mode='record' or 'auto', or "
                        "record_events=N)")
    handle, copy = tempfile.mkstemp(prefix=".export-", suffix=".ltb",
                                    dir=session.config.workdir)
    os.close(handle)
    try:
        session.native.write_trace(session.device, copy)
        return snapshot_export.export_snapshot(copy, path, addresses,
                                               granularity, segment_mode)
    finally:
        os.unlink(copy)
