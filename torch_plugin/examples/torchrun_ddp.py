"""loom with torchrun and DistributedDataParallel.

    torchrun --nproc_per_node=4 torchrun_ddp.py [--mode auto|record|plan]

Each rank uses the GPU of its LOCAL_RANK and its own files in the work
directory (trace.rank{RANK}.ltb, plan.rank{RANK}.lplan). With
reuse_plan_from=0 the other ranks wait for rank 0's plan and use it when
their recorded request sequence is identical to rank 0's (checked by
fingerprint, see docs/plugin.md); otherwise they plan their own. loom sets
the CUDA device, so do not call torch.cuda.set_device before enable().
"""

import argparse
import os

import loom

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="auto",
                    choices=("record", "plan", "auto"))
parser.add_argument("--workdir", default=".loom")
args = parser.parse_args()

options = {"reuse_plan_from": 0} if args.mode == "auto" else {}
loom.enable(mode=args.mode, workdir=args.workdir, **options)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(),
                      nn.Linear(8192, 2048)).cuda()
model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loom.watch(optimizer)
loom.watch(model.module)

for step in range(40):
    x = torch.randn(64, 2048, device="cuda")
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

loom.finish()
status = loom.status()
print(f"rank {status['rank']} on cuda:{status['device']}: {status['state']}, "
      f"plan from {status['plan_source']}, hit rate {status['hit_rate']}")
dist.destroy_process_group()
