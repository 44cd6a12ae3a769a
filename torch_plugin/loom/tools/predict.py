"""What each allocator would reserve for a recorded training step, and the
largest micro-batch that fits a device, without a GPU: the API behind `loom
what-if --model` (loom.tools.whatif_model), for a user's own script too.

    import loom
    from loom.tools import predict

    with loom.record_cpu(model=model, optimizer=optimizer) as rec:
        for batch in batches[:4]:               # a few iterations
            ...                                 # forward, backward, step
    for row in predict.compare_allocators(rec, device_memory="80GiB"):
        print(row["allocator"], row["peak_reserved_bytes"], row["oom"])

    def record(batch):                          # the step at this batch
        with loom.record_cpu(model=..., optimizer=...) as rec:
            ...
        return rec
    found = predict.largest_batch(record, "80GiB", max_batch=64)

A model of one's own, from a factory: `record_module` records its step
(forward, loss, backward, AdamW or SGD, zero_grad) at a batch size, and
`what_if` answers the rest in one call: every allocator's peak reserved
at `batch`, with `device_memory` the largest batch that fits under each,
and which modules hold the peak (loom.tools.peak_modules).

    found = predict.what_if(lambda: MyNet(), lambda b: torch.randn(b, 512),
                            batch=8, device_memory="80GiB", dtype="bf16")

The comparison is `loom_tool compare --json` (whatif/compare): per
allocator (PyTorch's caching allocator, expandable segments, a GMLake-style
stitcher, loom, loom without a plan) peak allocated and reserved bytes,
efficiency, fragmentation, driver calls, and with a device size `oom`: the
replay ran out of memory. loom's plan comes from the trace's first
iterations (compare's default for a trace of several iterations: first
min(3, iterations - 1)), so loom is judged on iterations it did not plan
from. Record at least two iterations.

largest_batch records at batch 1, 2, 4, ... while any allocator still fits
(up to max_batch), then bisects each allocator's last fitting and first
failing batch, replaying every recording under the device size; a batch is
recorded once and shared by all allocators. It assumes what fits at a
batch fits at every smaller one.
"""

import json
import os
import tempfile

from loom import _paths
from loom.config import parse_size
from loom.errors import LoomError
from loom.tools import parallel_shapes
from loom.tools import peak_modules
from loom.tools import trace as loom_trace
from loom.tools.forward import capture_tool
from loom.tools.record_summary import summarize


def _trace_of(recorded):
    """A Trace or a path from a Recorder, a Trace, or a trace file path."""
    if isinstance(recorded, loom_trace.Trace):
        return recorded
    if isinstance(recorded, (str, os.PathLike)):
        return os.fspath(recorded)
    trace = getattr(recorded, "trace", None)
    if isinstance(trace, loom_trace.Trace):
        return trace
    raise LoomError(f"predict: expected a loom.record_cpu recorder, a "
                    f"loom.tools.trace.Trace or a trace file, got "
                    f"{type(recorded).__name__}")


def compare_allocators(recorded, device_memory=None, *, allocators=None,
                       time_limit=None, plan_from=None):
    """Every allocator on the trace of `recorded` (a loom.record_cpu
    recorder, a Trace, or a trace file): the rows of `loom_tool compare
    --json`, one dict per allocator. `device_memory` (bytes or "80GiB"):
    replay under that capacity (a row's `oom` says whether it failed).
    `allocators`: a list of names (default all), `time_limit`: seconds
    loom's planner may search (default 10; it stops once its plan is
    optimal), `plan_from`: compare's --plan-from (default first:K).

    An allocator that cannot even start within the device size (loom maps
    its plan's static region when it starts) fails loom_tool's whole
    comparison; then each allocator is replayed alone, and the row of one
    that fails only under the capacity is its unlimited replay's with
    `oom` True and `setup_error` (the reason). Raises LoomError when the
    comparison fails otherwise."""
    trace = _trace_of(recorded)
    options = []
    if allocators:
        options += ["--allocators", ",".join(allocators)]
    if time_limit is not None:
        options += ["--loom-time-limit", str(time_limit)]
    if plan_from is not None:
        options += ["--plan-from", str(plan_from)]
    capped = [] if device_memory is None else [
        "--capacity", str(parse_size(device_memory, "device_memory"))]
    with tempfile.TemporaryDirectory(prefix="loom-predict-") as temp:
        if isinstance(trace, loom_trace.Trace):
            path = os.path.join(temp, "recorded.ltb")
            loom_trace.write_trace(trace, path)
        else:
            path = trace
        try:
            return _compare(path, [*options, *capped])
        except LoomError:
            if not capped:
                raise
            rows = []
            for row in _compare(path, options):
                alone = [*options, *capped, "--allocators", row["allocator"]]
                try:
                    rows += _compare(path, alone)
                except LoomError as error:
                    rows.append(dict(row, oom=True, oom_event=None,
                                     setup_error=str(error)))
            return rows


def _compare(path, options):
    """The rows of `loom_tool compare path --json options`."""
    try:
        result = capture_tool(["compare", path, "--json", *options])
    except _paths.NotBuiltError as error:
        raise LoomError(str(error)) from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise LoomError(f"loom_tool compare failed: "
                        f"{lines[-1] if lines else result.returncode}")
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise LoomError("loom_tool compare printed no JSON rows") from None


def _brief(row):
    """What a batch's entry keeps of a compare row."""
    brief = {"allocator": row["allocator"],
             "peak_reserved_bytes": row["peak_reserved_bytes"],
             "oom": bool(row["oom"])}
    if "setup_error" in row:
        brief["setup_error"] = row["setup_error"]
    return brief


class _Search:
    """Recordings by batch, each replayed once under the device size."""

    def __init__(self, record, capacity, compare_options, on_recording):
        self.record = record
        self.capacity = capacity
        self.options = compare_options
        self.on_recording = on_recording
        self.runs = {}        # batch -> the recording's entry
        self.order = []       # batches in the order they were recorded

    def fits(self, batch):
        """{allocator: True when the step at `batch` fits}."""
        if batch not in self.runs:
            trace = _trace_of(self.record(batch))
            if not isinstance(trace, loom_trace.Trace):
                trace = loom_trace.read_trace(trace)
            rows = compare_allocators(trace, self.capacity, **self.options)
            # The trace's own peak: a replay that ran out of memory stopped
            # before it.
            peak = summarize(trace.events)["peak_live_bytes"]
            entry = {"batch": batch, "peak_allocated_bytes": peak,
                     "allocators": [_brief(r) for r in rows]}
            self.runs[batch] = entry
            self.order.append(batch)
            if self.on_recording is not None:
                self.on_recording(entry)
        return {r["allocator"]: not r["oom"]
                for r in self.runs[batch]["allocators"]}

    def bisect(self, name):
        """(largest fitting batch of `name`, whether it is the bound)."""
        failing = [b for b in self.runs if not self.fits(b)[name]]
        if not failing:
            return max(self.runs), True
        high = min(failing)
        low = max((b for b in self.runs if b < high and self.fits(b)[name]),
                  default=0)
        while high - low > 1:
            middle = (low + high) // 2
            if self.fits(middle)[name]:
                low = middle
            else:
                high = middle
        return low, False


def largest_batch(record, device_memory, *, max_batch=64, allocators=None,
                  time_limit=None, plan_from=None, on_recording=None):
    """The largest micro-batch that fits `device_memory` under each
    allocator. `record(batch)` records the training step at that batch and
    returns a loom.record_cpu recorder, a Trace or a trace file; it is
    called once per batch tried (1, 2, 4, ... up to `max_batch`, then the
    bisection). `on_recording(entry)` is called after each recording is
    compared. Returns a dict:

      device_memory_bytes, max_batch
      allocators   [{allocator, largest_batch (0: not even batch 1),
                     at_max_batch (True: it fits max_batch, the bound)}]
      batches      one entry per recording, in the order recorded: [{batch,
                     peak_allocated_bytes (the trace's peak of live
                     requested bytes), allocators: [{allocator,
                     peak_reserved_bytes, oom, setup_error if any}]}]
    """
    capacity = parse_size(device_memory, "device_memory")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or \
            max_batch < 1:
        raise LoomError(f"predict: max_batch must be a positive integer, "
                        f"got {max_batch!r}")
    search = _Search(record, capacity, {"allocators": allocators,
                                        "time_limit": time_limit,
                                        "plan_from": plan_from},
                     on_recording)
    batch = 1
    while any(search.fits(batch).values()) and batch < max_batch:
        batch = min(2 * batch, max_batch)
    found = []
    for name in search.fits(1):
        largest, bound = search.bisect(name)
        found.append({"allocator": name, "largest_batch": largest,
                      "at_max_batch": bound})
    return {"device_memory_bytes": capacity, "max_batch": max_batch,
            "allocators": found,
            "batches": [search.runs[b] for b in search.order]}


# ------------------------------------------------ a model of one's own


def _default_loss(output):
    """The loss of a model's output: `.loss` (transformers), else the mean
    of the (first) output tensor."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if isinstance(output, (tuple, list)):
        output = output[0]
    if isinstance(output, dict):
        output = next(iter(output.values()))
    return output.float().mean()


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def record_module(factory, make_batch, batch, *, steps=4, dtype="fp32",
                  recompute=False, optimizer="adamw", loss=None, dp=1,
                  zero=0, seed=0):
    """Records `steps` training steps of `factory()` (an nn.Module, built
    on the CPU) at micro-batch `batch`: `make_batch(batch)` gives the
    inputs (a tensor, a tuple of positional or a dict of keyword
    arguments), `loss(output, inputs)` the loss (default: `.loss`, else
    the output's mean), then backward, `optimizer` ("adamw" or "sgd",
    foreach) and zero_grad(set_to_none=True). `dtype`: fp32, bf16
    (autocast with CUDA's policy) or bf16-pure; `recompute`: the model's
    gradient_checkpointing_enable (non-reentrant). `dp`/`zero`: one rank
    of ZeRO (parallel_shapes.shard_trace). Returns a
    parallel_shapes.Recording (`.trace`, `.summary()`, `.write(path)`)."""
    import torch  # pylint: disable=import-outside-toplevel
    import loom  # pylint: disable=import-outside-toplevel
    from loom.tools import cpu_models  # pylint: disable=C0415
    if dtype not in cpu_models.DTYPES:
        raise LoomError(f"predict: dtype {dtype!r} is not one of "
                        f"{', '.join(cpu_models.DTYPES)}")
    if optimizer not in parallel_shapes.OPTIMIZERS:
        raise LoomError(f"predict: optimizer {optimizer!r} is not one of "
                        f"{', '.join(parallel_shapes.OPTIMIZERS)}")
    if zero and dp < 2:
        raise LoomError(f"predict: zero {zero} needs dp >= 2")
    torch.manual_seed(seed)
    model = factory()
    if dtype == "bf16-pure":
        model = model.to(torch.bfloat16)
    if recompute:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise LoomError(f"predict: recompute: {type(model).__name__} has "
                            f"no gradient_checkpointing_enable()")
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = cpu_models.make_optimizer(torch, optimizer, params)
    ids = parallel_shapes.record_ids(params, opt, zero)
    loss = loss or (lambda output, inputs: _default_loss(output))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16,
                              enabled=dtype == "bf16")
    with loom.record_cpu(model=model, optimizer=opt) as rec:
        ids.start(rec)
        for _ in range(steps):
            inputs = make_batch(batch)
            with autocast:
                value = loss(_call(model, inputs), inputs)
            del inputs
            value.backward()
            del value
            opt.step()
            opt.zero_grad(set_to_none=True)
    return parallel_shapes.shard_trace(
        rec.trace, parallel_shapes.Parallel(dp=dp, zero=zero), ids)


def what_if(factory, make_batch, *, batch=1, device_memory=None,
            max_batch=64, time_limit=None, on_recording=None,
            **record_options):
    """record_module at `batch`, compare_allocators on it, with
    `device_memory` largest_batch (recording at each batch tried), and
    the peak's holders. Returns {"batch", "workload" (the recording's
    summary), "allocators" (compare's rows, with largest_batch and
    at_max_batch when searched), "search" (largest_batch's result, or
    None), "peak" (peak_modules.holders), "recording" (the Recording at
    `batch`, e.g. for peak_modules.write_snapshot(found["recording"].trace,
    path))}."""
    recordings = {}

    def record(size):
        if size not in recordings:
            recordings[size] = record_module(factory, make_batch, size,
                                             **record_options)
        return recordings[size].trace

    trace = record(batch)
    rows = compare_allocators(trace, time_limit=time_limit)
    search = None
    if device_memory is not None:
        search = largest_batch(record, device_memory, max_batch=max_batch,
                               time_limit=time_limit,
                               on_recording=on_recording)
        found = {f["allocator"]: f for f in search["allocators"]}
        for row in rows:
            row["largest_batch"] = found[row["allocator"]]["largest_batch"]
            row["at_max_batch"] = found[row["allocator"]]["at_max_batch"]
    return {"batch": batch, "workload": recordings[batch].summary(),
            "allocators": rows, "search": search,
            "peak": peak_modules.holders(trace),
            "recording": recordings[batch]}
