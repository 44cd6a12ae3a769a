#include "whatif/workloads/transformer_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <numeric>
#include <utility>

#include "base/check.h"
#include "whatif/workloads/rng.h"

namespace loom::whatif {
namespace {

constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 50;
constexpr uint64_t kMaxEvents = 10'000'000;
constexpr size_t kMaxSeqLens = 64;

// The product, or 0 when it exceeds kMaxTensorBytes (or a factor is 0).
uint64_t CheckedProduct(std::initializer_list<uint64_t> factors) {
  unsigned __int128 product = 1;
  for (uint64_t f : factors) {
    product *= f;
    if (product > kMaxTensorBytes) return 0;
  }
  return static_cast<uint64_t>(product);
}

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

Status ParseDouble(std::string_view key, std::string_view value, double* out) {
  std::string text(value);
  char* end = nullptr;
  double number = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || text.empty() ||
      !std::isfinite(number)) {
    return InvalidArgumentError("workload option {}={}: not a number", key,
                                value);
  }
  *out = number;
  return OkStatus();
}

Status ParseSeqLens(std::string_view value, std::vector<uint64_t>* out) {
  std::vector<uint64_t> lens;
  std::string_view rest = value;
  while (true) {
    size_t colon = rest.find(':');
    std::string_view item = rest.substr(0, colon);
    uint64_t len = 0;
    auto [end, error] =
        std::from_chars(item.data(), item.data() + item.size(), len);
    if (item.empty() || error != std::errc() ||
        end != item.data() + item.size()) {
      return InvalidArgumentError(
          "workload option seq_lens={}: not a list of lengths separated by "
          "':' (e.g. 1024:2048:4096)",
          value);
    }
    lens.push_back(len);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  *out = std::move(lens);
  return OkStatus();
}

// A seed of its own for the sequence-length schedule (the routing uses
// seed * FNV prime ^ (iteration << 32 | layer)).
uint64_t SeqLenSeed(uint64_t seed, uint64_t salt) {
  Rng mix(seed ^ 0x7365716c656e73ULL);  // "seqlens"
  return mix.Next() ^ (salt * 0xd6e8feb86659fd93ULL);
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

TransformerConfig MoeDroplessConfig() {
  TransformerConfig c = MoeConfig();
  c.name = "moe_dropless";
  return c;
}

TransformerConfig MoeCapacityConfig() {
  TransformerConfig c = MoeConfig();
  c.name = "moe_capacity";
  c.capacity_factor = 1.25;
  return c;
}

TransformerConfig VarlenConfig() {
  TransformerConfig c = DenseConfig();
  c.name = "varlen";
  c.iterations = 8;
  c.seq_lens = {1024, 2048, 4096};
  c.seq_len_order = SeqLenOrder::kShuffle;
  return c;
}

TransformerConfig EvalConfig() {
  TransformerConfig c = DenseConfig();
  c.name = "eval";
  c.iterations = 8;
  c.eval_every = 3;
  c.eval_batches = 2;
  return c;
}

Status SetTransformerOption(TransformerConfig& c, std::string_view key,
                            std::string_view value) {
  auto u64 = [&](uint64_t* out) { return ParseNumber(key, value, out); };
  auto i32 = [&](int* out) { return ParseNumber(key, value, out); };
  if (key == "layers") return i32(&c.layers);
  if (key == "iterations") return i32(&c.iterations);
  if (key == "hidden") return u64(&c.hidden);
  if (key == "heads") return u64(&c.heads);
  if (key == "seq_len") {
    c.seq_lens.clear();
    return u64(&c.seq_len);
  }
  if (key == "seq_lens") return ParseSeqLens(value, &c.seq_lens);
  if (key == "seq_len_order") {
    if (value == "cycle") {
      c.seq_len_order = SeqLenOrder::kCycle;
    } else if (value == "shuffle") {
      c.seq_len_order = SeqLenOrder::kShuffle;
    } else if (value == "random") {
      c.seq_len_order = SeqLenOrder::kRandom;
    } else {
      return InvalidArgumentError(
          "workload option seq_len_order={}: use cycle, shuffle or random",
          value);
    }
    return OkStatus();
  }
  if (key == "micro_batch") return u64(&c.micro_batch);
  if (key == "vocab") return u64(&c.vocab);
  if (key == "ffn_hidden") return u64(&c.ffn_hidden);
  if (key == "experts") return i32(&c.experts);
  if (key == "top_k") return i32(&c.top_k);
  if (key == "expert_ffn_hidden") return u64(&c.expert_ffn_hidden);
  if (key == "optimizer_shard") return u64(&c.optimizer_shard);
  if (key == "eval_every") return i32(&c.eval_every);
  if (key == "eval_batches") return i32(&c.eval_batches);
  if (key == "seed") return u64(&c.seed);
  if (key == "routing_skew") return ParseDouble(key, value, &c.routing_skew);
  if (key == "capacity_factor") {
    return ParseDouble(key, value, &c.capacity_factor);
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
  if (c.seq_lens.size() > kMaxSeqLens) {
    return InvalidArgumentError("seq_lens has {} lengths (at most {})",
                                c.seq_lens.size(), kMaxSeqLens);
  }
  for (uint64_t len : c.seq_lens) {
    if (len == 0) return InvalidArgumentError("seq_lens must be positive");
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
  if (!(c.capacity_factor >= 0.0 && c.capacity_factor <= 100.0)) {
    return InvalidArgumentError(
        "capacity_factor must be in [0, 100] (0: dropless), not {}",
        c.capacity_factor);
  }
  if (c.capacity_factor > 0 && c.experts == 0) {
    return InvalidArgumentError(
        "capacity_factor={} needs experts > 0 (a dense model has no experts "
        "to cap)",
        c.capacity_factor);
  }
  if (c.eval_every < 0 || c.eval_every > 1000) {
    return InvalidArgumentError(
        "eval_every must be in [0, 1000] (0: no evaluation), not {}",
        c.eval_every);
  }
  if (c.eval_batches < 1 || c.eval_batches > 100) {
    return InvalidArgumentError("eval_batches must be in [1, 100], not {}",
                                c.eval_batches);
  }
  const uint64_t seq_len = MaxSeqLen(c);
  const uint64_t tokens = CheckedProduct({seq_len, c.micro_batch});
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
      CheckedProduct({c.micro_batch, c.heads, seq_len, 4}),
  };
  for (uint64_t bytes : largest) {
    if (bytes == 0) {
      return InvalidArgumentError(
          "workload tensors would exceed 2^50 bytes: reduce the sizes");
    }
  }
  // tokens * top_k < 2^50 from here on, so the capacity fits easily.
  if (c.capacity_factor > 0) {
    const uint64_t experts = static_cast<uint64_t>(c.experts);
    const uint64_t capacity = ExpertCapacity(c, tokens);
    if (CheckedProduct({experts, capacity, c.hidden, c.dtype_bytes}) == 0 ||
        CheckedProduct({capacity, 2 * c.expert_ffn_hidden, c.dtype_bytes}) ==
            0) {
      return InvalidArgumentError(
          "expert buffers at capacity_factor {} would exceed 2^50 bytes",
          c.capacity_factor);
    }
  }
  const uint64_t experts = static_cast<uint64_t>(c.experts);
  const uint64_t params = c.layers * (6 + 2 * experts) + 3;
  const uint64_t evals =
      c.eval_every > 0 ? static_cast<uint64_t>(c.iterations / c.eval_every) *
                             static_cast<uint64_t>(c.eval_batches)
                       : 0;
  const uint64_t events =
      2 * params +
      c.iterations * (c.layers * (80 + 24 * experts) + 8 * params + 60) +
      evals * (c.layers * (50 + 12 * experts) + 40);
  if (events > kMaxEvents) {
    return InvalidArgumentError(
        "the workload would have about {} events "
        "(more than {})",
        events, kMaxEvents);
  }
  return OkStatus();
}

uint64_t SeqLenAt(const TransformerConfig& c, int iteration) {
  LOOM_CHECK(iteration >= 0);
  const uint64_t n = c.seq_lens.size();
  if (n == 0) return c.seq_len;
  const uint64_t it = static_cast<uint64_t>(iteration);
  switch (c.seq_len_order) {
    case SeqLenOrder::kCycle:
      return c.seq_lens[it % n];
    case SeqLenOrder::kShuffle: {
      // Fisher-Yates over the round's positions.
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      Rng rng(SeqLenSeed(c.seed, it / n));
      for (uint64_t i = n - 1; i > 0; --i) {
        std::swap(order[i], order[rng.Below(i + 1)]);
      }
      return c.seq_lens[order[it % n]];
    }
    case SeqLenOrder::kRandom: {
      Rng rng(SeqLenSeed(c.seed, it) ^ 0x72616e646f6dULL);  // "random"
      return c.seq_lens[rng.Below(n)];
    }
  }
  LOOM_CHECK(false);
  return 0;
}

uint64_t MaxSeqLen(const TransformerConfig& c) {
  if (c.seq_lens.empty()) return c.seq_len;
  return *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
}

uint64_t ExpertCapacity(const TransformerConfig& c, uint64_t tokens) {
  if (c.experts <= 0 || !(c.capacity_factor > 0)) return 0;
  const double capacity =
      std::ceil(static_cast<double>(tokens) * static_cast<double>(c.top_k) /
                static_cast<double>(c.experts) * c.capacity_factor);
  return std::max<uint64_t>(1, static_cast<uint64_t>(capacity));
}

bool EvalAfter(const TransformerConfig& c, int iteration) {
  return c.eval_every > 0 && (iteration + 1) % c.eval_every == 0;
}

}  // namespace loom::whatif
