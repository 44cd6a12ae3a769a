#include "vmm/flat_map.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace loom::vmm {
namespace {

TEST(FlatMapTest, MatchesStdMapUnderRandomOperations) {
  FlatMap<uint64_t> flat;
  std::map<uint64_t, uint64_t> reference;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 200000; ++step) {
    // Keys shaped like device addresses: few high bits, 512-aligned.
    uint64_t key = (uint64_t{1} << 44) + (rng() % 4096) * 512;
    if (rng() % 3 != 0) {
      if (!reference.contains(key)) {
        flat.Insert(key, step);
        reference[key] = step;
      }
    } else {
      EXPECT_EQ(flat.Erase(key), reference.erase(key) == 1);
    }
    if (step % 997 == 0) {
      ASSERT_EQ(flat.size(), reference.size());
      for (const auto& [k, v] : reference) {
        const uint64_t* found = flat.Find(k);
        ASSERT_NE(found, nullptr);
        ASSERT_EQ(*found, v);
      }
    }
  }
  size_t visited = 0;
  flat.ForEach([&](uint64_t k, uint64_t v) {
    EXPECT_EQ(reference.at(k), v);
    ++visited;
  });
  EXPECT_EQ(visited, reference.size());
  EXPECT_EQ(flat.Find(12345), nullptr);
}

}  // namespace
}  // namespace loom::vmm
