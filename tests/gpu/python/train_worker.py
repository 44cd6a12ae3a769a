"""One training run in a fresh process, for tests/gpu/python/test_training.py.

    python3 train_worker.py --model gpt|moe --mode torch|record|plan|auto \
        --steps N --workdir DIR --out result.json

Trains a small GPT-style model or an MoE model with top-k routing (pure
torch, random weights and data from fixed seeds, deterministic algorithms)
under PyTorch's own allocator (`torch`) or loom in the given mode, and
writes the losses (as float.hex, for exact comparison), loom's status and
stats, and checks of loom's stats against torch.cuda.mem_get_info() to
`--out`. loom must be enabled before CUDA is touched, so this is a script
run once per mode (the allocator can be swapped once per process).
"""

import argparse
import json
import math
import os
import sys
import time

MiB = 1 << 20


def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("gpt", "moe"), required=True)
    parser.add_argument("--mode", choices=("torch", "record", "plan", "auto"),
                        required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workdir", default=".loom")
    parser.add_argument("--out", required=True)
    parser.add_argument("--record-iterations", type=int, default=5)
    return parser.parse_args(argv)


def enable_loom(args):
    """Before anything touches CUDA."""
    import loom  # pylint: disable=import-outside-toplevel
    options = {}
    if args.mode == "auto":
        options = {"record_iterations": args.record_iterations,
                   "plan_options": {"time_limit": 5}}
    loom.enable(mode=args.mode, workdir=args.workdir, **options)
    return loom


def build_model(torch, kind):
    nn = torch.nn
    vocab, width, heads, layers, seq = 512, 256, 4, 4, 128

    class Block(nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.ln2 = nn.LayerNorm(width)
            self.mlp = mlp
            self.register_buffer(
                "mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

        def forward(self, x):
            h = self.ln1(x)
            n = x.shape[1]
            a, _ = self.attn(h, h, h, attn_mask=self.mask[:n, :n],
                             need_weights=False)
            x = x + a
            return x + self.mlp(self.ln2(x))

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(width, 2 * width)
            self.fc2 = nn.Linear(2 * width, width)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    class MoE(nn.Module):
        """Top-k routing: each token goes to k of E experts; the number of
        tokens per expert changes every step (dynamic allocations)."""

        def __init__(self, experts=8, k=2):
            super().__init__()
            self.k = k
            self.router = nn.Linear(width, experts)
            self.experts = nn.ModuleList(Expert() for _ in range(experts))

        def forward(self, x):
            shape = x.shape
            tokens = x.reshape(-1, shape[-1])
            weights = torch.softmax(self.router(tokens), dim=-1)
            top_w, top_i = torch.topk(weights, self.k, dim=-1)
            out = torch.zeros_like(tokens)
            for e, expert in enumerate(self.experts):
                rows, slot = torch.nonzero(top_i == e, as_tuple=True)
                if rows.numel() == 0:
                    continue
                y = expert(tokens.index_select(0, rows))
                y = y * top_w[rows, slot].unsqueeze(-1)
                out = out.index_add(0, rows, y)
            return out.reshape(shape)

    def mlp():
        if kind == "moe":
            return MoE()
        return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                             nn.Linear(4 * width, width))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.zeros(1, seq, width))
            self.layers = nn.ModuleList(Block(mlp()) for _ in range(layers))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos[:, :tokens.shape[1]]
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln(x))

    return GPT(), vocab, seq


def stats_checks(torch, loom):
    """loom's stats against the driver's view of device memory."""
    checks = {}
    stats = loom.memory_stats()
    free, total = torch.cuda.mem_get_info()
    used = total - free
    reserved = stats["reserved_bytes.all.current"]
    checks["reserved_within_used"] = reserved <= used
    checks["overhead_below_4GiB"] = used - reserved < (4 << 30)
    checks["allocated_within_reserved"] = \
        stats["allocated_bytes.all.current"] <= reserved
    checks["torch_memory_allocated_is_loom"] = (
        torch.cuda.memory_allocated() == stats["allocated_bytes.all.current"])
    # One more GiB: the physical memory loom takes is what the driver loses.
    free0, r0 = free, reserved
    extra = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    r1 = loom.memory_stats()["reserved_bytes.all.current"]
    checks["growth_matches_driver"] = \
        abs((r1 - r0) - (free0 - free1)) <= 64 * MiB
    checks["growth_detail"] = [r1 - r0, free0 - free1]
    del extra
    return checks, stats, [free, total]


def main(argv):
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    loom = enable_loom(args) if args.mode != "torch" else None
    import torch  # pylint: disable=import-outside-toplevel
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, vocab, seq = build_model(torch, args.model)
    generator = torch.Generator().manual_seed(4321)
    data = torch.randint(vocab, (args.steps, 8, seq + 1), generator=generator)
    model = model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    if loom is not None:
        dynamic = ([r"re:^layers\.\d+\.mlp\.experts\.\d+$"]
                   if args.model == "moe" else None)
        loom.watch(model, dynamic=dynamic)
        loom.watch(optimizer)
    losses, started = [], time.monotonic()
    for step in range(args.steps):
        batch = data[step].cuda(non_blocking=False)
        logits = model(batch[:, :-1])
        # Cross entropy from elementwise ops and reductions only (no
        # scatter/atomics), deterministic on every PyTorch version.
        logp = torch.log_softmax(logits.reshape(-1, vocab), dim=-1)
        target = torch.nn.functional.one_hot(batch[:, 1:].reshape(-1), vocab)
        loss = -(logp * target).sum(dim=-1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        if not math.isfinite(value):
            raise SystemExit(f"loss is {value} at step {step}")
        losses.append(value.hex())
        if loom is not None and args.mode == "auto" and step == args.steps // 2:
            # The planner runs in the background; make sure the switch has
            # happened by mid-run so the second half runs on the plan.
            loom.wait_for_plan(timeout=300)
    torch.cuda.synchronize()
    seconds = (time.monotonic() - started) / args.steps
    result = {"model": args.model, "mode": args.mode, "losses": losses,
              "seconds_per_step": seconds,
              "max_memory_allocated": None}
    if loom is not None:
        result["status"] = loom.status()
        checks, stats, mem = stats_checks(torch, loom)
        result.update(checks=checks, stats=stats, mem_get_info=mem)
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        loom.finish()
        result["status_after_finish"] = loom.status()
    else:
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
