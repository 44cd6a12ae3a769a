// Seeded random request sequences against every simulator, with the
// invariants checked after every step: live allocations never overlap,
// each lies inside memory the allocator has mapped, allocated <= reserved,
// reserved == the simulated device's physical memory, and the allocator's
// own CheckInvariants. A 1 GiB capacity is small enough that the OOM fallbacks
// (cache release, retries, OOM) run often.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "whatif/sim/caching_allocator.h"
#include "whatif/sim/gmlake_allocator.h"

namespace loom::whatif {
namespace {

struct Variant {
  std::string name;
  uint64_t capacity;
  std::function<std::unique_ptr<SimAllocator>(uint64_t capacity)> make;
};

std::unique_ptr<SimAllocator> MakeCaching(const std::string& conf,
                                          uint64_t capacity) {
  auto config = ParseAllocConf(conf);
  LOOM_CHECK(config.ok(), "{}", config.status().ToString());
  return std::make_unique<CachingAllocator>(*config, SimOptions{capacity});
}

std::vector<Variant> Variants() {
  std::vector<Variant> variants;
  for (uint64_t capacity : {uint64_t{0}, kGiB}) {
    std::string suffix = capacity ? "_1GiB" : "_unlimited";
    variants.push_back({"native" + suffix, capacity,
                        [](uint64_t c) { return MakeCaching("", c); }});
    variants.push_back({"native_max_split" + suffix, capacity, [](uint64_t c) {
                          return MakeCaching(
                              "max_split_size_mb:64,"
                              "roundup_power2_divisions:[2:4,64:8,>:2]",
                              c);
                        }});
    variants.push_back({"expandable" + suffix, capacity, [](uint64_t c) {
                          return MakeCaching("expandable_segments:True", c);
                        }});
    variants.push_back(
        {"expandable_max_split" + suffix, capacity, [](uint64_t c) {
           return MakeCaching("expandable_segments:True,max_split_size_mb:32",
                              c);
         }});
    variants.push_back({"gmlake" + suffix, capacity, [](uint64_t c) {
                          GmlakeOptions options;
                          options.frag_limit = 24 * kMiB;
                          options.reuse_limit = 4;
                          return std::make_unique<GmlakeAllocator>(
                              options, SimOptions{c});
                        }});
    variants.push_back({"gmlake_gc" + suffix, capacity, [](uint64_t c) {
                          GmlakeOptions options;
                          options.frag_limit = 8 * kMiB;
                          options.auto_gc_limit = 256 * kMiB;
                          options.max_split_size = 96 * kMiB;
                          return std::make_unique<GmlakeAllocator>(
                              options, SimOptions{c});
                        }});
  }
  return variants;
}

uint64_t RandomSize(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 9);
  auto uniform = [&rng](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  switch (kind(rng)) {
    case 0:
    case 1:
    case 2:
      return uniform(1, 4096);
    case 3:
    case 4:
      return uniform(4097, kMiB);
    case 5:
    case 6:
      return uniform(kMiB + 1, 10 * kMiB);
    case 7:
    case 8:
      return uniform(10 * kMiB, 64 * kMiB);
    default:
      return uniform(64 * kMiB, 160 * kMiB);
  }
}

class RandomSequenceTest : public ::testing::TestWithParam<int> {};

TEST_P(RandomSequenceTest, InvariantsHoldAfterEveryStep) {
  const int seed = GetParam();
  uint64_t gmlake_reuses = 0;
  for (const Variant& variant : Variants()) {
    SCOPED_TRACE(variant.name + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::unique_ptr<SimAllocator> allocator = variant.make(variant.capacity);
    std::map<uint64_t, uint64_t> live;  // address -> size
    uint64_t ooms = 0;
    for (int step = 0; step < 1500; ++step) {
      std::uniform_int_distribution<int> action(0, 99);
      int a = action(rng);
      if (a < 55 || live.empty()) {
        uint64_t size = RandomSize(rng);
        uint64_t stream = std::uniform_int_distribution<int>(0, 9)(rng) < 8
                              ? 0
                              : std::uniform_int_distribution<int>(1, 2)(rng);
        auto address = allocator->Malloc(size, stream);
        if (!address.ok()) {
          ASSERT_EQ(address.status().code(), StatusCode::kOutOfMemory)
              << address.status().ToString();
          ++ooms;
        } else {
          auto next = live.lower_bound(*address);
          ASSERT_TRUE(next == live.end() || next->first >= *address + size)
              << "overlaps the next live allocation at step " << step;
          ASSERT_TRUE(next == live.begin() ||
                      std::prev(next)->first + std::prev(next)->second <=
                          *address)
              << "overlaps the previous live allocation at step " << step;
          live[*address] = size;
        }
      } else if (a < 98) {
        auto it = live.begin();
        std::advance(
            it, std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng));
        ASSERT_TRUE(allocator->Free(it->first).ok());
        live.erase(it);
      } else {
        allocator->EmptyCache();
      }
      Status status = allocator->CheckInvariants();
      ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.ToString();
      const MemoryStats& stats = allocator->stats();
      ASSERT_LE(stats.allocated_bytes.all().current,
                stats.reserved_bytes.all().current);
      if (variant.capacity != 0) {
        ASSERT_LE(stats.reserved_bytes.all().current,
                  int64_t(variant.capacity));
      }
      // Every live allocation lies inside mapped memory.
      std::vector<AddressRange> mapped = allocator->MappedRanges();
      for (const auto& [address, size] : live) {
        uint64_t covered = address;
        for (const AddressRange& r : mapped) {
          if (r.address <= covered && covered < r.end()) covered = r.end();
        }
        ASSERT_GE(covered, address + size)
            << "allocation at step " << step << " not inside mapped memory";
      }
    }
    EXPECT_EQ(allocator->stats().num_ooms, ooms);
    if (variant.capacity != 0) {
      EXPECT_GT(ooms, 0u);
      EXPECT_GT(allocator->stats().num_alloc_retries, ooms);
    }
    // The sequences reach the interesting paths of the stitcher.
    if (auto* gmlake = dynamic_cast<GmlakeAllocator*>(allocator.get())) {
      EXPECT_GT(gmlake->stitches(), 0u);
      gmlake_reuses += gmlake->stitch_reuses();
    }
    for (const auto& [address, size] : live) {
      ASSERT_TRUE(allocator->Free(address).ok());
    }
    allocator->EmptyCache();
    ASSERT_TRUE(allocator->CheckInvariants().ok());
    EXPECT_EQ(allocator->stats().allocated_bytes.all().current, 0);
    EXPECT_EQ(allocator->stats().reserved_bytes.all().current, 0);
  }
  EXPECT_GT(gmlake_reuses, 0u);  // cached stitched blocks were reused
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomSequenceTest, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace loom::whatif
