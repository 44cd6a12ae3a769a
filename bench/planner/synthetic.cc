#include "bench/planner/synthetic.h"

#include <algorithm>
#include <random>
#include <vector>

#include "base/check.h"

namespace loom::bench {
namespace {

// Records allocations and frees as a trace would: one time step each.
class Timeline {
 public:
  size_t Alloc(uint64_t size) {
    buffers_.push_back({buffers_.size(), now_++, -1, size, 1});
    return buffers_.size() - 1;
  }
  void Free(size_t buffer) {
    LOOM_CHECK(buffers_[buffer].end < 0, "double free of {}", buffer);
    buffers_[buffer].end = now_++;
  }
  int64_t now() const { return now_; }
  std::vector<plan::Buffer> Take() { return std::move(buffers_); }

 private:
  std::vector<plan::Buffer> buffers_;
  int64_t now_ = 0;
};

struct Sizes {
  uint64_t act, qkv, stats, mask, norm, mlp, weight_qkv, weight_proj,
      weight_mlp;
};

}  // namespace

plan::Instance SyntheticTrainingIteration(const SyntheticOptions& o) {
  LOOM_CHECK(o.layers >= 1 && o.micro_batches >= 1 && o.in_flight >= 1);
  std::mt19937_64 rng(o.seed);
  Timeline tl;
  const uint64_t act = o.tokens * o.hidden * 2;  // bf16 activations
  auto layer_sizes = [&](int layer) {
    Sizes s;
    s.act = act;
    s.qkv = 3 * act;
    s.stats = o.heads * o.tokens * 4;
    s.mask = act / 2;
    s.norm = o.tokens * 8;
    // Every fourth layer has a narrower MLP: a few more distinct sizes.
    s.mlp = layer % 4 == 3 ? 3 * act + act / 2 : 4 * act;
    s.weight_qkv = 3 * o.hidden * o.hidden * 2;
    s.weight_proj = o.hidden * o.hidden * 2;
    s.weight_mlp = (s.mlp / act) * o.hidden * o.hidden * 2;
    return s;
  };
  std::vector<bool> recompute(o.layers);
  for (int l = 0; l < o.layers; ++l) {
    recompute[l] = std::uniform_real_distribution<double>(0, 1)(rng) <
                   o.recompute_fraction;
  }
  // Whole-iteration state: weights and two optimizer moments per weight.
  std::vector<size_t> persistent;
  for (int l = 0; l < o.layers; ++l) {
    const Sizes s = layer_sizes(l);
    for (uint64_t w :
         {s.weight_qkv, s.weight_proj, s.weight_mlp, s.weight_mlp}) {
      persistent.push_back(tl.Alloc(w));
      persistent.push_back(tl.Alloc(2 * w));
      persistent.push_back(tl.Alloc(2 * w));
    }
  }
  // A few short-lived temporaries of repeated sizes.
  auto temporaries = [&](int count, const Sizes& s) {
    const uint64_t choices[] = {s.act, s.act, s.mlp, s.qkv, s.mask, s.norm};
    std::vector<size_t> open;
    for (int k = 0; k < count; ++k) {
      open.push_back(tl.Alloc(choices[rng() % std::size(choices)]));
      if (open.size() > 1 && rng() % 2) {
        tl.Free(open.front());
        open.erase(open.begin());
      }
    }
    for (size_t b : open) tl.Free(b);
  };
  auto activations = [&](const Sizes& s) {
    return std::vector<uint64_t>{s.norm, s.qkv, s.stats, s.act,  s.mask,
                                 s.norm, s.mlp, s.mlp,   s.mask, s.act};
  };
  // saved[m][l]: buffers the backward of layer l needs (freed by it).
  std::vector<std::vector<std::vector<size_t>>> saved(
      o.micro_batches, std::vector<std::vector<size_t>>(o.layers));
  std::vector<std::vector<size_t>> weight_grads(o.layers);
  auto forward = [&](int m) {
    for (int l = 0; l < o.layers; ++l) {
      const Sizes s = layer_sizes(l);
      temporaries(3 + static_cast<int>(rng() % 6), s);
      if (recompute[l]) {
        saved[m][l].push_back(tl.Alloc(s.act));  // the layer's input
        std::vector<size_t> scratch;
        for (uint64_t size : activations(s)) scratch.push_back(tl.Alloc(size));
        for (auto it = scratch.rbegin(); it != scratch.rend(); ++it)
          tl.Free(*it);
      } else {
        for (uint64_t size : activations(s))
          saved[m][l].push_back(tl.Alloc(size));
      }
    }
  };
  auto backward = [&](int m) {
    size_t grad_from_above = SIZE_MAX;
    for (int l = o.layers - 1; l >= 0; --l) {
      const Sizes s = layer_sizes(l);
      if (recompute[l]) {
        for (uint64_t size : activations(s))
          saved[m][l].push_back(tl.Alloc(size));
      }
      if (weight_grads[l].empty()) {
        for (uint64_t w :
             {s.weight_qkv, s.weight_proj, s.weight_mlp, s.weight_mlp}) {
          weight_grads[l].push_back(tl.Alloc(w));
        }
      }
      temporaries(6 + static_cast<int>(rng() % 7), s);
      // Partial weight gradients, accumulated into the long-lived ones.
      const size_t partial = tl.Alloc(s.weight_mlp);
      tl.Free(partial);
      const size_t grad_in = tl.Alloc(s.act);  // for the layer below
      if (grad_from_above != SIZE_MAX) tl.Free(grad_from_above);
      grad_from_above = grad_in;
      for (auto it = saved[m][l].rbegin(); it != saved[m][l].rend(); ++it) {
        tl.Free(*it);
      }
      saved[m][l].clear();
    }
    tl.Free(grad_from_above);
  };
  // 1F1B: warm up, steady state, drain.
  int next_forward = 0, next_backward = 0;
  while (next_forward < std::min(o.in_flight, o.micro_batches))
    forward(next_forward++);
  while (next_backward < o.micro_batches) {
    backward(next_backward++);
    if (next_forward < o.micro_batches) forward(next_forward++);
  }
  // Optimizer step: per layer a temporary, then the gradients go.
  for (int l = 0; l < o.layers; ++l) {
    const Sizes s = layer_sizes(l);
    const size_t scratch = tl.Alloc(s.weight_mlp);
    tl.Free(scratch);
    for (size_t g : weight_grads[l]) tl.Free(g);
  }
  for (auto it = persistent.rbegin(); it != persistent.rend(); ++it)
    tl.Free(*it);

  plan::Instance inst;
  inst.buffers = tl.Take();
  if (o.cyclic) {
    // Move the iteration boundary to a random point of the schedule.
    const int64_t period = tl.now();
    const int64_t shift =
        static_cast<int64_t>(rng() % static_cast<uint64_t>(period));
    for (plan::Buffer& b : inst.buffers) {
      const int64_t length = b.end - b.start;
      b.start = (b.start + shift) % period;
      b.end = b.start + length;
    }
    inst.period = period;
  }
  return inst;
}

}  // namespace loom::bench
