// loom_torch_malloc: the one C ABI function that throws (for PyTorch's
// CUDAPluggableAllocator, which calls it through a std::function and never
// checks for NULL). The rest of the C ABI is tested from Python
// (torch_plugin/tests/test_c_abi.py); an exception cannot be caught there.
#include "torch_plugin/loom_c_api.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace {

constexpr ssize_t kMiB = ssize_t{1} << 20;

// What PyTorch holds: std::function<void*(size_t, int, cudaStream_t)>.
using TorchMallocFn = std::function<void*(size_t, int, void*)>;

uint64_t StatFromJson(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\"");
  EXPECT_NE(at, std::string::npos) << key << " not in " << json;
  if (at == std::string::npos) return 0;
  at = json.find(':', at);
  return std::stoull(json.substr(at + 1));
}

std::string Stats() {
  char buffer[16384];
  long long length = loom_stats_json(0, buffer, sizeof(buffer));
  EXPECT_GT(length, 0);
  EXPECT_LT(length, static_cast<long long>(sizeof(buffer)));
  return buffer;
}

class TorchMallocTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(loom_configure("backend=fake;device_memory=64MiB;"
                             "granularity=2MiB"),
              0)
        << loom_last_error();
  }
  static void TearDownTestSuite() { EXPECT_EQ(loom_shutdown(), 0); }
};

TEST_F(TorchMallocTest, ServesLikeLoomMalloc) {
  TorchMallocFn malloc_fn = &loom_torch_malloc;
  void* p = malloc_fn(3 * kMiB + 5, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(StatFromJson(Stats(), "allocated_bytes.all.current"),
            static_cast<uint64_t>(3 * kMiB + 5));
  loom_free(p, 3 * kMiB + 5, 0, nullptr);
  EXPECT_EQ(StatFromJson(Stats(), "allocated_bytes.all.current"), 0u);
}

TEST_F(TorchMallocTest, SizeZeroIsNullWithoutThrowing) {
  TorchMallocFn malloc_fn = &loom_torch_malloc;
  void* p = reinterpret_cast<void*>(1);
  EXPECT_NO_THROW(p = malloc_fn(0, 0, nullptr));
  EXPECT_EQ(p, nullptr);
}

TEST_F(TorchMallocTest, OutOfMemoryThrowsPyTorchsWordingAndLosesNothing) {
  TorchMallocFn malloc_fn = &loom_torch_malloc;
  void* held = malloc_fn(8 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  const uint64_t ooms = StatFromJson(Stats(), "num_ooms");
  std::string message;
  try {
    malloc_fn(static_cast<size_t>(1) << 30, 0, nullptr);
    ADD_FAILURE() << "1 GiB on a 64 MiB device did not throw";
  } catch (const std::exception& e) {  // what PyTorch's bindings catch
    message = e.what();
  }
  EXPECT_EQ(message.rfind("CUDA out of memory.", 0), 0u) << message;
  EXPECT_NE(message.find("1073741824 bytes on device 0"), std::string::npos)
      << message;
  const std::string stats = Stats();
  EXPECT_EQ(StatFromJson(stats, "num_ooms"), ooms + 1);
  EXPECT_EQ(StatFromJson(stats, "allocated_bytes.all.current"),
            static_cast<uint64_t>(8 * kMiB));
  // The allocator goes on serving, and what was held is intact.
  void* more = malloc_fn(16 * kMiB, 0, nullptr);
  ASSERT_NE(more, nullptr);
  EXPECT_NE(more, held);
  EXPECT_EQ(loom_check_invariants(0), 0) << loom_last_error();
  loom_free(more, 16 * kMiB, 0, nullptr);
  loom_free(held, 8 * kMiB, 0, nullptr);
}

TEST_F(TorchMallocTest, OtherFailuresThrowLoomsReason) {
  TorchMallocFn malloc_fn = &loom_torch_malloc;
  try {
    malloc_fn(static_cast<size_t>(-7), 0, nullptr);  // ssize_t -7
    ADD_FAILURE() << "a negative size did not throw";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("loom: allocation of -7 bytes", 0), 0u) << message;
    EXPECT_NE(message.find("negative size"), std::string::npos) << message;
  }
  try {
    malloc_fn(kMiB, 5, nullptr);  // the fake backend has one device
    ADD_FAILURE() << "device 5 did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("on device 5"), std::string::npos)
        << e.what();
  }
}

TEST_F(TorchMallocTest, LoomMallocStillReturnsNullWithoutThrowing) {
  void* p = reinterpret_cast<void*>(1);
  EXPECT_NO_THROW(p = loom_malloc(ssize_t{1} << 30, 0, nullptr));
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(loom_last_error()).find("OUT_OF_MEMORY"),
            std::string::npos)
      << loom_last_error();
}

// CUDA graph capture through PyTorch's hook signatures: memory freed inside
// a capture stays the pool's (the graph replays on it) until the pool is
// released, and requests on other streams never get it meanwhile.
TEST_F(TorchMallocTest, GraphPoolKeepsCaptureMemoryUntilReleased) {
  using PoolHook = void (*)(int, std::pair<unsigned long long,
                                           unsigned long long>,
                            std::function<bool(CUstream_st*)>);
  using PoolEnd =
      void (*)(int, std::pair<unsigned long long, unsigned long long>);
  PoolHook begin = &loom_begin_allocate_to_pool;
  PoolEnd end = &loom_end_allocate_to_pool, release = &loom_release_pool;
  auto* capture = reinterpret_cast<CUstream_st*>(0x7e57);
  const std::pair<unsigned long long, unsigned long long> pool{1, 2};
  begin(0, pool, [capture](CUstream_st* s) { return s == capture; });
  void* graph = loom_malloc(4 * kMiB, 0, capture);
  ASSERT_NE(graph, nullptr) << loom_last_error();
  loom_free(graph, 4 * kMiB, 0, capture);
  end(0, pool);
  EXPECT_EQ(StatFromJson(Stats(), "loom.graph_pool_bytes"),
            static_cast<uint64_t>(4 * kMiB));
  // Eager code on the default stream: never the graph's memory.
  void* eager = loom_malloc(4 * kMiB, 0, nullptr);
  ASSERT_NE(eager, nullptr);
  EXPECT_NE(eager, graph);
  loom_free(eager, 4 * kMiB, 0, nullptr);
  // A second capture into the same pool reuses the pool's own memory.
  begin(0, pool, [capture](CUstream_st* s) { return s == capture; });
  void* again = loom_malloc(3 * kMiB, 0, capture);
  EXPECT_EQ(again, graph);
  loom_free(again, 3 * kMiB, 0, capture);
  end(0, pool);
  release(0, pool);
  EXPECT_EQ(StatFromJson(Stats(), "loom.graph_pool_bytes"), 0u);
  EXPECT_EQ(loom_check_invariants(0), 0) << loom_last_error();
  // Releasing an unknown pool is reported, not fatal.
  release(0, {9, 9});
  EXPECT_NE(std::string(loom_last_error()).find("unknown pool"),
            std::string::npos)
      << loom_last_error();
}

}  // namespace
