// The shape of a generated transformer training trace (transformer.h): the
// model, the batch, the training loop (iterations, evaluation steps) and,
// for mixtures of experts, the routing; the built-in shapes behind
// `builtin:<name>`; `key=value` options and their validation; and the
// schedules the generator follows (sequence length per iteration, expert
// capacity, where evaluation steps fall).
//
// Invariants: a config that passes ValidateTransformerConfig generates a
// valid trace of at most 10 million events whose tensors are each below
// 2^50 bytes; every schedule below is a pure function of the config (its
// `seed` included), identical on every platform.
#ifndef LOOM_WHATIF_WORKLOADS_TRANSFORMER_CONFIG_H_
#define LOOM_WHATIF_WORKLOADS_TRANSFORMER_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace loom::whatif {

// How iterations walk through `seq_lens`.
enum class SeqLenOrder : uint8_t {
  kCycle,    // seq_lens[i % n], in the order given
  kShuffle,  // each round of n iterations is a seeded permutation of
             // seq_lens (a bucketing sampler with shuffled buckets): every
             // length appears once per round
  kRandom,   // drawn independently per iteration from the seed
};

struct TransformerConfig {
  std::string name = "dense";
  int layers = 8;
  int iterations = 4;
  uint64_t hidden = 2048;
  uint64_t heads = 16;
  uint64_t seq_len = 4096;
  // Variable sequence length without packing: when not empty, iteration i's
  // batch is padded to seq_lens[schedule(i)] tokens per sequence instead of
  // seq_len (every tensor sized by the tokens follows it).
  std::vector<uint64_t> seq_lens;
  SeqLenOrder seq_len_order = SeqLenOrder::kShuffle;
  uint64_t micro_batch = 2;
  uint64_t vocab = 32000;
  uint64_t ffn_hidden = 5632;  // dense SwiGLU intermediate size
  int experts = 0;             // 0: dense MLP layers
  int top_k = 2;
  uint64_t expert_ffn_hidden = 2816;
  double routing_skew = 1.0;
  // 0: dropless (each expert's buffers sized by the tokens routed to it,
  // changing every iteration). > 0: every expert's buffers are padded to its
  // capacity ExpertCapacity() (tokens beyond it dropped), the same every
  // iteration; the MoE modules are then not flagged dynamic.
  double capacity_factor = 0.0;
  uint64_t dtype_bytes = 2;      // activations and weights (bf16)
  uint64_t optimizer_shard = 8;  // ZeRO-1: optimizer state per rank
  bool comm_stream = false;      // MoE dispatch/combine buffers on stream 1
  // Evaluation inside training: after every `eval_every`-th iteration
  // (0: never), `eval_batches` forward passes under no_grad (transformer.h).
  int eval_every = 0;
  int eval_batches = 2;
  uint64_t seed = 1;
};

// The built-in shapes. moe: a 1.4B-parameter 8-expert top-2 dropless MoE;
// dense: a dense model of the same width (both 8 layers, 4 iterations,
// 8192 tokens per micro-batch). The others derive from them:
//  - moe_dropless: moe under its explicit name (same trace but the name);
//  - moe_capacity: moe with capacity_factor 1.25;
//  - varlen: dense, 8 iterations, seq_lens 1024:2048:4096 shuffled per
//    round of 3 (each length appears at least twice);
//  - eval: dense, 8 iterations, 2 evaluation batches after every 3rd.
TransformerConfig MoeConfig();
TransformerConfig DenseConfig();
TransformerConfig MoeDroplessConfig();
TransformerConfig MoeCapacityConfig();
TransformerConfig VarlenConfig();
TransformerConfig EvalConfig();

// Sets `key` from text. Keys: layers, iterations, hidden, heads, seq_len
// (one length for every iteration: clears seq_lens), seq_lens (lengths
// separated by ':', e.g. 1024:2048:4096), seq_len_order (cycle, shuffle,
// random), micro_batch, vocab, ffn_hidden, experts, top_k,
// expert_ffn_hidden, routing_skew, capacity_factor, optimizer_shard,
// comm_stream (0/1/true/false), eval_every, eval_batches, seed.
// INVALID_ARGUMENT names a bad key or value.
Status SetTransformerOption(TransformerConfig& config, std::string_view key,
                            std::string_view value);

// Checks the config: positive sizes, top_k <= experts, at most 64 sequence
// lengths, capacity_factor in [0, 100] and only with experts, eval_every in
// [0, 1000], eval_batches in [1, 100], every tensor size below 2^50 bytes,
// at most 10 million events.
Status ValidateTransformerConfig(const TransformerConfig& config);

// The sequence length of training iteration `iteration` (seq_len when
// seq_lens is empty). REQUIRES: a valid config, 0 <= iteration.
uint64_t SeqLenAt(const TransformerConfig& config, int iteration);

// The longest sequence length of any iteration; evaluation batches are
// padded to it.
uint64_t MaxSeqLen(const TransformerConfig& config);

// Tokens each expert keeps in a layer that routes `tokens` tokens:
// ceil(tokens * top_k / experts * capacity_factor), computed in double in
// that order (Megatron's formula); 0 when dropless or dense.
uint64_t ExpertCapacity(const TransformerConfig& config, uint64_t tokens);

// Whether an evaluation step follows training iteration `iteration`
// (0-based: after iterations eval_every - 1, 2 * eval_every - 1, ..., as a
// loop evaluating when global_step % eval_every == 0 does).
bool EvalAfter(const TransformerConfig& config, int iteration);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_TRANSFORMER_CONFIG_H_
