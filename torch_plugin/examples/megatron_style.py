"""loom with a Megatron-style training loop.

Megatron-LM's loop is `for iteration: train_step(forward_step_func, ...)`,
where train_step runs `forward_backward_func` (a schedule over
micro-batches: no pipelining, 1F1B, or interleaved virtual pipeline) and
then `optimizer.step()`. loom needs two things there:

  1. `forward_step_func = loom.megatron_forward_step(forward_step_func)`:
     each micro-batch marks "forward", and the gradient of its output marks
     "backward" (works for any schedule order);
  2. `loom.step()` right after each `train_step(...)` call in `train()`
     (megatron/training/training.py), or `loom.watch(optimizer)` (Megatron's
     optimizers have no step hooks; watch wraps their `step`).

MoE layers (Megatron's experts): `loom.watch(model, dynamic=["*.experts.*"],
iterations=False)` marks their windows. This script imitates that structure
in plain PyTorch (no Megatron needed) with a 1F1B-like order over 4
micro-batches.

    python3 megatron_style.py [--mode auto|record|plan]
"""

import argparse

import loom

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="auto",
                    choices=("record", "plan", "auto"))
parser.add_argument("--workdir", default=".loom")
parser.add_argument("--iterations", type=int, default=30)
args = parser.parse_args()

loom.enable(mode=args.mode, workdir=args.workdir)

import torch  # noqa: E402
from torch import nn  # noqa: E402

MICRO_BATCHES, WIDTH = 4, 1024
model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                      nn.Linear(4 * WIDTH, WIDTH))
                        for _ in range(8)]).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)


def forward_step(data_iterator, model):
    """Megatron's contract: returns (output_tensor, loss_func)."""
    batch = next(data_iterator)
    output = model(batch)

    def loss_func(output_tensor):
        return output_tensor.float().pow(2).mean()

    return output, loss_func


def forward_backward(forward_step_func, data_iterator, model):
    """A schedule in the style of Megatron's: forwards of two micro-batches
    in flight, then alternate backward/forward, then drain."""
    in_flight, losses = [], []
    for _ in range(MICRO_BATCHES):
        output, loss_func = forward_step_func(data_iterator, model)
        in_flight.append(loss_func(output) / MICRO_BATCHES)
        if len(in_flight) == 2:
            loss = in_flight.pop(0)
            loss.backward()
            losses.append(loss.item())
    for loss in in_flight:
        loss.backward()
        losses.append(loss.item())
    return sum(losses)


def train_step(forward_step_func, data_iterator, model, optimizer):
    loss = forward_backward(forward_step_func, data_iterator, model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


wrapped_forward_step = loom.megatron_forward_step(forward_step)
for iteration in range(args.iterations):
    data = iter([torch.randn(32, 128, WIDTH, device="cuda")
                 for _ in range(MICRO_BATCHES)])
    loss = train_step(wrapped_forward_step, data, model, optimizer)
    loom.step()                       # one call per iteration, after train_step
    if iteration % 10 == 0:
        state = loom.status()["state"]
        print(f"iteration {iteration}: loss {loss:.4f}, loom {state}")

loom.finish()
print(loom.memory_summary())
