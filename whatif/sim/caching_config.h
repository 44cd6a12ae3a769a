// Settings and size rules of PyTorch's CUDA caching allocator, as in
// PyTorch 2.11 (c10/core/AllocatorConfig.{h,cpp}: AcceleratorAllocatorConfig;
// c10/cuda/CUDACachingAllocator.cpp: round_size, get_allocation_size).
//
// CachingConfig holds what PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF can
// set and the simulator models; ParseAllocConf reads that string with
// PyTorch's grammar and checks. Two switches reproduce older releases:
//  - RoundupRule: round_size() applies power-of-two divisions when
//    `divisions > 1` (2.5 and later) or `divisions > 0` (2.4 and earlier,
//    where a bucket value of 1 meant "round to the next power of two");
//  - NonSplitRule: an oversize cached block may serve a request when
//    block < request + max_non_split_rounding_size (2.6 and later) or
//    + kLargeBuffer (2.5 and earlier).
// Invariant of a valid config: every roundup bucket is 0 or a power of two;
// max_split_size >= 20 MiB (or unlimited); large_segment_size is a positive
// multiple of 2 MiB.
#ifndef LOOM_WHATIF_SIM_CACHING_CONFIG_H_
#define LOOM_WHATIF_SIM_CACHING_CONFIG_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "whatif/sim/device.h"
#include "whatif/sim/stats.h"
#include "base/status.h"

namespace loom::whatif {

// Constants of CUDACachingAllocator.cpp / AllocatorConfig.h.
inline constexpr uint64_t kMinBlockSize = 512;          // rounding unit
inline constexpr uint64_t kSmallSize = 1 * kMiB;        // <= : small pool
inline constexpr uint64_t kSmallBuffer = 2 * kMiB;      // small segment/page
inline constexpr uint64_t kMinLargeAlloc = 10 * kMiB;   // < : large segment
inline constexpr uint64_t kLargeBuffer = 20 * kMiB;     // large segment/page
inline constexpr uint64_t kRoundLarge = 2 * kMiB;       // >= 10 MiB rounding
inline constexpr int kRoundUpPowerOfTwoIntervals = 16;  // 1 MiB .. 64 GiB

enum class RoundupRule { kDivisionsAboveOne, kDivisionsAboveZero };
enum class NonSplitRule { kConfigured, kLargeBuffer };

struct CachingConfig {
  bool expandable_segments = false;
  uint64_t max_split_size = kNoMaxSplitSize;
  uint64_t max_non_split_rounding_size = kLargeBuffer;
  uint64_t large_segment_size = kLargeBuffer;
  // Divisions per power-of-two interval; index 0 covers sizes < 2 MiB,
  // index i >= 1 covers [2^(20+i), 2^(21+i)), the last one everything
  // above. 0 disables rounding for the bucket.
  std::array<uint64_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  RoundupRule roundup_rule = RoundupRule::kDivisionsAboveOne;
  NonSplitRule non_split_rule = NonSplitRule::kConfigured;

  // The rounding slack allowed for an oversize block, per non_split_rule.
  uint64_t NonSplitRounding() const {
    return non_split_rule == NonSplitRule::kLargeBuffer
               ? kLargeBuffer
               : max_non_split_rounding_size;
  }
};

// The rules of a PyTorch release: "2.4" (or older) -> divisions > 0 and the
// kLargeBuffer non-split rule; "2.5" -> divisions > 1, kLargeBuffer rule;
// "2.6" and later -> divisions > 1, configured rule. Any other string is
// INVALID_ARGUMENT.
StatusOr<CachingConfig> ConfigForTorchVersion(std::string_view version);

// Parses an allocator settings string such as
// "expandable_segments:True,max_split_size_mb:128,
//  roundup_power2_divisions:[64:8,>:1]" on top of `base` (whose version
// switches are kept). Options without effect on the simulation
// (pinned_*, release_lock_on_cudamalloc, backend:native) are accepted and
// ignored; garbage_collection_threshold and backend:cudaMallocAsync are
// UNIMPLEMENTED; anything else malformed is INVALID_ARGUMENT naming the
// offending token.
StatusOr<CachingConfig> ParseAllocConf(std::string_view text,
                                       const CachingConfig& base = {});

// roundup_power2_divisions(size): the bucket value for `size`.
uint64_t RoundupPower2Divisions(const CachingConfig& config, uint64_t size);

// Rounds `size` up to the next of `divisions` equal steps between the
// surrounding powers of two (1200, 4 -> 1280). Powers of two are kept.
// REQUIRES: divisions >= 1 is a power of two.
uint64_t RoundupPower2NextDivision(uint64_t size, uint64_t divisions);

// round_size(): the block size a request of `size` bytes gets.
// REQUIRES: size < kMaxRequestSize (1 EiB).
uint64_t RoundSize(const CachingConfig& config, uint64_t size);

// get_allocation_size(): the segment size cudaMalloc'ed for a rounded
// request that no cached block can serve.
uint64_t GetAllocationSize(const CachingConfig& config, uint64_t rounded);

// The settings string that reproduces `config` (PYTORCH_ALLOC_CONF form;
// only non-default settings; "" when all are default).
std::string FormatAllocConf(const CachingConfig& config);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_CACHING_CONFIG_H_
