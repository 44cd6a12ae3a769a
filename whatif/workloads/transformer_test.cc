#include "whatif/workloads/transformer.h"

#include <gtest/gtest.h>

#include <numeric>
#include <unordered_map>

namespace loom::whatif {
namespace {

TransformerConfig TinyDense() {
  TransformerConfig c;
  c.layers = 1;
  c.iterations = 3;
  c.hidden = 4;
  c.heads = 1;
  c.seq_len = 2;
  c.micro_batch = 1;
  c.vocab = 8;
  c.ffn_hidden = 8;
  return c;
}

TransformerConfig TinyMoe() {
  TransformerConfig c = TinyDense();
  c.name = "moe";
  c.layers = 2;
  c.experts = 4;
  c.top_k = 2;
  c.hidden = 8;
  c.seq_len = 16;
  c.micro_batch = 2;
  c.expert_ffn_hidden = 6;
  return c;
}

struct IterationView {
  uint64_t live_bytes_at_end = 0;
  size_t live_count_at_end = 0;
  std::vector<uint64_t> alloc_sizes;  // in order
};

// Replays the trace by request id; one view per iteration.
std::vector<IterationView> Views(const plan::Trace& trace) {
  std::vector<IterationView> views;
  std::unordered_map<uint64_t, uint64_t> live;
  uint64_t bytes = 0;
  for (const plan::Event& e : trace.events) {
    switch (e.kind) {
      case plan::EventKind::kIterationBegin:
        views.emplace_back();
        break;
      case plan::EventKind::kAlloc:
        live[e.id] = e.size;
        bytes += e.size;
        if (!views.empty()) views.back().alloc_sizes.push_back(e.size);
        break;
      case plan::EventKind::kFree:
        bytes -= live.at(e.id);
        live.erase(e.id);
        break;
      case plan::EventKind::kIterationEnd:
        views.back().live_bytes_at_end = bytes;
        views.back().live_count_at_end = live.size();
        break;
      default:
        break;
    }
  }
  return views;
}

TEST(TransformerTest, TinyDenseKeepsOnlyWeightsAndOptimizerState) {
  auto trace = GenerateTransformerTrace(TinyDense());
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_TRUE(plan::ValidateTrace(*trace).ok());
  auto views = Views(*trace);
  ASSERT_EQ(views.size(), 3u);
  // 236 parameters in bf16 (472 B) + 3 fp32 shards of 1/8 (354 B), by hand:
  // embedding 32, ln 4+4+4, qkv 48, proj 16, gate_up 64, down 32, head 32.
  for (const IterationView& view : views) {
    EXPECT_EQ(view.live_bytes_at_end, 472u + 354u);
    EXPECT_EQ(view.live_count_at_end, 9u + 27u);
  }
  // Dense iterations repeat exactly once the optimizer state exists.
  EXPECT_EQ(views[1].alloc_sizes, views[2].alloc_sizes);
  EXPECT_EQ(views[0].alloc_sizes.size(), views[1].alloc_sizes.size() + 27);
}

TEST(TransformerTest, MarkersNestAndFlagMoeModulesDynamic) {
  auto trace = GenerateTransformerTrace(TinyMoe());
  ASSERT_TRUE(trace.ok());
  ASSERT_TRUE(plan::ValidateTrace(*trace).ok());
  int phases = 0;
  int dynamic = 0;
  int static_modules = 0;
  for (const plan::Event& e : trace->events) {
    if (e.kind == plan::EventKind::kPhase) ++phases;
    if (e.kind != plan::EventKind::kModuleEnter) continue;
    const std::string& name = trace->names[e.name];
    bool is_moe = name.find(".moe") != std::string::npos;
    EXPECT_EQ(e.flags == plan::kDynamicModule, is_moe) << name;
    (is_moe ? dynamic : static_modules)++;
  }
  EXPECT_EQ(phases, 3 * 3);
  // Per iteration and pass: 2 MoE modules; embedding, 2 attention, lm_head.
  EXPECT_EQ(dynamic, 3 * 2 * 2);
  EXPECT_EQ(static_modules, 3 * 2 * 4);
}

TEST(TransformerTest, ExpertBuffersFollowTheRouting) {
  TransformerConfig c = TinyMoe();
  std::vector<uint64_t> counts = ExpertTokenCounts(c, 0, 0);
  ASSERT_EQ(counts.size(), 4u);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), uint64_t{0}),
            32u * 2);  // every token goes to top_k distinct experts
  for (uint64_t n : counts) EXPECT_LE(n, 32u);
  EXPECT_EQ(counts, ExpertTokenCounts(c, 0, 0));  // deterministic
  EXPECT_NE(counts, ExpertTokenCounts(c, 1, 0));  // changes per iteration
  c.seed = 2;
  EXPECT_NE(counts, ExpertTokenCounts(c, 0, 0));
  // The forward pass allocates fc1, act, out per expert sized by its tokens.
  c.seed = 1;
  auto trace = GenerateTransformerTrace(c);
  ASSERT_TRUE(trace.ok());
  auto views = Views(*trace);
  EXPECT_NE(views[1].alloc_sizes, views[2].alloc_sizes);
  std::vector<uint64_t> expected;
  for (uint64_t n : counts) {
    if (n == 0) continue;
    expected.push_back(n * 2 * c.expert_ffn_hidden * 2);
    expected.push_back(n * c.expert_ffn_hidden * 2);
    expected.push_back(n * c.hidden * 2);
  }
  // Find the first MoE expert block in iteration 0: after ln2, logits,
  // probs, idx and the permuted tokens.
  const auto& sizes = views[0].alloc_sizes;
  const uint64_t permuted = 32 * 2 * c.hidden * 2;
  auto it = std::find(sizes.begin(), sizes.end(), permuted);
  ASSERT_NE(it, sizes.end());
  std::vector<uint64_t> got(it + 1, it + 1 + expected.size());
  EXPECT_EQ(got, expected);
}

TEST(TransformerTest, SkewConcentratesTokens) {
  TransformerConfig c = TinyMoe();
  c.seq_len = 512;
  c.routing_skew = 0.0;
  auto balanced = ExpertTokenCounts(c, 0, 0);
  c.routing_skew = 3.0;
  auto skewed = ExpertTokenCounts(c, 0, 0);
  auto spread = [](const std::vector<uint64_t>& v) {
    return *std::max_element(v.begin(), v.end()) -
           *std::min_element(v.begin(), v.end());
  };
  EXPECT_LT(spread(balanced), 120u);  // 512 tokens each on average
  EXPECT_GT(spread(skewed), spread(balanced));
}

TEST(TransformerTest, BuiltinShapesAreRealistic) {
  for (const TransformerConfig& c : {MoeConfig(), DenseConfig()}) {
    auto trace = GenerateTransformerTrace(c);
    ASSERT_TRUE(trace.ok()) << c.name;
    ASSERT_TRUE(plan::ValidateTrace(*trace).ok());
    uint64_t live = 0;
    uint64_t peak = 0;
    size_t allocs = 0;
    std::unordered_map<uint64_t, uint64_t> sizes;
    for (const plan::Event& e : trace->events) {
      if (e.kind == plan::EventKind::kAlloc) {
        sizes[e.id] = e.size;
        live += e.size;
        peak = std::max(peak, live);
        ++allocs;
      } else if (e.kind == plan::EventKind::kFree) {
        live -= sizes[e.id];
      }
    }
    // A training step of a 1.4B (MoE) / 0.7B (dense) model in bf16 with
    // 8192 tokens: several GiB live at the peak, thousands of requests.
    EXPECT_GT(peak, uint64_t{6} << 30) << c.name;
    EXPECT_LT(peak, uint64_t{24} << 30) << c.name;
    EXPECT_GT(allocs, 1000u) << c.name;
    EXPECT_LT(trace->events.size(), 100000u) << c.name;
  }
}

TEST(TransformerTest, OptionsAndValidation) {
  TransformerConfig c = MoeConfig();
  EXPECT_TRUE(SetTransformerOption(c, "layers", "3").ok());
  EXPECT_EQ(c.layers, 3);
  EXPECT_TRUE(SetTransformerOption(c, "routing_skew", "0.5").ok());
  EXPECT_DOUBLE_EQ(c.routing_skew, 0.5);
  EXPECT_TRUE(SetTransformerOption(c, "comm_stream", "1").ok());
  EXPECT_TRUE(c.comm_stream);
  EXPECT_FALSE(SetTransformerOption(c, "layers", "x").ok());
  EXPECT_FALSE(SetTransformerOption(c, "layers", "-").ok());
  EXPECT_FALSE(SetTransformerOption(c, "routing_skew", "nan").ok());
  EXPECT_FALSE(SetTransformerOption(c, "wings", "2").ok());
  EXPECT_FALSE(SetTransformerOption(c, "comm_stream", "yes").ok());

  TransformerConfig bad = MoeConfig();
  bad.top_k = 9;
  EXPECT_FALSE(ValidateTransformerConfig(bad).ok());
  bad = MoeConfig();
  bad.hidden = 0;
  EXPECT_FALSE(ValidateTransformerConfig(bad).ok());
  bad = MoeConfig();
  bad.vocab = uint64_t{1} << 40;  // logits beyond 2^50 bytes
  EXPECT_FALSE(ValidateTransformerConfig(bad).ok());
  bad = MoeConfig();
  bad.layers = 1000;
  bad.iterations = 1000;  // too many events
  EXPECT_FALSE(GenerateTransformerTrace(bad).ok());
}

}  // namespace
}  // namespace loom::whatif
