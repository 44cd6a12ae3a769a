#include "whatif/workloads/transformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "base/check.h"
#include "whatif/workloads/rng.h"

namespace loom::whatif {
namespace {

// Routing keys of evaluation batches start here (training iterations use
// their index, below 1000), so their routing draws are their own.
constexpr uint64_t kEvalRoutingKey = uint64_t{1} << 30;

// Tokens each of the config's experts receives when `tokens` tokens are
// routed in (key, layer); key = the training iteration, or kEvalRoutingKey
// + the evaluation batch.
std::vector<uint64_t> RouteTokens(const TransformerConfig& c, uint64_t key,
                                  int layer, uint64_t tokens) {
  LOOM_CHECK(c.experts > 0 && c.top_k >= 1 && c.top_k <= c.experts);
  Rng rng(c.seed * 0x100000001b3ULL ^
          (key << 32 | static_cast<uint64_t>(layer)));
  const int experts = c.experts;
  std::vector<double> popularity(experts);
  for (double& p : popularity) p = c.routing_skew * rng.Normal();
  std::vector<uint64_t> counts(experts, 0);
  std::vector<double> score(experts);
  std::vector<int> order(experts);
  for (uint64_t t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) score[e] = popularity[e] + rng.Gumbel();
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + c.top_k, order.end(), [&](int a, int b) {
          return score[a] != score[b] ? score[a] > score[b] : a < b;
        });
    for (int i = 0; i < c.top_k; ++i) ++counts[order[i]];
  }
  return counts;
}

std::string SeqLenOrderName(SeqLenOrder order) {
  switch (order) {
    case SeqLenOrder::kCycle:
      return "cycle";
    case SeqLenOrder::kShuffle:
      return "shuffle";
    case SeqLenOrder::kRandom:
      return "random";
  }
  return "?";
}

struct Param {
  uint64_t numel = 0;
  uint64_t grad = 0;  // live gradient id, 0 = none
  bool has_state = false;
};

struct LayerParams {
  int ln1 = 0, qkv = 0, proj = 0, ln2 = 0;
  int gate_up = 0, down = 0, router = 0;  // dense MLP / MoE router
  std::vector<int> expert_gate_up, expert_down;
};

// Tensors a layer's forward pass keeps for its backward pass.
struct LayerSaved {
  uint64_t x_in = 0, ln1 = 0, qkv = 0, attn = 0, lse = 0, r1 = 0, ln2 = 0;
  uint64_t fc1 = 0, act = 0;                              // dense
  uint64_t logits = 0, probs = 0, idx = 0, permuted = 0;  // MoE
  std::vector<uint64_t> tokens, expert_fc1, expert_act, expert_out;
  uint64_t x_out = 0;
};

class Generator {
 public:
  explicit Generator(const TransformerConfig& c) : c_(c) {
    SetSeqLen(c.seq_len);
  }

  plan::Trace Run() {
    trace_.header.device = 0;
    trace_.header.provenance = Provenance();
    Setup();
    int eval_step = 0;
    for (int it = 0; it < c_.iterations; ++it) {
      Iteration(it);
      if (EvalAfter(c_, it)) EvalStep(eval_step++);
    }
    return std::move(trace_);
  }

 private:
  // Unchanged for the workloads that predate seq_lens, capacities and
  // evaluation steps (their traces are fingerprinted).
  std::string Provenance() const {
    std::string tokens =
        fmt::format("{} tokens/iteration", c_.seq_len * c_.micro_batch);
    if (!c_.seq_lens.empty()) {
      std::string lens;
      for (uint64_t len : c_.seq_lens) {
        lens += (lens.empty() ? "" : ":") + std::to_string(len);
      }
      tokens = fmt::format("seq_lens {} ({}) x {} sequences/iteration", lens,
                           SeqLenOrderName(c_.seq_len_order), c_.micro_batch);
    }
    std::string mixer =
        c_.experts > 0 ? fmt::format("{} experts top-{}", c_.experts, c_.top_k)
                       : std::string("dense MLP");
    if (c_.capacity_factor > 0) {
      mixer += fmt::format(" capacity factor {}", c_.capacity_factor);
    }
    std::string eval;
    if (c_.eval_every > 0) {
      eval = fmt::format(", {} eval batches after every {} iterations",
                         c_.eval_batches, c_.eval_every);
    }
    return fmt::format(
        "loom builtin workload {}: {} layers, {} iterations, hidden {}, {}, "
        "{}{}, seed {}",
        c_.name, c_.layers, c_.iterations, c_.hidden, tokens, mixer, eval,
        c_.seed);
  }

  void SetSeqLen(uint64_t seq_len) {
    seq_len_ = seq_len;
    tokens_ = seq_len * c_.micro_batch;
  }
  uint64_t Th() const { return tokens_ * c_.hidden * c_.dtype_bytes; }
  bool Moe() const { return c_.experts > 0; }
  bool Capped() const { return Moe() && c_.capacity_factor > 0; }
  // Sizes change between iterations only with dropless routing.
  bool DynamicMixer() const { return Moe() && !Capped(); }
  // Rows of the dispatch (permuted) buffer and its gradient.
  uint64_t DispatchRows() const {
    if (Capped()) return c_.experts * ExpertCapacity(c_, tokens_);
    return tokens_ * c_.top_k;
  }
  // Rows of each expert's buffers in (key, layer) of the current pass.
  std::vector<uint64_t> ExpertRows(uint64_t key, int layer) const {
    if (Capped()) {
      return std::vector<uint64_t>(c_.experts, ExpertCapacity(c_, tokens_));
    }
    return RouteTokens(c_, key, layer, tokens_);
  }

  uint64_t A(uint64_t bytes, uint64_t stream = 0) {
    LOOM_CHECK(bytes > 0);
    uint64_t id = next_id_++;
    trace_.AddAlloc(id, bytes, stream);
    return id;
  }
  void F(uint64_t id, uint64_t stream = 0) { trace_.AddFree(id, stream); }
  uint64_t CommStream() const { return c_.comm_stream ? 1 : 0; }

  int AddParam(uint64_t numel) {
    params_.push_back({numel, 0, false});
    A(numel * c_.dtype_bytes);  // the weight, never freed
    return static_cast<int>(params_.size()) - 1;
  }
  void Grad(int p) {
    if (params_[p].grad == 0)
      params_[p].grad = A(params_[p].numel * c_.dtype_bytes);
  }

  void Setup() {
    const uint64_t h = c_.hidden;
    embedding_ = AddParam(c_.vocab * h);
    for (int l = 0; l < c_.layers; ++l) {
      LayerParams lp;
      lp.ln1 = AddParam(h);
      lp.qkv = AddParam(3 * h * h);
      lp.proj = AddParam(h * h);
      lp.ln2 = AddParam(h);
      if (c_.experts > 0) {
        lp.router = AddParam(c_.experts * h);
        for (int e = 0; e < c_.experts; ++e) {
          lp.expert_gate_up.push_back(AddParam(2 * c_.expert_ffn_hidden * h));
          lp.expert_down.push_back(AddParam(c_.expert_ffn_hidden * h));
        }
      } else {
        lp.gate_up = AddParam(2 * c_.ffn_hidden * h);
        lp.down = AddParam(c_.ffn_hidden * h);
      }
      layers_.push_back(std::move(lp));
    }
    final_norm_ = AddParam(h);
    lm_head_ = AddParam(c_.vocab * h);
  }

  std::string LayerModule(int l, bool mixer) const {
    if (!mixer) return fmt::format("layers.{}.attention", l);
    return fmt::format("layers.{}.{}", l, c_.experts > 0 ? "moe" : "mlp");
  }

  void Iteration(int it) {
    SetSeqLen(SeqLenAt(c_, it));
    trace_.AddIterationBegin(it);
    trace_.AddPhase(plan::kPhaseForward);
    uint64_t ids = A(tokens_ * 8);
    uint64_t labels = A(tokens_ * 8);
    trace_.AddModuleEnter("embedding");
    uint64_t x = A(Th());
    trace_.AddModuleExit("embedding");
    std::vector<LayerSaved> saved(c_.layers);
    for (int l = 0; l < c_.layers; ++l) {
      saved[l] = Forward(it, l, x);
      x = saved[l].x_out;
    }
    const uint64_t logits_elems = tokens_ * c_.vocab;
    trace_.AddModuleEnter("lm_head");
    uint64_t final_ln = A(Th());
    uint64_t logits = A(logits_elems * c_.dtype_bytes);
    uint64_t logits32 = A(logits_elems * 4);  // .float() for the loss
    uint64_t log_probs = A(logits_elems * 4);
    F(logits32);
    uint64_t loss = A(4);
    trace_.AddModuleExit("lm_head");

    trace_.AddPhase(plan::kPhaseBackward);
    trace_.AddModuleEnter("lm_head");
    uint64_t grad_loss = A(4);
    uint64_t grad_log_probs = A(logits_elems * 4);
    F(grad_loss);
    F(loss);
    F(labels);
    uint64_t grad_logits = A(logits_elems * c_.dtype_bytes);
    F(grad_log_probs);
    F(log_probs);
    Grad(lm_head_);
    uint64_t grad_final = A(Th());
    F(grad_logits);
    F(logits);
    Grad(final_norm_);
    uint64_t g = A(Th());
    F(grad_final);
    F(final_ln);
    F(x);  // the last layer's output, saved by the final norm
    trace_.AddModuleExit("lm_head");
    for (int l = c_.layers - 1; l >= 0; --l) g = Backward(l, saved[l], g);
    trace_.AddModuleEnter("embedding");
    Grad(embedding_);
    F(g);
    F(ids);
    trace_.AddModuleExit("embedding");

    trace_.AddPhase(plan::kPhaseOptimizer);
    for (Param& p : params_) {
      uint64_t shard =
          (p.numel * 4 + c_.optimizer_shard - 1) / c_.optimizer_shard;
      if (!p.has_state) {  // fp32 master weights and the two Adam moments
        A(shard);
        A(shard);
        A(shard);
        p.has_state = true;
      }
      F(A(shard));  // a temporary of the fused update
    }
    for (Param& p : params_) {  // zero_grad(set_to_none=True)
      if (p.grad != 0) F(p.grad);
      p.grad = 0;
    }
    trace_.AddIterationEnd(it);
  }

  LayerSaved Forward(int it, int l, uint64_t x) {
    const uint64_t h = c_.hidden;
    LayerSaved s;
    s.x_in = x;
    trace_.AddModuleEnter(LayerModule(l, false));
    s.ln1 = A(Th());
    s.qkv = A(3 * Th());
    s.attn = A(Th());
    s.lse = A(c_.micro_batch * c_.heads * seq_len_ * 4);
    uint64_t proj = A(Th());
    s.r1 = A(Th());
    F(proj);
    trace_.AddModuleExit(LayerModule(l, false));
    trace_.AddModuleEnter(LayerModule(l, true), DynamicMixer());
    s.ln2 = A(Th());
    if (Moe()) {
      s.logits = A(tokens_ * c_.experts * 4);
      s.probs = A(tokens_ * c_.top_k * 4);
      s.idx = A(tokens_ * c_.top_k * 8);
      s.permuted = A(DispatchRows() * h * c_.dtype_bytes, CommStream());
      s.tokens = ExpertRows(static_cast<uint64_t>(it), l);
      s.expert_fc1.assign(c_.experts, 0);
      s.expert_act.assign(c_.experts, 0);
      s.expert_out.assign(c_.experts, 0);
      for (int e = 0; e < c_.experts; ++e) {
        uint64_t n = s.tokens[e];
        if (n == 0) continue;
        s.expert_fc1[e] = A(n * 2 * c_.expert_ffn_hidden * c_.dtype_bytes);
        s.expert_act[e] = A(n * c_.expert_ffn_hidden * c_.dtype_bytes);
        s.expert_out[e] = A(n * h * c_.dtype_bytes);
      }
      uint64_t combined = A(Th(), CommStream());
      s.x_out = A(Th());
      F(combined, CommStream());
    } else {
      s.fc1 = A(tokens_ * 2 * c_.ffn_hidden * c_.dtype_bytes);
      s.act = A(tokens_ * c_.ffn_hidden * c_.dtype_bytes);
      uint64_t fc2 = A(Th());
      s.x_out = A(Th());
      F(fc2);
    }
    trace_.AddModuleExit(LayerModule(l, true));
    return s;
  }

  uint64_t Backward(int l, const LayerSaved& s, uint64_t g) {
    const uint64_t h = c_.hidden;
    const LayerParams& lp = layers_[l];
    trace_.AddModuleEnter(LayerModule(l, true), DynamicMixer());
    uint64_t grad_ln2 = 0;
    if (Moe()) {
      std::vector<uint64_t> grad_in;
      for (int e = c_.experts - 1; e >= 0; --e) {
        uint64_t n = s.tokens[e];
        if (n == 0) continue;
        uint64_t grad_out = A(n * h * c_.dtype_bytes);
        uint64_t grad_act = A(n * c_.expert_ffn_hidden * c_.dtype_bytes);
        Grad(lp.expert_down[e]);
        F(grad_out);
        F(s.expert_out[e]);
        uint64_t grad_fc1 = A(n * 2 * c_.expert_ffn_hidden * c_.dtype_bytes);
        F(s.expert_act[e]);
        F(grad_act);
        Grad(lp.expert_gate_up[e]);
        grad_in.push_back(A(n * h * c_.dtype_bytes));
        F(s.expert_fc1[e]);
        F(grad_fc1);
      }
      uint64_t grad_permuted =
          A(DispatchRows() * h * c_.dtype_bytes, CommStream());
      for (uint64_t id : grad_in) F(id);
      F(s.permuted, CommStream());
      uint64_t grad_logits = A(tokens_ * c_.experts * 4);
      F(s.probs);
      F(s.idx);
      Grad(lp.router);
      F(s.logits);
      grad_ln2 = A(Th());
      F(grad_permuted, CommStream());
      F(grad_logits);
    } else {
      uint64_t grad_act = A(tokens_ * c_.ffn_hidden * c_.dtype_bytes);
      Grad(lp.down);
      uint64_t grad_fc1 = A(tokens_ * 2 * c_.ffn_hidden * c_.dtype_bytes);
      F(s.act);
      F(grad_act);
      Grad(lp.gate_up);
      grad_ln2 = A(Th());
      F(s.fc1);
      F(grad_fc1);
    }
    Grad(lp.ln2);
    uint64_t grad_r1 = A(Th());  // LN backward plus the residual branch
    F(grad_ln2);
    F(s.ln2);
    F(s.r1);
    F(g);
    trace_.AddModuleExit(LayerModule(l, true));

    trace_.AddModuleEnter(LayerModule(l, false));
    uint64_t grad_attn = A(Th());
    Grad(lp.proj);
    uint64_t grad_qkv = A(3 * Th());
    F(s.attn);
    F(s.lse);
    F(grad_attn);
    Grad(lp.qkv);
    uint64_t grad_ln1 = A(Th());
    F(s.qkv);
    F(grad_qkv);
    Grad(lp.ln1);
    uint64_t grad_x = A(Th());
    F(grad_ln1);
    F(s.ln1);
    F(s.x_in);
    F(grad_r1);
    trace_.AddModuleExit(LayerModule(l, false));
    return grad_x;
  }

  // An evaluation step between training iterations (see transformer.h):
  // forward passes under no_grad, nothing kept across layers.
  void EvalStep(int step) {
    trace_.AddPhase(plan::kPhaseEval);
    SetSeqLen(MaxSeqLen(c_));
    std::vector<uint64_t> losses;
    for (int b = 0; b < c_.eval_batches; ++b) {
      const uint64_t key =
          kEvalRoutingKey + static_cast<uint64_t>(step) * c_.eval_batches + b;
      uint64_t ids = A(tokens_ * 8);
      uint64_t labels = A(tokens_ * 8);
      trace_.AddModuleEnter("embedding");
      uint64_t x = A(Th());
      trace_.AddModuleExit("embedding");
      for (int l = 0; l < c_.layers; ++l) x = EvalLayer(key, l, x);
      const uint64_t logits_elems = tokens_ * c_.vocab;
      trace_.AddModuleEnter("lm_head");
      uint64_t final_ln = A(Th());
      F(x);
      uint64_t logits = A(logits_elems * c_.dtype_bytes);
      F(final_ln);
      uint64_t logits32 = A(logits_elems * 4);  // .float() for the loss
      uint64_t log_probs = A(logits_elems * 4);
      F(logits32);
      losses.push_back(A(4));
      F(log_probs);
      trace_.AddModuleExit("lm_head");
      F(logits);  // dropped with the outputs (only the loss is kept)
      F(labels);
      F(ids);
    }
    for (uint64_t loss : losses) F(loss);  // gathered to the host
  }

  // One layer's forward under no_grad: every input freed once consumed.
  uint64_t EvalLayer(uint64_t key, int l, uint64_t x) {
    const uint64_t h = c_.hidden;
    trace_.AddModuleEnter(LayerModule(l, false));
    uint64_t ln1 = A(Th());
    uint64_t qkv = A(3 * Th());
    F(ln1);
    uint64_t attn = A(Th());
    uint64_t lse = A(c_.micro_batch * c_.heads * seq_len_ * 4);
    F(lse);  // returned by the attention kernel, unused without autograd
    F(qkv);
    uint64_t proj = A(Th());
    F(attn);
    uint64_t r1 = A(Th());
    F(proj);
    F(x);
    trace_.AddModuleExit(LayerModule(l, false));
    trace_.AddModuleEnter(LayerModule(l, true), DynamicMixer());
    uint64_t ln2 = A(Th());
    uint64_t x_out = 0;
    if (Moe()) {
      uint64_t logits = A(tokens_ * c_.experts * 4);
      uint64_t probs = A(tokens_ * c_.top_k * 4);
      uint64_t idx = A(tokens_ * c_.top_k * 8);
      F(logits);
      uint64_t permuted = A(DispatchRows() * h * c_.dtype_bytes, CommStream());
      F(ln2);
      std::vector<uint64_t> outs;
      for (uint64_t n : ExpertRows(key, l)) {
        if (n == 0) continue;
        uint64_t fc1 = A(n * 2 * c_.expert_ffn_hidden * c_.dtype_bytes);
        uint64_t act = A(n * c_.expert_ffn_hidden * c_.dtype_bytes);
        F(fc1);
        outs.push_back(A(n * h * c_.dtype_bytes));
        F(act);
      }
      uint64_t combined = A(Th(), CommStream());
      for (uint64_t id : outs) F(id);
      F(permuted, CommStream());
      F(probs);
      F(idx);
      x_out = A(Th());
      F(combined, CommStream());
    } else {
      uint64_t fc1 = A(tokens_ * 2 * c_.ffn_hidden * c_.dtype_bytes);
      F(ln2);
      uint64_t act = A(tokens_ * c_.ffn_hidden * c_.dtype_bytes);
      F(fc1);
      uint64_t fc2 = A(Th());
      F(act);
      x_out = A(Th());
      F(fc2);
    }
    F(r1);
    trace_.AddModuleExit(LayerModule(l, true));
    return x_out;
  }

  const TransformerConfig& c_;
  uint64_t seq_len_ = 0;  // of the current pass
  uint64_t tokens_ = 0;   // seq_len_ * micro_batch
  plan::Trace trace_;
  uint64_t next_id_ = 1;
  std::vector<Param> params_;
  std::vector<LayerParams> layers_;
  int embedding_ = 0, final_norm_ = 0, lm_head_ = 0;
};

}  // namespace

std::vector<uint64_t> ExpertTokenCounts(const TransformerConfig& c,
                                        int iteration, int layer) {
  LOOM_CHECK(iteration >= 0);
  return RouteTokens(c, static_cast<uint64_t>(iteration), layer,
                     SeqLenAt(c, iteration) * c.micro_batch);
}

StatusOr<plan::Trace> GenerateTransformerTrace(
    const TransformerConfig& config) {
  LOOM_RETURN_IF_ERROR(ValidateTransformerConfig(config));
  Generator generator(config);
  return generator.Run();
}

}  // namespace loom::whatif
