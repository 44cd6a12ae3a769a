"""Models by name and their training steps, for `loom record-cpu`.

A model is any `model_type` transformers' AutoConfig.for_model knows
(llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3,
gpt_oss, ...) with a causal-LM head, built from its config with random
weights (nothing is downloaded). Its sizes are shrunk by TINY (every key
the config has) so that a step runs in well under a second on two cores,
with the model's own module structure and MoE routing; `overrides` (the
command's `--set key=value`) win over both. `use_cache` is off (training).

A training step: forward (the loss of random tokens as labels), backward,
AdamW (foreach, as PyTorch picks on CUDA) and zero_grad(set_to_none=True),
on `microbatches` micro-batches:

  plain             micro-batch by micro-batch, forward then backward
                    (gradient accumulation), the whole model
  1f1b              one rank of a `stages`-stage pipeline in Megatron's
                    1F1B order: the decoder layers are split into `stages`
                    contiguous stages and this process holds stage `rank`
  interleaved:C     one rank of Megatron's interleaved (virtual pipeline)
                    schedule: layers split into stages * C chunks, rank r
                    holds chunks r, r + stages, ...

A pipeline rank is emulated in one process as it would run on its GPU: it
holds only its chunks' layers (the first chunk also the embedding, the
last one the final norm, the head and the loss), runs them in the
schedule's order, and what the neighbouring ranks would send arrives as a
fresh tensor of the right shape (random: the received activation, with
requires_grad, and the received gradient). A chunk's output is kept for its
backward and deallocated after the "send" as Megatron does
(deallocate_pipeline_outputs: the data becomes one element, the backward
goes through the autograd engine directly); the gradient of a chunk's input
is sent and dropped after its backward. Gradients accumulate in each
parameter's `.grad` (PyTorch's default, not Megatron's contiguous
gradient buffer). Everything runs on stream 0.

`dtype`: "fp32"; "bf16" = autocast to bfloat16 over float32 weights (with
CUDA's autocast policy while recording, loom.tools.cpu_autocast);
"bf16-pure" = the model in bfloat16, no autocast.

Markers go to a `sink` with begin_iteration/end_iteration/phase/
module_enter/module_exit (a loom.tools.record_cpu.Recorder, or the loom
package on a GPU): per step one iteration; phases forward and backward per
micro-batch (and chunk), then optimizer; pipeline chunks are modules named
"chunk<g>" (g = the global chunk index) around each forward and backward.

transformers and torch are imported inside the functions only.
"""

import contextlib
import copy
import dataclasses
import json

from loom.errors import LoomError

# Sizes small enough for a CPU step in well under a second, applied to the
# keys a config has (names as in its to_dict(), so each model's own
# spelling of "number of experts" is the one set).
TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 256,
    "num_local_experts": 8,
    "num_experts": 8,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 32,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16,
    "v_head_dim": 32,
}

SCHEDULES = ("plain", "1f1b", "interleaved")
DTYPES = ("fp32", "bf16", "bf16-pure")
# The optimizers a recorded step may take (make_optimizer).
OPTIMIZERS = ("adamw", "sgd")


@dataclasses.dataclass
class StepSpec:
    """One training step's shape (what the command line chose)."""
    model_type: str
    overrides: dict = dataclasses.field(default_factory=dict)
    batch: int = 2
    seq: int = 128
    recompute: bool = False
    schedule: str = "plain"
    chunks: int = 1          # interleaved:C
    stages: int = 1          # pipeline size (1f1b, interleaved)
    rank: int = 0            # the pipeline rank emulated
    microbatches: int = 1
    dtype: str = "fp32"
    attn: str = None         # attn_implementation (None: transformers')
    experts: str = None      # experts_implementation (None: transformers')
    tiny: bool = True
    seed: int = 0
    real: bool = False       # real arithmetic (False: FakeTensors)
    # cuBLAS's workspaces recorded (None: on FakeTensors, not with real)
    cuda_workspaces: bool = None


class ModelError(LoomError):
    """A model type, a --set key or a value that does not work (one line)."""


def make_optimizer(torch, name, params):
    """The optimizer of a recorded step over `params`: "adamw" or "sgd"
    (momentum 0.9), lr 1e-4, the foreach path CUDA takes.
    REQUIRES: name in OPTIMIZERS."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def parse_value(text):
    """A --set value: JSON (numbers, true/false/null, lists, quoted
    strings), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        lowered = text.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered in ("none", "null"):
            return None
        return text


def parse_overrides(items):
    """`key=value,key=value` strings (repeatable) -> dict. A value holding
    commas must be JSON (a list) or quoted."""
    result = {}
    for item in items:
        for part in _split_top_level(item):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ModelError(f"--set: expected key=value, got {part!r}")
            result[key] = parse_value(value.strip())
    return result


def _split_top_level(text):
    """Splits at commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _line(error):
    """An exception's message on one line."""
    return " ".join(str(error).split()) or type(error).__name__


def _transformers():
    try:
        import transformers  # pylint: disable=import-outside-toplevel
    except ImportError:
        # pylint: disable-next=import-outside-toplevel
        from loom import _extras
        raise LoomError(_extras.message("loom", "a model by name",
                                        ["transformers"])) from None
    return transformers


def model_types():
    """Every model_type transformers' AutoConfig knows."""
    transformers = _transformers()
    # pylint: disable-next=import-outside-toplevel
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    del transformers
    return sorted(CONFIG_MAPPING.keys())


def build_config(spec):
    """The transformers config of `spec`: defaults of its model_type, then
    TINY (unless spec.tiny is False), then spec.overrides. Unknown model
    types and keys are ModelErrors."""
    transformers = _transformers()
    known = model_types()
    if spec.model_type not in known:
        close = [t for t in known if spec.model_type.lower() in t][:8]
        hint = f" (close: {', '.join(close)})" if close else \
            " (e.g. llama, qwen3, mixtral, qwen3_moe, deepseek_v3, gpt_oss)"
        raise ModelError(f"unknown model type {spec.model_type!r}: "
                         f"transformers {transformers.__version__}'s "
                         f"AutoConfig does not know it{hint}")
    try:
        default = transformers.AutoConfig.for_model(spec.model_type)
    except Exception as error:  # pylint: disable=broad-except
        raise ModelError(f"model type {spec.model_type!r}: transformers "
                         f"cannot make its config: {_line(error)}") from None
    fields = default.to_dict()
    aliases = getattr(default, "attribute_map", {}) or {}
    # head_dim: read as getattr(config, "head_dim", hidden // heads) by
    # the attention of configs without the key (--tp keeps it).
    bad = [k for k in spec.overrides
           if k not in fields and k not in aliases and k != "head_dim"]
    if bad:
        keys = sorted(k for k in fields if not k.startswith("_"))
        raise ModelError(f"--set {bad[0]}: {spec.model_type}'s config has no "
                         f"key {bad[0]!r} (keys: {', '.join(keys[:40])}"
                         f"{', ...' if len(keys) > 40 else ''})")
    values = {}
    if spec.tiny:
        for key, value in TINY.items():
            key = key if key in fields else aliases.get(key)
            if key in fields and key not in values:
                values[key] = value
        if "qk_rope_head_dim" in fields:
            values.pop("head_dim", None)  # derived from qk_rope_head_dim
        vocab = values.get("vocab_size")
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            token = fields.get(key)
            if vocab and isinstance(token, int) and token >= vocab:
                values[key] = vocab - 1  # inside the tiny vocabulary
    positions = aliases.get("max_position_embeddings",
                            "max_position_embeddings")
    if isinstance(fields.get(positions), int) and \
            fields[positions] < spec.seq:
        values[positions] = spec.seq
    if "use_cache" in fields:
        values["use_cache"] = False
    for key, value in spec.overrides.items():
        values[aliases.get(key, key)] = value
    try:
        config = transformers.AutoConfig.for_model(spec.model_type, **values)
    except Exception as error:  # pylint: disable=broad-except
        raise ModelError(f"model type {spec.model_type!r}: the config "
                         f"refuses these values: {_line(error)}") from None
    return config


def build_model(spec):
    """(config, model): the causal LM of `spec` with random weights (seed
    spec.seed), in training mode, recomputation and dtype applied."""
    transformers = _transformers()
    import torch  # pylint: disable=import-outside-toplevel
    config = build_config(spec)
    kwargs = {}
    if spec.attn:
        kwargs["attn_implementation"] = spec.attn
    if spec.experts:
        kwargs["experts_implementation"] = spec.experts
    torch.manual_seed(spec.seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config,
                                                              **kwargs)
    except ValueError as error:
        raise ModelError(f"model type {spec.model_type!r}: no causal-LM "
                         f"model can be built from it ({_line(error)})"
                         ) from None
    except Exception as error:  # pylint: disable=broad-except
        raise ModelError(f"model type {spec.model_type!r}: building the "
                         f"model failed: {type(error).__name__}: "
                         f"{_line(error)}") from None
    if spec.dtype == "bf16-pure":
        model = model.to(torch.bfloat16)
    if spec.recompute:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return config, model


# ------------------------------------------------------------- schedules


def schedule_order(schedule, microbatches, stages=1, chunks=1, rank=0):
    """The work of pipeline rank `rank` in one iteration, in order: a list
    of ("F" | "B", local chunk, micro-batch).

    plain: F, B per micro-batch. 1f1b (Megatron's non-interleaved
    schedule): stages - rank - 1 warm-up forwards (at most microbatches),
    then one forward and one backward at a time, then the remaining
    backwards. interleaved (Megatron's virtual pipeline): micro-batches go
    through the chunks in groups of `stages`; the warm-up is
    (stages - rank - 1) * 2 + (chunks - 1) * stages forwards (all of them
    when microbatches == stages); needs microbatches % stages == 0."""
    if microbatches < 1 or stages < 1 or chunks < 1:
        raise ModelError("microbatches, stages and chunks must be positive")
    if not 0 <= rank < stages:
        raise ModelError(f"rank {rank} is not in [0, {stages})")
    if schedule == "plain":
        order = []
        for mb in range(microbatches):
            order += [("F", 0, mb), ("B", 0, mb)]
        return order
    if schedule == "1f1b":
        warmup = min(stages - rank - 1, microbatches)
        order = [("F", 0, mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", 0, warmup + i), ("B", 0, i)]
        order += [("B", 0, mb) for mb in range(microbatches - warmup,
                                                microbatches)]
        return order
    if schedule != "interleaved":
        raise ModelError(f"unknown schedule {schedule!r}")
    if microbatches % stages:
        raise ModelError(f"interleaved: microbatches ({microbatches}) must "
                         f"be a multiple of the pipeline stages ({stages})")
    total = microbatches * chunks
    group = stages * chunks

    def unit(k, forward):
        chunk = (k % group) // stages
        if not forward:
            chunk = chunks - 1 - chunk
        return chunk, (k // group) * stages + k % stages

    if microbatches == stages:
        warmup = total
    else:
        warmup = min(total, (stages - rank - 1) * 2 + (chunks - 1) * stages)
    order = [("F",) + unit(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        order.append(("F",) + unit(warmup + i, True))
        order.append(("B",) + unit(i, False))
    for i in range(total - warmup, total):
        order.append(("B",) + unit(i, False))
    return order


# ---------------------------------------------------------------- chunks


class _Chunk:
    """Global chunk `index` of a causal LM: its decoder layers (and the
    embedding if first, the norm, head and loss if last) as a callable."""

    def __init__(self, model, index, layer_indices, first, last):
        import torch  # pylint: disable=import-outside-toplevel
        self.index = index
        self.first = first
        self.last = last
        prefix = model.base_model_prefix
        base = getattr(model, prefix)
        layers = list(base.layers)
        part = _shallow(base)
        config = copy.copy(base.config)
        config.num_hidden_layers = len(layer_indices)
        if getattr(config, "layer_types", None):
            config.layer_types = [config.layer_types[i]
                                  for i in layer_indices]
        part.__dict__["config"] = config
        part._modules["layers"] = torch.nn.ModuleList(
            [layers[i] for i in layer_indices])
        if not last:
            part._modules["norm"] = torch.nn.Identity()
        self.base = part
        self.model = None
        if last:
            self.model = _shallow(model)
            self.model._modules[prefix] = part

    def __call__(self, inputs, labels):
        """Forward: inputs are token ids (first chunk) or hidden states.
        Returns the hidden states, or the loss for the last chunk."""
        key = "input_ids" if self.first else "inputs_embeds"
        if self.last:
            return self.model(**{key: inputs}, labels=labels).loss
        return self.base(**{key: inputs}).last_hidden_state


def _shallow(module):
    """A shallow copy of a module with its own table of submodules (the
    parameters, buffers and hooks stay shared)."""
    clone = copy.copy(module)
    clone.__dict__["_modules"] = dict(module._modules)
    return clone


class Stage:
    """What one pipeline rank holds: its chunks and their parameters."""

    def __init__(self, model, spec):
        import torch  # pylint: disable=import-outside-toplevel
        base = getattr(model, model.base_model_prefix, None)
        layers = getattr(base, "layers", None)
        if not isinstance(layers, torch.nn.ModuleList):
            raise ModelError(f"{type(model).__name__}: pipeline schedules "
                             f"need the decoder layers at "
                             f"model.{model.base_model_prefix}.layers")
        count = spec.stages * spec.chunks
        if len(layers) % count:
            raise ModelError(f"{len(layers)} decoder layers do not split into "
                             f"{spec.stages} stages x {spec.chunks} chunks "
                             f"(--set num_hidden_layers=N, N a multiple of "
                             f"{count})")
        per = len(layers) // count
        layer_of = {}
        for number, layer in enumerate(layers):
            for name, param in layer.named_parameters():
                del name
                layer_of[id(param)] = number
        embed = getattr(base, "embed_tokens", None)
        embed_params = {id(p) for p in embed.parameters()} if embed else set()
        self.chunks = []
        held = set()
        params = []
        for local in range(spec.chunks):
            index = local * spec.stages + spec.rank
            indices = list(range(index * per, (index + 1) * per))
            first, last = index == 0, index == count - 1
            self.chunks.append(_Chunk(model, index, indices, first, last))
            wanted = set(indices)
            for param in model.parameters():
                number = layer_of.get(id(param))
                if number is None:
                    mine = (first if id(param) in embed_params else last)
                else:
                    mine = number in wanted
                if mine and id(param) not in held:
                    held.add(id(param))
                    params.append(param)
        self.parameters = params
        self.buffers = [b for name, b in base.named_buffers()
                        if not name.startswith("layers.")]
        self.buffers += [b for chunk in self.chunks
                         for layer in chunk.base.layers
                         for b in layer.buffers()]


# ------------------------------------------------------------------ steps


class _NoSink:
    """Markers that go nowhere."""

    def __getattr__(self, _name):
        return lambda *args, **kwargs: None


class Trainer:
    """A model, its optimizer and its step. `step()` runs one iteration with
    its markers on `sink`; `tracked` are the tensors alive before the
    first step (set-up), `model` the module whose modules get markers."""

    def __init__(self, spec):
        import torch  # pylint: disable=import-outside-toplevel
        self.torch = torch
        self.spec = spec
        # pylint: disable-next=import-outside-toplevel
        from loom.tools import fake_record
        with contextlib.nullcontext() if spec.real else \
                fake_record.building():
            self._build(spec)
        self.sink = _NoSink()
        self.device = "cpu"

    def _build(self, spec):
        torch = self.torch
        self.config, self.model = build_model(spec)
        self.vocab = self.config.vocab_size
        self.stage = None
        if spec.schedule == "plain":
            params = list(self.model.parameters())
            self.tracked = [self.model]
        else:
            self.stage = Stage(self.model, spec)
            params = self.stage.parameters
            self.tracked = params + self.stage.buffers
        self.parameters = params
        self.order = schedule_order(spec.schedule, spec.microbatches,
                                    spec.stages, spec.chunks, spec.rank)
        self.optimizer = make_optimizer(torch, "adamw", params)

    def autocast(self):
        torch = self.torch
        if self.spec.dtype == "bf16":
            return torch.autocast(self.device_type(), dtype=torch.bfloat16)
        return torch.autocast(self.device_type(), enabled=False)

    def device_type(self):
        return torch_device_type(self.device)

    def tokens(self):
        return self.torch.randint(self.vocab, (self.spec.batch,
                                               self.spec.seq),
                                  device=self.device)

    def step(self, index):
        """Iteration `index`: returns the loss (a float)."""
        sink = self.sink
        sink.begin_iteration()
        if self.stage is None:
            loss = self._plain_step()
        else:
            loss = self._pipeline_step()
        sink.phase("optimizer")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sink.end_iteration()
        del index
        return loss

    def _plain_step(self):
        sink, spec = self.sink, self.spec
        total = 0.0
        for _ in range(spec.microbatches):
            sink.phase("forward")
            tokens = self.tokens()
            with self.autocast():
                loss = self.model(input_ids=tokens, labels=tokens).loss
            del tokens
            if spec.microbatches > 1:
                loss = loss / spec.microbatches
            sink.phase("backward")
            loss.backward()
            total += loss.item()
            del loss
        return total

    def _pipeline_step(self):
        torch, sink, spec = self.torch, self.sink, self.spec
        stage = self.stage
        width = self.config.hidden_size
        dtype = next(iter(stage.parameters)).dtype
        shape = (spec.batch, spec.seq, width)
        inputs, outputs = {}, {}
        total = 0.0
        for kind, local, mb in self.order:
            chunk = stage.chunks[local]
            name = f"chunk{chunk.index}"
            if kind == "F":
                sink.phase("forward")
                if chunk.first or chunk.last:
                    tokens = self.tokens()
                if chunk.first:
                    x = tokens
                else:  # received from the previous stage
                    x = torch.randn(shape, dtype=dtype, device=self.device,
                                    requires_grad=True)
                    inputs[(local, mb)] = x
                sink.module_enter(name)
                with self.autocast():
                    out = chunk(x, tokens if chunk.last else None)
                sink.module_exit(name)
                del x
                if chunk.first or chunk.last:
                    del tokens
                if chunk.last:
                    out = out / spec.microbatches
                    outputs[(local, mb)] = (out, None)
                else:  # sent: Megatron deallocates the output's data
                    kept = (tuple(out.shape), out.dtype)
                    out.data = torch.empty((1,), dtype=out.dtype,
                                           device=out.device)
                    outputs[(local, mb)] = (out, kept)
                del out
            else:
                sink.phase("backward")
                out, kept = outputs.pop((local, mb))
                if kept is None:
                    total += out.item()
                    grad = torch.ones_like(out)
                else:  # received from the next stage
                    grad = torch.randn(kept[0], dtype=kept[1],
                                       device=self.device)
                sink.module_enter(name)
                _run_backward(out, grad)
                sink.module_exit(name)
                del out, grad
                x = inputs.pop((local, mb), None)
                if x is not None:  # its gradient is sent, then dropped
                    x.grad = None
                    del x
        if inputs or outputs:
            raise AssertionError("the schedule left work undone")
        return total


def _run_backward(output, grad):
    """Backward from `output` with gradient `grad`, straight through the
    autograd engine (as Megatron's custom_backward: the output's data may
    have been deallocated, so the shape check of torch.autograd.backward
    must not run)."""
    # pylint: disable-next=import-outside-toplevel
    from torch.autograd.variable import Variable
    # pylint: disable-next=protected-access
    Variable._execution_engine.run_backward(
        tensors=(output,), grad_tensors=(grad,), keep_graph=False,
        create_graph=False, inputs=tuple(), allow_unreachable=True,
        accumulate_grad=True)


def torch_device_type(device):
    return str(device).split(":", 1)[0]
