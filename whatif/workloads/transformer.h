// Generated training traces of a transformer-like model: the built-in
// workloads of `loom compare` and the demo (builtin:moe, builtin:dense).
//
// The trace follows what PyTorch's allocator sees in a mixed-precision
// training loop (bf16 weights and activations, fp32 sharded optimizer
// state, zero_grad(set_to_none=True)):
//  - setup: every parameter, allocated once and never freed;
//  - per iteration: input ids and labels; the forward pass through
//    embedding, `layers` blocks (attention, then an MLP or a mixture of
//    experts), final norm, LM head and a fp32 cross-entropy, keeping what
//    autograd saves and freeing temporaries at once; the backward pass in
//    reverse order, freeing saved tensors as their gradients are made and
//    allocating each parameter gradient; the optimizer step (fp32 master
//    weights and Adam moments, 1/optimizer_shard of each parameter,
//    allocated lazily at the first step; one temporary per parameter), and
//    finally the gradients are freed.
//  - markers: iteration begin/end, phases forward/backward/optimizer, and
//    module enter/exit around every module in both passes; MoE modules are
//    flagged dynamic.
// MoE layers route each token to `top_k` distinct experts, sampled from a
// softmax over per-(iteration, layer) expert popularities drawn with
// standard deviation `routing_skew` (Gumbel top-k); each expert's buffers
// are sized by the tokens it received, so they change every iteration.
// Experts that receive no token allocate nothing. Everything is determined
// by `seed` (own PRNG: identical on every platform).
//
// Invariant: the trace passes plan::ValidateTrace; every saved tensor is
// freed by the end of its iteration; only parameters and optimizer state
// outlive an iteration.
#ifndef LOOM_WHATIF_WORKLOADS_TRANSFORMER_H_
#define LOOM_WHATIF_WORKLOADS_TRANSFORMER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/trace/trace.h"

namespace loom::whatif {

struct TransformerConfig {
  std::string name = "dense";
  int layers = 8;
  int iterations = 4;
  uint64_t hidden = 2048;
  uint64_t heads = 16;
  uint64_t seq_len = 4096;
  uint64_t micro_batch = 2;
  uint64_t vocab = 32000;
  uint64_t ffn_hidden = 5632;  // dense SwiGLU intermediate size
  int experts = 0;             // 0: dense MLP layers
  int top_k = 2;
  uint64_t expert_ffn_hidden = 2816;
  double routing_skew = 1.0;
  uint64_t dtype_bytes = 2;      // activations and weights (bf16)
  uint64_t optimizer_shard = 8;  // ZeRO-1: optimizer state per rank
  bool comm_stream = false;      // MoE dispatch/combine buffers on stream 1
  uint64_t seed = 1;
};

// The two built-in shapes: a 1.4B-parameter 8-expert top-2 MoE and a dense
// model of the same width (both 8 layers, 8192 tokens per micro-batch).
TransformerConfig MoeConfig();
TransformerConfig DenseConfig();

// Sets `key` (layers, iterations, hidden, heads, seq_len, micro_batch,
// vocab, ffn_hidden, experts, top_k, expert_ffn_hidden, routing_skew,
// optimizer_shard, comm_stream, seed) from text; INVALID_ARGUMENT names a
// bad key or value.
Status SetTransformerOption(TransformerConfig& config, std::string_view key,
                            std::string_view value);

// Checks the config (positive sizes, top_k <= experts, every tensor size
// below 2^50 bytes, at most 10 million events).
Status ValidateTransformerConfig(const TransformerConfig& config);

// Generates the trace. Errors: ValidateTransformerConfig's.
StatusOr<plan::Trace> GenerateTransformerTrace(const TransformerConfig& config);

// Tokens each expert receives in (iteration, layer): what the generated
// trace uses. Exposed for tests. REQUIRES: a valid MoE config.
std::vector<uint64_t> ExpertTokenCounts(const TransformerConfig& config,
                                        int iteration, int layer);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_TRANSFORMER_H_
