"""loom in a plain PyTorch training loop (a small GPT-style model, optionally
with MoE layers whose per-expert token counts change every step).

    python3 plain_loop.py                # auto: record 3 steps, plan, go on
    python3 plain_loop.py --mode record        # 1. profile a few steps
    python3 -m loom plan .loom/trace.rank0.ltb -o .loom/plan.rank0.lplan  # 2.
    python3 plain_loop.py --mode plan          # 3. run on the plan
    python3 plain_loop.py --moe                # MoE experts marked dynamic

Run with PYTHONPATH=<repo>/torch_plugin (or the package installed).
"""

import argparse

import loom

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="auto",
                    choices=("record", "plan", "auto"))
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--moe", action="store_true")
parser.add_argument("--workdir", default=".loom")
args = parser.parse_args()

# First thing: before anything touches CUDA.
loom.enable(mode=args.mode, workdir=args.workdir)

import torch  # noqa: E402  (after loom.enable on purpose)
from torch import nn  # noqa: E402

WIDTH, VOCAB, SEQ = 512, 1024, 256


class MoE(nn.Module):
    def __init__(self, experts=8, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(WIDTH, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                          nn.Linear(2 * WIDTH, WIDTH)) for _ in range(experts))

    def forward(self, x):
        tokens = x.reshape(-1, WIDTH)
        weight, index = torch.topk(torch.softmax(self.router(tokens), -1),
                                   self.k, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(index == e, as_tuple=True)
            if rows.numel():
                y = expert(tokens[rows]) * weight[rows, slot, None]
                out = out.index_add(0, rows, y)
        return out.reshape(x.shape)


class Block(nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 8, batch_first=True)
        self.mlp = MoE() if moe else nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool,
                                     device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


model = nn.Sequential(nn.Embedding(VOCAB, WIDTH),
                      *[Block(args.moe) for _ in range(6)],
                      nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

# Iterations end at optimizer.step(); phases and MoE windows from the model.
loom.watch(optimizer)
loom.watch(model, dynamic=[r"re:mlp\.experts\.\d+$"] if args.moe else None)

for step in range(args.steps):
    batch = torch.randint(VOCAB, (16, SEQ + 1), device="cuda")
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                       batch[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()                  # loom.step() happens here (watch)
    optimizer.zero_grad(set_to_none=True)
    if step % 10 == 0:
        status = loom.status()
        print(f"step {step}: loss {loss.item():.3f}, loom {status['state']}, "
              f"hit rate {status['hit_rate']}")

loom.finish()                         # record mode: writes the trace
print(loom.memory_summary())
print(loom.status()["files"])
