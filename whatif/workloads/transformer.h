// Generated training traces of a transformer-like model: the built-in
// workloads of `loom compare` / `replay` and the demo (builtin:moe,
// builtin:dense, ...; shapes and options in transformer_config.h).
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
//    flagged dynamic when their sizes change (dropless routing).
// Variable sequence length (seq_lens): each iteration's batch is padded to
// its own length (SeqLenAt), as a data loader without packing that pads to
// the longest sequence of the batch does; every tensor sized by the tokens
// (activations, logits, ids, expert buffers) follows it.
// MoE layers route each token to `top_k` distinct experts, sampled from a
// softmax over per-(iteration, layer) expert popularities drawn with
// standard deviation `routing_skew` (Gumbel top-k). Dropless
// (capacity_factor 0): each expert's buffers are sized by the tokens it
// received, so they change every iteration, and experts that receive no
// token allocate nothing. With a capacity factor every expert's buffers are
// padded to ExpertCapacity() rows (tokens beyond it dropped) and the
// dispatch buffers hold experts * capacity rows: the sizes are the same
// every iteration and for every expert, and the MoE modules are not
// flagged dynamic.
// Evaluation steps (eval_every > 0): after every eval_every-th training
// iteration, between its iteration end and the next iteration's begin (as
// the Hugging Face Trainer and Megatron evaluate between optimizer steps,
// and as loom's plugin records it: no iteration of its own), the phase
// marker "eval" and `eval_batches` forward passes under no_grad, each on a
// batch padded to MaxSeqLen: ids and labels, then every layer's
// intermediates freed as soon as the next op consumed them (nothing saved
// for a backward pass, no gradients, no optimizer), module markers as in
// training; each batch's loss stays until the end of the step (gathered to
// the host then), the logits go with the batch's outputs.
// Everything is determined by `seed` (own PRNG: identical on every
// platform).
//
// Invariant: the trace passes plan::ValidateTrace; every saved tensor is
// freed by the end of its iteration and every evaluation tensor by the end
// of its step; only parameters and optimizer state outlive an iteration.
#ifndef LOOM_WHATIF_WORKLOADS_TRANSFORMER_H_
#define LOOM_WHATIF_WORKLOADS_TRANSFORMER_H_

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "plan/trace/trace.h"
#include "whatif/workloads/transformer_config.h"

namespace loom::whatif {

// Generates the trace. Errors: ValidateTransformerConfig's.
StatusOr<plan::Trace> GenerateTransformerTrace(const TransformerConfig& config);

// Tokens routed to each expert in training (iteration, layer), before any
// capacity drops them: what the generated dropless trace uses. Exposed for
// tests. REQUIRES: a valid MoE config.
std::vector<uint64_t> ExpertTokenCounts(const TransformerConfig& config,
                                        int iteration, int layer);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_TRANSFORMER_H_
