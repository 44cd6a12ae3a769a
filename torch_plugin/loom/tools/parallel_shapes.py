"""One rank of a multi-GPU job, recorded on one CPU: the options of `loom
what-if --model` and `loom record-cpu` that say how the model is split and
optimized (--config, --tp, --pp, --dp, --zero, --optimizer), and the
recording they give (record_cpu_cli.record_rank: record_steps with this
module's preparer, then finish: the ZeRO rewrite of its trace).

  --config FILE   a transformers config.json: its model_type and every key
                  its model_type's config knows, at full size (--set wins)
  --tp N          one tensor-parallel rank, as Megatron shards the layers:
                  a config transform. num_attention_heads,
                  num_key_value_heads, intermediate_size,
                  moe_intermediate_size, shared_expert_intermediate_size
                  divided by N (an error when one does not divide); head_dim
                  and hidden_size kept, so q/k/v/gate/up (column-parallel)
                  have 1/N of their output features and o/down
                  (row-parallel) 1/N of their input features; vocab_size
                  padded as Megatron pads it (to a multiple of 128 x N),
                  then divided: the vocabulary-parallel embedding and head.
  --pp N          the pipeline's stages (record-cpu's --stages); with the
                  plain schedule it means --schedule 1f1b; `interleaved`
                  alone means interleaved:2
  --dp N --zero S data parallelism over N ranks with ZeRO stage S: a
                  rewrite of the recorded trace (shard_trace): S >= 1 every
                  request of the optimizer phase (the optimizer's state,
                  made in the first step, and its temporaries) is 1/N;
                  S >= 2 the gradients the optimizer reads too; S = 3 the
                  parameters (set-up requests) too, plus one decoder
                  layer's gathered parameters live from each iteration's
                  start to its optimizer phase
  --optimizer     adamw (default; foreach) or sgd (momentum 0.9, foreach)

A shard of a request whose element size is known (parameters, gradients,
optimizer state) is ceil(elements / N) elements; other optimizer-phase
temporaries ceil(bytes / N). Not modelled (docs/plugin.md): tensor-parallel
communication (all-reduce/all-gather buffers, sequence parallelism's
sharded activations), ZeRO's gradient buckets and the full-size gradient
between its computation and its reduce-scatter, ZeRO-3's prefetch of a
second layer.
"""

import dataclasses
import json

from loom.tools import cpu_models
from loom.tools import trace as loom_trace

OPTIMIZERS = cpu_models.OPTIMIZERS
# Megatron's --make-vocab-size-divisible-by default.
VOCAB_MULTIPLE = 128
# Divided by --tp (when the config has them; the heads must be there).
TP_HEADS = ("num_attention_heads", "num_key_value_heads")
TP_WIDTHS = ("intermediate_size", "moe_intermediate_size",
             "shared_expert_intermediate_size")
# Model types whose layers --tp's config transform cannot shard, and why.
TP_UNSHARDED = {"olmoe": "its q/k norms span every head (hidden_size wide)"}
# Keys of a config file that are not the model's shape.
_FILE_SKIP = {"model_type", "transformers_version", "architectures",
              "torch_dtype", "dtype", "auto_map", "quantization_config",
              "use_cache"}
# The destinations of add_arguments' options.
OPTIONS = ("config", "tp", "dp", "zero", "optimizer")


@dataclasses.dataclass
class Parallel:
    """How the recorded rank's job is split (besides the pipeline, which
    is in cpu_models.StepSpec)."""
    tp: int = 1
    dp: int = 1
    zero: int = 0
    optimizer: str = "adamw"

    def describe(self):
        return (f"tp {self.tp}, dp {self.dp}, zero {self.zero}, optimizer "
                f"{self.optimizer}")


def add_arguments(p, positive_int):
    """--config, --tp, --dp, --zero, --optimizer (dests in OPTIONS);
    `positive_int`: the argparse type of the counts (record_cpu_cli's)."""
    p.add_argument("--config", metavar="FILE", default=None,
                   help="a transformers config.json (its model_type and "
                   "sizes, full size; --set wins)")
    p.add_argument("--tp", type=positive_int, default=1, metavar="N",
                   help="record one tensor-parallel rank of N (Megatron's "
                   "sharding of heads, FFN and vocabulary)")
    p.add_argument("--dp", type=positive_int, default=1, metavar="N",
                   help="data-parallel ranks (with --zero)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                   help="ZeRO stage over --dp ranks: 1 optimizer state, 2 "
                   "and gradients, 3 and parameters are 1/N per rank")
    p.add_argument("--optimizer", choices=OPTIMIZERS,
                   default="adamw", help="adamw (default) or sgd "
                   "(momentum 0.9); both foreach")


# ------------------------------------------------------------ the options


def before_spec(args):
    """Parsed arguments before record_cpu_cli.spec_from_args: --config read
    (args.model and args.full_size set; returns the file's values), --pp
    and a bare `interleaved` made schedules. ModelError (exit status 2)
    for what does not work."""
    values = {}
    if args.config is not None:
        model_type, values = load_config_file(args.config, args.model or None)
        args.model = model_type
        args.full_size = True
    elif args.model is None:
        raise cpu_models.ModelError("give --model TYPE or --config FILE")
    if args.stages not in (None, 1) and args.schedule == "plain":
        args.schedule = "1f1b"
    if args.schedule == "interleaved":
        args.schedule = "interleaved:2"
    return values


def after_spec(spec, args, values):
    """(StepSpec, Parallel): record_cpu_cli.spec_from_args's spec with the
    config file's `values` under --set's, and --tp's config transform."""
    if args.config is not None:
        spec.overrides = {**values, **spec.overrides}
    if args.zero and args.dp < 2:
        raise cpu_models.ModelError(f"--zero {args.zero} shards over the "
                                    f"data-parallel ranks: give --dp N, "
                                    f"N >= 2")
    parallel = Parallel(tp=args.tp, dp=args.dp, zero=args.zero,
                        optimizer=args.optimizer)
    if parallel.tp > 1:
        spec.overrides = {**spec.overrides, **tp_overrides(spec, parallel.tp)}
    return spec, parallel


def load_config_file(path, model=None):
    """(model_type, {key: value}) of a transformers config.json: the keys
    its model_type's config knows, less those that are not the shape
    (dtype, architectures, quantization, ...)."""
    try:
        with open(path, encoding="utf-8") as source:
            data = json.load(source)
    except OSError as error:
        raise cpu_models.ModelError(f"--config {path}: cannot read: "
                                    f"{error.strerror}") from None
    except ValueError as error:
        raise cpu_models.ModelError(f"--config {path}: not JSON: "
                                    f"{error}") from None
    if not isinstance(data, dict):
        raise cpu_models.ModelError(f"--config {path}: expected a JSON "
                                    f"object (a transformers config.json)")
    model_type = data.get("model_type")
    if model is not None and model_type is not None and model != model_type:
        raise cpu_models.ModelError(f"--config {path} is a {model_type!r} "
                                    f"config, --model says {model!r}")
    model_type = model_type or model
    if not model_type:
        raise cpu_models.ModelError(f"--config {path}: no model_type key "
                                    f"(give --model TYPE)")
    spec = cpu_models.StepSpec(model_type=model_type)
    default = cpu_models.build_config(spec)  # ModelError for unknown types
    fields = default.to_dict()
    aliases = getattr(default, "attribute_map", {}) or {}
    values = {k: v for k, v in data.items()
              if k not in _FILE_SKIP and not k.startswith("_")
              and (k in fields or k in aliases)}
    return model_type, values


def tp_overrides(spec, tp):
    """The config values of one of `tp` tensor-parallel ranks of `spec`'s
    model (see the module docstring)."""
    if spec.model_type in TP_UNSHARDED:
        raise cpu_models.ModelError(
            f"--tp {tp}: {spec.model_type} is not sharded: "
            f"{TP_UNSHARDED[spec.model_type]}")
    config = cpu_models.build_config(spec)
    fields = config.to_dict()
    if "num_key_value_heads" not in fields and \
            "num_key_value_heads" not in (getattr(config, "attribute_map",
                                                  {}) or {}):
        raise cpu_models.ModelError(
            f"--tp {tp}: {spec.model_type}'s config has no "
            f"num_key_value_heads; --tp shards models with Llama-style "
            f"attention (q/k/v/o projections, head_dim)")
    values = {}
    heads = getattr(config, "num_attention_heads")
    for key in (*TP_HEADS, *TP_WIDTHS):
        value = getattr(config, key, None)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if value % tp:
            raise cpu_models.ModelError(
                f"--tp {tp}: {key} {value} is not a multiple of {tp}")
        values[key] = value // tp
    if "qk_rope_head_dim" not in fields:  # MLA derives its head sizes
        values["head_dim"] = getattr(config, "head_dim", None) or \
            config.hidden_size // heads
    vocab = config.vocab_size
    multiple = VOCAB_MULTIPLE * tp
    values["vocab_size"] = -(-vocab // multiple) * multiple // tp
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token = getattr(config, key, None)
        if isinstance(token, int) and token >= values["vocab_size"]:
            values[key] = values["vocab_size"] - 1
    return values


# ------------------------------------------------------------- recording


class Recording:
    """A recorded step after the rewrite: what record_cpu_cli.record_steps'
    Recorder gives (`.trace`, `.summary()`, `.write(path)`), plus
    `sharded`: {"parameters"|"gradients"|"optimizer": [bytes before,
    bytes after]} of the requests the rewrite shrank, and
    `gathered_bytes` (ZeRO-3's gathered layer)."""

    def __init__(self, trace, sharded=None, gathered_bytes=0):
        self.trace = trace
        self.sharded = sharded or {}
        self.gathered_bytes = gathered_bytes

    def summary(self):
        # pylint: disable-next=import-outside-toplevel
        from loom.tools.record_summary import summarize
        setup = 0
        for event in self.trace.events:
            if event.kind == loom_trace.ITER_BEGIN:
                break
            if event.kind == loom_trace.ALLOC:
                setup += event.size
        return summarize(self.trace.events, setup=setup)

    def write(self, path):
        loom_trace.write_trace(self.trace, path)


class _Ids:
    """Request ids (and element sizes) of what ZeRO shards, seen while the
    step runs: the parameters, the gradients the optimizer reads."""

    def __init__(self, params=(), optimizer=None, zero=0, unit_bytes=0):
        self.params = {}      # request id -> element size
        self.grads = {}
        self.unit_bytes = unit_bytes  # the largest layer's parameters
        self._tensors = list(params)
        self._zero = zero
        if optimizer is not None and zero >= 2:
            optimizer.register_step_pre_hook(self._before_step)
        self._recorder = None

    def start(self, recorder):
        """Recording has started: the parameters' set-up requests."""
        self._recorder = recorder
        if self._zero >= 3:
            for param in self._tensors:
                request = recorder.request_of(param)
                if request is not None:
                    self.params[request] = param.element_size()
            if not self.unit_bytes:
                self.unit_bytes = max(
                    (p.numel() * p.element_size() for p in self._tensors),
                    default=0)

    def _before_step(self, *_):
        if self._recorder is None:
            return
        for param in self._tensors:
            if param.grad is not None:
                request = self._recorder.request_of(param.grad)
                if request is not None:
                    self.grads[request] = param.grad.element_size()


def record_ids(params, optimizer, zero):
    """What shard_trace needs of a step that `optimizer` steps over
    `params` (ZeRO stage `zero`): call `.start(recorder)` once recording
    has begun. ZeRO-3's gathered unit is the largest parameter."""
    return _Ids(params, optimizer, zero)


def _layer_units(trainer):
    """The largest FSDP unit's parameter bytes: a decoder layer, or the
    rest (embedding, head, norms)."""
    model = trainer.model
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = list(getattr(base, "layers", []) or [])
    held = {id(p) for p in trainer.parameters}
    in_layer = set()
    units = []
    for layer in layers:
        size = 0
        for param in layer.parameters():
            in_layer.add(id(param))
            if id(param) in held:
                size += param.numel() * param.element_size()
        units.append(size)
    units.append(sum(p.numel() * p.element_size() for p in trainer.parameters
                     if id(p) not in in_layer))
    return max(units)


def preparer(parallel, found):
    """The hook record_cpu_cli.record_steps calls before the first step
    (its `prepare`): the optimizer, and found[0] becomes the step's
    ids (finish's `ids`)."""
    def prepare(trainer, recorder):
        import torch  # pylint: disable=import-outside-toplevel
        params = trainer.parameters
        if parallel.optimizer != "adamw":  # the trainer's own is AdamW
            trainer.optimizer = cpu_models.make_optimizer(
                torch, parallel.optimizer, params)
        ids = _Ids(params, trainer.optimizer, parallel.zero,
                   _layer_units(trainer) if parallel.zero >= 3 else 0)
        ids.start(recorder)
        found.append(ids)
    return prepare


def finish(trace, parallel, ids):
    """The recorded trace of a step prepared by preparer: provenance, then
    the ZeRO rewrite (shard_trace); returns a Recording."""
    trace.provenance = (trace.provenance or "") + f" | {parallel.describe()}"
    return shard_trace(trace, parallel, ids)


def _shard(size, n, element):
    elements = -(-size // element)
    return -(-elements // n) * element


def shard_trace(trace, parallel, ids=None):
    """`trace` (a loom.tools.trace.Trace) as one of `parallel.dp` ZeRO
    ranks (the module docstring); returns a Recording. The trace is not
    changed."""
    ids = ids or _Ids()
    n, stage = parallel.dp, parallel.zero
    sharded = {}
    if stage == 0 or n < 2:
        return Recording(trace)
    events = []
    next_id = 1 + max((e.id for e in trace.events
                       if e.kind == loom_trace.ALLOC), default=0)
    gathered = None
    optimizer = False
    for event in trace.events:
        kind = event.kind
        if kind == loom_trace.ITER_BEGIN:
            optimizer = False
        elif kind == loom_trace.PHASE:
            optimizer = event.name == "optimizer"
            if optimizer and gathered is not None:
                events.append(loom_trace.Event.free(gathered))
                gathered = None
        elif kind == loom_trace.ITER_END and gathered is not None:
            events.append(loom_trace.Event.free(gathered))
            gathered = None
        if kind == loom_trace.ALLOC:
            what, element = None, 1
            if stage >= 3 and event.id in ids.params:
                what, element = "parameters", ids.params[event.id]
            elif stage >= 2 and event.id in ids.grads:
                what, element = "gradients", ids.grads[event.id]
            elif optimizer:
                what = "optimizer"
            if what is not None:
                size = _shard(event.size, n, element)
                before, after = sharded.get(what, (0, 0))
                sharded[what] = [before + event.size, after + size]
                event = dataclasses.replace(event, size=size)
        events.append(event)
        if kind == loom_trace.ITER_BEGIN and stage >= 3 and ids.unit_bytes:
            gathered = next_id
            next_id += 1
            events.append(loom_trace.Event.alloc(gathered, ids.unit_bytes))
    result = loom_trace.Trace(device=trace.device,
                              granularity=trace.granularity,
                              provenance=trace.provenance, events=events)
    return Recording(result, sharded,
                     ids.unit_bytes if stage >= 3 else 0)

