"""loom with the Hugging Face Trainer.

    python3 hf_trainer.py [--mode auto|record|plan]

Needs `transformers` (and torch). Two lines of loom: enable() before the
model is created (Trainer moves it to the GPU), and the callback, which
marks an iteration per optimizer step (evaluation, logging and checkpoints
stay outside iterations), phases from the model's hooks, and writes the
trace at the end of training in record mode.
"""

import argparse

import loom

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="auto",
                    choices=("record", "plan", "auto"))
parser.add_argument("--workdir", default=".loom")
args = parser.parse_args()

loom.enable(mode=args.mode, workdir=args.workdir)   # before any CUDA use

import torch  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer,  # noqa: E402
                          TrainingArguments)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab):
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(vocab, (n, seq), generator=generator)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


config = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8192,
                    n_positions=512)
model = GPT2LMHeadModel(config)
trainer = Trainer(
    model=model,
    args=TrainingArguments(output_dir=f"{args.workdir}/hf", max_steps=60,
                           per_device_train_batch_size=8,
                           gradient_accumulation_steps=2, logging_steps=10,
                           report_to=[], save_strategy="no"),
    train_dataset=RandomTokens(2000, 512, config.vocab_size),
    # For an MoE model name the experts:
    # loom.hf_callback(dynamic=["*.experts.*"])
    callbacks=[loom.hf_callback()],
)
trainer.train()
print(loom.memory_summary())
print(loom.status())
