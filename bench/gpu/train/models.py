"""The models of the GPU training comparison (bench/gpu/train/compare.py).

Each model is a `ModelSpec` (pure data, no torch) and a builder that makes
a `Trainer`: one call of `trainer.step(step_index)` runs one training
iteration (forward, backward, optimizer step) and returns the loss as a
float. Weights and data are random from fixed seeds (nothing can be
downloaded on the GPU machine); mixed precision is bf16 autocast over fp32
weights with AdamW, as in most training scripts.

  llama1b            Llama-style decoder, about 1.1B parameters (TinyLlama
                     shapes: 22 layers, width 2048, GQA 32/4 heads), HF
                     transformers' LlamaForCausalLM from a config.
  llama1b_recompute  the same with activation recomputation (HF gradient
                     checkpointing, non-reentrant).
  moe                Mixtral-style MoE (8 experts, top-2 routing, 8 layers,
                     width 1024), HF MixtralForCausalLM: the tokens each
                     expert gets change every step (with transformers 5.17
                     on the H200 its requests kept their sizes: the
                     recorded iterations' are identical).
  gpt2_interleaved   GPT-2-medium-style model (24 layers, width 1024) split
                     into 2 virtual-pipeline chunks, micro-batches run in
                     the order of Megatron's interleaved 1F1B schedule for
                     the first rank of a 4-stage pipeline (`interleaved_order`):
                     several micro-batches' activations live at once, freed
                     out of order, as on a real pipeline rank.

`scale="tiny"` shrinks every model (same structure) for smoke tests.
torch and transformers are imported inside the builders only, so
`interleaved_order` and the specs are usable (and tested) without them.
"""

import dataclasses

# The allocators compared: PyTorch's caching allocator, the same with
# expandable_segments:True, loom (auto mode).
ALLOCATORS = ("torch", "expandable", "loom")
# loom with another physical layout (issue 21: does the GPU pay for handle
# size or mapping count?), for `compare.py run --allocators` and the
# steptime recipe: name -> loom.enable() options. At CUDA's 2 MiB
# granularity, chunk1 maps 2 MiB handles and chunk10 20 MiB ones (what
# expandable segments map); plain loom maps up to 1 GiB per handle.
LOOM_VARIANTS = {
    "loom-chunk1": {"max_chunk_pages": 1},
    "loom-chunk10": {"max_chunk_pages": 10},
}
# loom in plan mode: served from its first request by a plan file made
# beforehand (`loom plan`) from the recording of another process of the same
# model (compare.py run --plans DIR: DIR/<model>.lplan), as a user who
# recorded once and plans offline runs it: the recording is another run's
# (another process, another day) of the same job, whose requests repeat
# (fixed seeds), measured on iterations the recording did not hold; the plan
# check in the plan file decides whether it is served (a plan that loses on
# its recording is declined and the run served unplanned).
PLANNED = "loom-plan"
# loom in auto mode with remember=True, measured on its second run: a first
# process of the same model ("prime", not measured) records, plans and
# leaves its whole-run plan in the workdir; the measured process serves it
# from its first request and confirms it (docs/plugin.md, "Auto mode
# across runs").
REMEMBERED = "loom-remember"
ALL_ALLOCATORS = ALLOCATORS + tuple(LOOM_VARIANTS) + (PLANNED, REMEMBERED)


def is_loom(allocator):
    """True for loom, its layout variants, plan mode and remember."""
    return (allocator == "loom" or allocator in LOOM_VARIANTS or
            allocator in (PLANNED, REMEMBERED))


def served_plan(line):
    """Whether a loom run's result line says it served a plan: auto mode
    ends "planned"; plan mode is "serving" from the start, with its plan
    loaded (lines written before `plan_loaded` was kept: a hit rate)."""
    state = line.get("loom_state")
    if line.get("allocator") == REMEMBERED and line.get("kind") == "measure":
        # The second run: served the first run's plan.
        return state == "planned" and line.get("plan_source") == "previous run"
    if line.get("allocator") == PLANNED:
        loaded = line.get("plan_loaded")
        if loaded is None:
            loaded = line.get("hit_rate") is not None
        return state == "serving" and bool(loaded)
    return state == "planned"


def loom_options(allocator):
    """loom.enable() options of a loom allocator name (plain loom: {})."""
    return dict(LOOM_VARIANTS.get(allocator, {}))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str               # llama, mixtral, gpt2vp
    micro_batch: int        # sequences per micro-batch (the default size)
    seq: int                # tokens per sequence
    dims: tuple             # (vocab, width, layers, heads, kv_heads, ffn)
    recompute: bool = False
    experts: int = 0
    top_k: int = 0
    microbatches: int = 1   # per iteration (gpt2_interleaved)
    stages: int = 1         # pipeline size emulated (gpt2_interleaved)
    chunks: int = 1         # virtual chunks (gpt2_interleaved)
    dense: bool = True      # the target: 99% (dense) or 98% (MoE)


_FULL = {
    "llama1b": ModelSpec("llama1b", "llama", 4, 2048,
                         (32000, 2048, 22, 32, 4, 5632)),
    "llama1b_recompute": ModelSpec("llama1b_recompute", "llama", 4, 2048,
                                   (32000, 2048, 22, 32, 4, 5632),
                                   recompute=True),
    "moe": ModelSpec("moe", "mixtral", 8, 1024,
                     (32000, 1024, 8, 16, 4, 3584), experts=8, top_k=2,
                     dense=False),
    "gpt2_interleaved": ModelSpec("gpt2_interleaved", "gpt2vp", 4, 1024,
                                  (50304, 1024, 24, 16, 16, 4096),
                                  microbatches=8, stages=4, chunks=2),
}

_TINY_DIMS = {
    "llama": (1024, 128, 2, 4, 2, 256),
    "mixtral": (1024, 128, 2, 4, 2, 256),
    "gpt2vp": (1024, 128, 4, 4, 4, 512),
}

MODEL_NAMES = tuple(_FULL)


def spec(name, scale="full"):
    """The spec of model `name` at `scale` ("full" or "tiny")."""
    if name not in _FULL:
        raise ValueError(f"unknown model {name!r} (models: "
                         f"{', '.join(MODEL_NAMES)})")
    if scale == "full":
        return _FULL[name]
    if scale != "tiny":
        raise ValueError(f"unknown scale {scale!r} (full or tiny)")
    full = _FULL[name]
    return dataclasses.replace(full, seq=128, micro_batch=2,
                               dims=_TINY_DIMS[full.kind],
                               microbatches=min(full.microbatches, 4),
                               stages=min(full.stages, 2))


def interleaved_order(microbatches, stages, chunks, rank=0):
    """The order of work of pipeline rank `rank` in Megatron's interleaved
    1F1B schedule: a list of ("F" or "B", chunk, micro_batch).

    Micro-batches go through the chunks in groups of `stages`; rank r runs
    (stages - r - 1) * 2 + (chunks - 1) * stages forwards first (warm-up),
    then alternates one forward and one backward, then the remaining
    backwards. Precondition: microbatches is a multiple of stages when
    chunks > 1."""
    if microbatches < 1 or stages < 1 or chunks < 1:
        raise ValueError("microbatches, stages and chunks must be positive")
    if chunks > 1 and microbatches % stages:
        raise ValueError(f"interleaving needs microbatches ({microbatches})"
                         f" to be a multiple of stages ({stages})")
    if not 0 <= rank < stages:
        raise ValueError(f"rank {rank} is not in [0, {stages})")
    total = microbatches * chunks
    group = stages * chunks

    def unit(k, forward):
        chunk = (k % group) // stages
        if not forward:
            chunk = chunks - 1 - chunk
        return chunk, (k // group) * stages + k % stages

    warmup = min(total, (stages - rank - 1) * 2 + (chunks - 1) * stages)
    order = [("F",) + unit(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        order.append(("F",) + unit(warmup + i, True))
        order.append(("B",) + unit(i, False))
    for i in range(total - warmup, total):
        order.append(("B",) + unit(i, False))
    return order


# --------------------------------------------------------------- builders


class Trainer:
    """One model with its optimizer and data. `step(i)` runs iteration i
    and returns its loss (a float: the step ends with a host sync)."""

    def __init__(self, torch, spec_, model, micro_batch, seed=1234,
                 device="cuda"):
        self.torch = torch
        self.spec = spec_
        self.model = model
        self.micro_batch = micro_batch
        self.device = device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.generator = torch.Generator().manual_seed(seed)

    def batch(self):
        vocab = self.spec.dims[0]
        tokens = self.torch.randint(vocab, (self.micro_batch, self.spec.seq),
                                    generator=self.generator)
        return tokens.to(self.device, non_blocking=False)

    def step(self, index):
        del index
        torch = self.torch
        tokens = self.batch()
        with torch.autocast(self.device, dtype=torch.bfloat16):
            loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def _hf_model(torch, spec_, device="cuda"):
    import transformers  # pylint: disable=import-outside-toplevel
    vocab, width, layers, heads, kv_heads, ffn = spec_.dims
    common = dict(vocab_size=vocab, hidden_size=width, intermediate_size=ffn,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads,
                  max_position_embeddings=spec_.seq, use_cache=False)
    if spec_.kind == "llama":
        config = transformers.LlamaConfig(**common)
    else:
        config = transformers.MixtralConfig(
            num_local_experts=spec_.experts,
            num_experts_per_tok=spec_.top_k, output_router_logits=False,
            **common)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                config, attn_implementation="sdpa")
        except (TypeError, ValueError):
            model = transformers.AutoModelForCausalLM.from_config(config)
    if spec_.recompute:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


class _Gpt2Chunks:
    """A GPT-2-style model in pure torch, its blocks split into chunks."""

    def __init__(self, torch, spec_, device="cuda"):
        nn = torch.nn
        functional = torch.nn.functional
        vocab, width, layers, heads, _, ffn = spec_.dims
        seq = spec_.seq

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1 = nn.LayerNorm(width)
                self.qkv = nn.Linear(width, 3 * width)
                self.proj = nn.Linear(width, width)
                self.ln2 = nn.LayerNorm(width)
                self.fc1 = nn.Linear(width, ffn)
                self.fc2 = nn.Linear(ffn, width)

            def forward(self, x):
                b, n, _ = x.shape
                q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
                q, k, v = (t.view(b, n, heads, width // heads).transpose(1, 2)
                           for t in (q, k, v))
                a = functional.scaled_dot_product_attention(q, k, v,
                                                            is_causal=True)
                x = x + self.proj(a.transpose(1, 2).reshape(b, n, width))
                return x + self.fc2(functional.gelu(self.fc1(self.ln2(x))))

        class First(nn.Module):
            def __init__(self, blocks):
                super().__init__()
                self.embed = nn.Embedding(vocab, width)
                self.pos = nn.Parameter(torch.zeros(1, seq, width))
                self.blocks = nn.ModuleList(blocks)

            def forward(self, tokens):
                x = self.embed(tokens) + self.pos[:, :tokens.shape[1]]
                for block in self.blocks:
                    x = block(x)
                return x

        class Middle(nn.Module):
            def __init__(self, blocks):
                super().__init__()
                self.blocks = nn.ModuleList(blocks)

            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return x

        class Last(nn.Module):
            def __init__(self, blocks):
                super().__init__()
                self.blocks = nn.ModuleList(blocks)
                self.ln = nn.LayerNorm(width)
                self.head = nn.Linear(width, vocab, bias=False)

            def forward(self, x, tokens):
                for block in self.blocks:
                    x = block(x)
                logits = self.head(self.ln(x)).float()
                return functional.cross_entropy(
                    logits[:, :-1].reshape(-1, vocab),
                    tokens[:, 1:].reshape(-1))

        chunks = spec_.chunks
        if layers % chunks:
            raise ValueError(f"{layers} layers do not split into {chunks}")
        per = layers // chunks
        with torch.device(device):
            parts = [[Block() for _ in range(per)] for _ in range(chunks)]
            if chunks == 1:
                raise ValueError("gpt2_interleaved needs 2 chunks or more")
            self.chunks = nn.ModuleList(
                [First(parts[0])] + [Middle(p) for p in parts[1:-1]] +
                [Last(parts[-1])])
        self.chunks.train()


class InterleavedTrainer(Trainer):
    """gpt2_interleaved: one iteration is `spec.microbatches` micro-batches
    through the chunks in `interleaved_order`; each chunk's input is
    detached from the previous chunk's output (as a pipeline stage receives
    it), and its gradient is handed back in the backward."""

    def __init__(self, torch, spec_, micro_batch, seed=1234, device="cuda"):
        model = _Gpt2Chunks(torch, spec_, device).chunks
        super().__init__(torch, spec_, model, micro_batch, seed, device)
        self.order = interleaved_order(spec_.microbatches, spec_.stages,
                                       spec_.chunks)

    def step(self, index):
        del index
        torch = self.torch
        spec_ = self.spec
        last = spec_.chunks - 1
        tokens = [self.batch() for _ in range(spec_.microbatches)]
        inputs, outputs = {}, {}
        total = 0.0
        for kind, chunk, mb in self.order:
            if kind == "F":
                with torch.autocast(self.device, dtype=torch.bfloat16):
                    if chunk == 0:
                        out = self.model[0](tokens[mb])
                    else:
                        x = outputs[(chunk - 1, mb)].detach()
                        x.requires_grad_(True)
                        inputs[(chunk, mb)] = x
                        out = (self.model[chunk](x, tokens[mb])
                               if chunk == last else self.model[chunk](x))
                if chunk == last:
                    out = out / spec_.microbatches
                outputs[(chunk, mb)] = out
            else:
                out = outputs.pop((chunk, mb))
                if chunk == last:
                    total += out.detach()
                    out.backward()
                else:
                    grad = inputs.pop((chunk + 1, mb)).grad
                    torch.autograd.backward(out, grad)
        assert not outputs and not inputs, "schedule left work undone"
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total)


def build(torch, spec_, micro_batch, seed=1234, device="cuda"):
    """A Trainer for `spec_` with `micro_batch` sequences per micro-batch.
    Precondition: CUDA is usable (and the allocator already chosen).
    `device="cpu"` runs the same step on the CPU: host-time measurements
    without a GPU (bench/gpu/train/markers_host.py), and CPU recordings of
    the GPU runs' steps (bench/gpu/train/cpu_fidelity.py)."""
    torch.manual_seed(seed)
    if spec_.kind == "gpt2vp":
        return InterleavedTrainer(torch, spec_, micro_batch, seed, device)
    return Trainer(torch, spec_, _hf_model(torch, spec_, device), micro_batch,
                   seed, device)


def dynamic_modules(spec_):
    """loom.watch(model, dynamic=...) patterns: the MoE experts."""
    if spec_.kind == "mixtral":
        return ["*.experts", "*.experts.*"]
    return None
