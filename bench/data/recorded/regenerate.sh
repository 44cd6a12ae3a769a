#!/usr/bin/env bash
# Regenerates the traces of bench/data/recorded/ with `./loom record-cpu`
# (README.md says what each one is). Run from anywhere; the traces are
# written with paths relative to the repository root, so each trace's
# provenance (its exact command) is the same wherever it is made.
#
#   bench/data/recorded/regenerate.sh               all traces, on the CPU
#   bench/data/recorded/regenerate.sh NAME...       only these (file names)
#   bench/data/recorded/regenerate.sh --device cuda --out DIR [NAME...]
#                 the same steps on a GPU, recorded by loom (record mode),
#                 into DIR: the references compare_gpu.py measures the CPU
#                 recordings against
#   bench/data/recorded/regenerate.sh --batch N [NAME...]
#                 the same steps at micro-batch N instead of 2, into
#                 batchN/ (same file names): the runs the plan-miss suite
#                 (bench/misses) serves with the plan of the batch-2 trace
#   bench/data/recorded/regenerate.sh --seq N [NAME...]
#                 the same steps at N tokens per sequence instead of 1024,
#                 into seqN/ (with --batch too: batchB_seqN/), for the same
#                 suite
#   --fake        (with any of the above) the dense models (llama_*) on
#                 FakeTensors with --no-cuda-workspaces: the trace --real
#                 gives, request for request (all six checked at seq 1024,
#                 2026-11-27; torch_plugin/tests/test_fake_record.py), in
#                 seconds instead of minutes; the MoE ones route with real
#                 data (--real), even without --experts eager
#
# The recordings are deterministic: the same torch and transformers
# versions give the same files, byte for byte (the provenance names the
# versions). The models have realistic widths (--set: hidden 1024,
# vocabulary 32000; 2 x 1024 tokens per micro-batch), so all of them take
# about 15 minutes on two cores and up to 10 GiB of memory (the Mixtral
# ones); `./loom record-cpu` without --set and --seq makes tiny ones.
# They run the real arithmetic (--real: the corpus predates recording on
# FakeTensors, and the Mixtral ones route tokens with data-dependent
# shapes, which only a real step has).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
OUT=bench/data/recorded
DEVICE=cpu
BATCH=
SEQ=
FAKE=

# name | arguments of ./loom record-cpu
TRACES=(
  "llama_plain.ltb|--model llama --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000 --real"
  "llama_recompute.ltb|--model llama --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000 --recompute --real"
  "llama_1f1b_rank0.ltb|--model llama --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000,num_hidden_layers=8 --schedule 1f1b --stages 4 --microbatches 8 --real"
  "llama_1f1b_rank3.ltb|--model llama --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000,num_hidden_layers=8 --schedule 1f1b --stages 4 --microbatches 8 --rank 3 --real"
  "llama_interleaved.ltb|--model llama --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000,num_hidden_layers=8 --schedule interleaved:2 --stages 2 --microbatches 4 --real"
  "llama_interleaved_recompute.ltb|--model llama --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000,num_hidden_layers=8 --schedule interleaved:2 --stages 2 --microbatches 4 --recompute --real"
  "mixtral_plain.ltb|--model mixtral --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000 --experts eager --real"
  "mixtral_recompute.ltb|--model mixtral --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,num_attention_heads=16,num_key_value_heads=4,head_dim=64,vocab_size=32000 --experts eager --recompute --real"
  "qwen3_moe_plain.ltb|--model qwen3_moe --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,moe_intermediate_size=768,num_attention_heads=16,num_key_value_heads=4,vocab_size=32000 --real"
  "qwen3_moe_interleaved.ltb|--model qwen3_moe --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,moe_intermediate_size=768,num_attention_heads=16,num_key_value_heads=4,vocab_size=32000,num_hidden_layers=8 --experts eager --schedule interleaved:2 --stages 2 --microbatches 4 --real"
  "deepseek_v3_plain.ltb|--model deepseek_v3 --dtype bf16 --steps 6 --batch 2 --seq 1024 --set hidden_size=1024,intermediate_size=2816,moe_intermediate_size=768,num_attention_heads=16,num_key_value_heads=16,q_lora_rank=512,kv_lora_rank=512,qk_rope_head_dim=64,qk_nope_head_dim=128,v_head_dim=128,vocab_size=32000 --experts eager --real"
)

names=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --seq) SEQ="$2"; shift 2 ;;
    --fake) FAKE=1; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
if [[ -n "$BATCH" ]]; then
  [[ "$BATCH" =~ ^[1-9][0-9]*$ ]] || { echo "--batch: a positive integer, not '$BATCH'" >&2; exit 2; }
fi
if [[ -n "$SEQ" ]]; then
  [[ "$SEQ" =~ ^[1-9][0-9]*$ ]] || { echo "--seq: a positive integer, not '$SEQ'" >&2; exit 2; }
fi
if [[ -n "$BATCH" && -n "$SEQ" ]]; then
  OUT="$OUT/batch${BATCH}_seq$SEQ"
elif [[ -n "$BATCH" ]]; then
  OUT="$OUT/batch$BATCH"
elif [[ -n "$SEQ" ]]; then
  OUT="$OUT/seq$SEQ"
fi
mkdir -p "$OUT"

for entry in "${TRACES[@]}"; do
  name="${entry%%|*}"
  args="${entry#*|}"
  if [[ ${#names[@]} -gt 0 && " ${names[*]} " != *" $name "* ]]; then
    continue
  fi
  if [[ -n "$BATCH" ]]; then args="${args/--batch 2 /--batch $BATCH }"; fi
  if [[ -n "$SEQ" ]]; then args="${args/--seq 1024 /--seq $SEQ }"; fi
  if [[ -n "$FAKE" && "$args" == "--model llama "* ]]; then
    args="${args/ --real/ --no-cuda-workspaces}"
  fi
  extra=()
  if [[ "$DEVICE" != cpu ]]; then extra=(--device "$DEVICE"); fi
  # shellcheck disable=SC2086
  ./loom record-cpu $args "${extra[@]}" -o "$OUT/$name"
done
