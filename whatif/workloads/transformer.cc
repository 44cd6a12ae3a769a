#include "whatif/workloads/transformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "base/check.h"

namespace loom::whatif {
namespace {

constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 50;
constexpr uint64_t kMaxEvents = 10'000'000;

// splitmix64: a tiny PRNG with the same output everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1).
  double Uniform() { return ((Next() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {  // Box-Muller
    double u = Uniform();
    double v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  double Gumbel() { return -std::log(-std::log(Uniform())); }

 private:
  uint64_t state_;
};

// a * b, or 0 when it overflows or exceeds kMaxTensorBytes.
uint64_t CheckedProduct(std::initializer_list<uint64_t> factors) {
  unsigned __int128 product = 1;
  for (uint64_t f : factors) {
    product *= f;
    if (product > kMaxTensorBytes) return 0;
  }
  return static_cast<uint64_t>(product);
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
  explicit Generator(const TransformerConfig& c)
      : c_(c), tokens_(c.seq_len * c.micro_batch) {}

  plan::Trace Run() {
    trace_.header.device = 0;
    trace_.header.provenance = fmt::format(
        "loom builtin workload {}: {} layers, {} iterations, hidden {}, {} "
        "tokens/iteration, {}, seed {}",
        c_.name, c_.layers, c_.iterations, c_.hidden, tokens_,
        c_.experts > 0 ? fmt::format("{} experts top-{}", c_.experts, c_.top_k)
                       : std::string("dense MLP"),
        c_.seed);
    Setup();
    for (int it = 0; it < c_.iterations; ++it) Iteration(it);
    return std::move(trace_);
  }

 private:
  uint64_t Th() const { return tokens_ * c_.hidden * c_.dtype_bytes; }

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
    s.lse = A(c_.micro_batch * c_.heads * c_.seq_len * 4);
    uint64_t proj = A(Th());
    s.r1 = A(Th());
    F(proj);
    trace_.AddModuleExit(LayerModule(l, false));
    const bool moe = c_.experts > 0;
    trace_.AddModuleEnter(LayerModule(l, true), /*dynamic=*/moe);
    s.ln2 = A(Th());
    if (moe) {
      s.logits = A(tokens_ * c_.experts * 4);
      s.probs = A(tokens_ * c_.top_k * 4);
      s.idx = A(tokens_ * c_.top_k * 8);
      s.permuted = A(tokens_ * c_.top_k * h * c_.dtype_bytes, CommStream());
      s.tokens = ExpertTokenCounts(c_, it, l);
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
    const bool moe = c_.experts > 0;
    trace_.AddModuleEnter(LayerModule(l, true), /*dynamic=*/moe);
    uint64_t grad_ln2 = 0;
    if (moe) {
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
          A(tokens_ * c_.top_k * h * c_.dtype_bytes, CommStream());
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

  const TransformerConfig& c_;
  const uint64_t tokens_;
  plan::Trace trace_;
  uint64_t next_id_ = 1;
  std::vector<Param> params_;
  std::vector<LayerParams> layers_;
  int embedding_ = 0, final_norm_ = 0, lm_head_ = 0;
};

template <typename T>
Status ParseNumber(std::string_view key, std::string_view text, T* out) {
  T value{};
  auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError("workload option {}={}: not a number", key,
                                text);
  }
  *out = value;
  return OkStatus();
}

}  // namespace

TransformerConfig MoeConfig() {
  TransformerConfig c;
  c.name = "moe";
  c.experts = 8;
  c.top_k = 2;
  return c;
}

TransformerConfig DenseConfig() { return TransformerConfig(); }

Status SetTransformerOption(TransformerConfig& c, std::string_view key,
                            std::string_view value) {
  auto u64 = [&](uint64_t* out) { return ParseNumber(key, value, out); };
  auto i32 = [&](int* out) { return ParseNumber(key, value, out); };
  if (key == "layers") return i32(&c.layers);
  if (key == "iterations") return i32(&c.iterations);
  if (key == "hidden") return u64(&c.hidden);
  if (key == "heads") return u64(&c.heads);
  if (key == "seq_len") return u64(&c.seq_len);
  if (key == "micro_batch") return u64(&c.micro_batch);
  if (key == "vocab") return u64(&c.vocab);
  if (key == "ffn_hidden") return u64(&c.ffn_hidden);
  if (key == "experts") return i32(&c.experts);
  if (key == "top_k") return i32(&c.top_k);
  if (key == "expert_ffn_hidden") return u64(&c.expert_ffn_hidden);
  if (key == "optimizer_shard") return u64(&c.optimizer_shard);
  if (key == "seed") return u64(&c.seed);
  if (key == "routing_skew") {
    std::string text(value);
    char* end = nullptr;
    double skew = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || text.empty() ||
        !std::isfinite(skew)) {
      return InvalidArgumentError(
          "workload option routing_skew={}: not a "
          "number",
          value);
    }
    c.routing_skew = skew;
    return OkStatus();
  }
  if (key == "comm_stream") {
    if (value != "0" && value != "1" && value != "true" && value != "false") {
      return InvalidArgumentError("workload option comm_stream={}: use 0 or 1",
                                  value);
    }
    c.comm_stream = value == "1" || value == "true";
    return OkStatus();
  }
  return InvalidArgumentError("unknown workload option '{}'", key);
}

Status ValidateTransformerConfig(const TransformerConfig& c) {
  if (c.layers < 1 || c.layers > 1000) {
    return InvalidArgumentError("layers must be in [1, 1000], not {}",
                                c.layers);
  }
  if (c.iterations < 1 || c.iterations > 1000) {
    return InvalidArgumentError("iterations must be in [1, 1000], not {}",
                                c.iterations);
  }
  for (auto [name, value] :
       {std::pair<const char*, uint64_t>{"hidden", c.hidden},
        {"heads", c.heads},
        {"seq_len", c.seq_len},
        {"micro_batch", c.micro_batch},
        {"vocab", c.vocab},
        {"ffn_hidden", c.ffn_hidden},
        {"expert_ffn_hidden", c.expert_ffn_hidden},
        {"dtype_bytes", c.dtype_bytes},
        {"optimizer_shard", c.optimizer_shard}}) {
    if (value == 0) return InvalidArgumentError("{} must be positive", name);
  }
  if (c.experts < 0 || c.experts > 4096) {
    return InvalidArgumentError("experts must be in [0, 4096], not {}",
                                c.experts);
  }
  if (c.experts > 0 && (c.top_k < 1 || c.top_k > c.experts)) {
    return InvalidArgumentError("top_k must be in [1, experts={}], not {}",
                                c.experts, c.top_k);
  }
  if (!(c.routing_skew >= 0.0 && c.routing_skew <= 100.0)) {
    return InvalidArgumentError("routing_skew must be in [0, 100]");
  }
  const uint64_t tokens = CheckedProduct({c.seq_len, c.micro_batch});
  const uint64_t k = c.experts > 0 ? static_cast<uint64_t>(c.top_k) : 1;
  const uint64_t largest[] = {
      CheckedProduct({tokens, c.vocab, 4}),
      CheckedProduct({tokens, 3 * c.hidden, c.dtype_bytes}),
      CheckedProduct({tokens, k, c.hidden, c.dtype_bytes}),
      CheckedProduct({tokens, k, 2 * c.expert_ffn_hidden, c.dtype_bytes}),
      CheckedProduct({tokens, 2 * c.ffn_hidden, c.dtype_bytes}),
      CheckedProduct({c.vocab, c.hidden, c.dtype_bytes}),
      CheckedProduct({3 * c.hidden, c.hidden, 4}),
      CheckedProduct(
          {2 * std::max(c.ffn_hidden, c.expert_ffn_hidden), c.hidden, 4}),
      CheckedProduct({c.micro_batch, c.heads, c.seq_len, 4}),
  };
  for (uint64_t bytes : largest) {
    if (bytes == 0) {
      return InvalidArgumentError(
          "workload tensors would exceed 2^50 bytes: reduce the sizes");
    }
  }
  const uint64_t params =
      c.layers * (6 + 2 * static_cast<uint64_t>(c.experts)) + 3;
  const uint64_t events =
      2 * params +
      c.iterations * (c.layers * (80 + 24 * static_cast<uint64_t>(c.experts)) +
                      8 * params + 60);
  if (events > kMaxEvents) {
    return InvalidArgumentError(
        "the workload would have about {} events "
        "(more than {})",
        events, kMaxEvents);
  }
  return OkStatus();
}

std::vector<uint64_t> ExpertTokenCounts(const TransformerConfig& c,
                                        int iteration, int layer) {
  LOOM_CHECK(c.experts > 0 && c.top_k >= 1 && c.top_k <= c.experts);
  Rng rng(c.seed * 0x100000001b3ULL ^ (static_cast<uint64_t>(iteration) << 32 |
                                       static_cast<uint64_t>(layer)));
  const int experts = c.experts;
  std::vector<double> popularity(experts);
  for (double& p : popularity) p = c.routing_skew * rng.Normal();
  std::vector<uint64_t> counts(experts, 0);
  std::vector<double> score(experts);
  std::vector<int> order(experts);
  const uint64_t tokens = c.seq_len * c.micro_batch;
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

StatusOr<plan::Trace> GenerateTransformerTrace(
    const TransformerConfig& config) {
  LOOM_RETURN_IF_ERROR(ValidateTransformerConfig(config));
  Generator generator(config);
  return generator.Run();
}

}  // namespace loom::whatif
