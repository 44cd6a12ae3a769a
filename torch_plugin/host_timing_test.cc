// The C ABI's instruments: sampled host time of loom_malloc / loom_free /
// loom_record_stream, and the settings that choose the sampling and the
// physical layout (max_chunk_pages) and the arena's stitching (stitch),
// seen through loom_stats_json.
#include "torch_plugin/host_timing.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "torch_plugin/loom_c_api.h"

namespace {

constexpr ssize_t kMiB = ssize_t{1} << 20;

uint64_t StatFromJson(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\"");
  EXPECT_NE(at, std::string::npos) << key << " not in " << json;
  if (at == std::string::npos) return 0;
  at = json.find(':', at);
  return std::stoull(json.substr(at + 1));
}

std::string Stats() {
  std::string buffer(1 << 16, '\0');
  long long length = loom_stats_json(0, buffer.data(), buffer.size());
  EXPECT_GT(length, 0);
  EXPECT_LT(length, static_cast<long long>(buffer.size()));
  buffer.resize(length > 0 ? static_cast<size_t>(length) : 0);
  return buffer;
}

class HostTimingTest : public ::testing::Test {
 protected:
  void SetUp() override { loom::plugin::HostTiming::Get().Reset(); }
  void TearDown() override {
    EXPECT_EQ(loom_shutdown(), 0) << loom_last_error();
  }
};

TEST_F(HostTimingTest, OneCallInNIsTimed) {
  ASSERT_EQ(loom_configure("backend=fake;device_memory=64MiB;"
                           "granularity=2MiB;host_sample_every=4"),
            0)
      << loom_last_error();
  for (int i = 0; i < 100; ++i) {
    void* p = loom_malloc(kMiB, 0, nullptr);
    ASSERT_NE(p, nullptr);
    loom_free(p, kMiB, 0, nullptr);
  }
  const std::string json = Stats();
  EXPECT_EQ(StatFromJson(json, "loom.host.sample_every"), 4u);
  EXPECT_EQ(StatFromJson(json, "loom.host.malloc.calls"), 100u);
  EXPECT_EQ(StatFromJson(json, "loom.host.malloc.samples"), 25u);
  EXPECT_EQ(StatFromJson(json, "loom.host.free.calls"), 100u);
  EXPECT_EQ(StatFromJson(json, "loom.host.free.samples"), 25u);
  EXPECT_GT(StatFromJson(json, "loom.host.malloc.sampled_ns"), 0u);
  EXPECT_EQ(StatFromJson(json, "loom.host.malloc.mean_ns"),
            StatFromJson(json, "loom.host.malloc.sampled_ns") / 25);
  EXPECT_EQ(StatFromJson(json, "loom.host.record_stream.calls"), 0u);
}

TEST_F(HostTimingTest, ZeroTimesNothing) {
  ASSERT_EQ(loom_configure("backend=fake;device_memory=64MiB;"
                           "host_sample_every=0"),
            0)
      << loom_last_error();
  for (int i = 0; i < 10; ++i) {
    void* p = loom_malloc(kMiB, 0, nullptr);
    loom_free(p, kMiB, 0, nullptr);
  }
  const std::string json = Stats();
  EXPECT_EQ(StatFromJson(json, "loom.host.malloc.calls"), 10u);
  EXPECT_EQ(StatFromJson(json, "loom.host.malloc.samples"), 0u);
  EXPECT_EQ(StatFromJson(json, "loom.host.malloc.mean_ns"), 0u);
}

TEST_F(HostTimingTest, BadSettingsAreRefusedAndChangeNothing) {
  // Settings persist from one configure call to the next.
  ASSERT_EQ(loom_configure("host_sample_every=8"), 0);
  for (const char* bad : {"host_sample_every=3", "host_sample_every=-1",
                          "host_sample_every=2097152", "host_sample_every=x",
                          "max_chunk_pages=0", "max_chunk_pages=513",
                          "max_chunk_pages=1.5", "stitch=2", "stitch=yes"}) {
    EXPECT_EQ(loom_configure(bad), 1) << bad;  // INVALID_ARGUMENT
    const std::string error = loom_last_error();
    const std::string key(bad, std::string_view(bad).find('='));
    EXPECT_NE(error.find(key.substr(0, 10)), std::string::npos) << error;
  }
  ASSERT_EQ(loom_configure("backend=fake;device_memory=64MiB"), 0);
  void* p = loom_malloc(kMiB, 0, nullptr);
  loom_free(p, kMiB, 0, nullptr);
  EXPECT_EQ(StatFromJson(Stats(), "loom.host.sample_every"), 8u);
}

TEST_F(HostTimingTest, MaxChunkPagesShapesTheHandles) {
  ASSERT_EQ(loom_configure("backend=fake;device_memory=64MiB;"
                           "granularity=2MiB;max_chunk_pages=1"),
            0)
      << loom_last_error();
  void* p = loom_malloc(7 * kMiB, 0, nullptr);  // 4 granules
  ASSERT_NE(p, nullptr);
  std::string json = Stats();
  EXPECT_EQ(StatFromJson(json, "loom.layout.handles"), 4u);
  EXPECT_EQ(StatFromJson(json, "loom.layout.mappings"), 4u);
  EXPECT_EQ(StatFromJson(json, "loom.layout.handle_size.2MiB.handles"), 4u);
  loom_free(p, 7 * kMiB, 0, nullptr);
  ASSERT_EQ(loom_shutdown(), 0);
  ASSERT_EQ(loom_configure("max_chunk_pages=512"), 0);
  p = loom_malloc(7 * kMiB, 0, nullptr);
  json = Stats();
  EXPECT_EQ(StatFromJson(json, "loom.layout.handles"), 1u);
  EXPECT_EQ(StatFromJson(json, "loom.layout.handle_size.8MiB.bytes"),
            uint64_t{8} << 20);
  loom_free(p, 7 * kMiB, 0, nullptr);
}

// stitch=1 (the default): from the second iteration on, a request that
// would grow the pool past its peak gets idle chunks mapped a second time;
// stitch=0: the pool grows.
TEST_F(HostTimingTest, TheStitchSettingReachesTheArena) {
  for (const bool stitch : {true, false}) {
    ASSERT_EQ(loom_configure(stitch ? "backend=fake;device_memory=1GiB;"
                                      "granularity=2MiB;stitch=1"
                                    : "stitch=0"),
              0)
        << loom_last_error();
    ASSERT_EQ(loom_init_device(0), 0) << loom_last_error();  // sees markers
    loom_iteration_begin(0);
    loom_iteration_end(0);
    loom_iteration_begin(1);
    void* x = loom_malloc(32 * kMiB, 0, nullptr);  // two 16 MiB chunks
    void* y = loom_malloc(kMiB, 0, nullptr);       // keeps x's place apart
    ASSERT_NE(x, nullptr);
    ASSERT_NE(y, nullptr);
    loom_free(x, 32 * kMiB, 0, nullptr);
    void* z = loom_malloc(48 * kMiB, 0, nullptr);  // does not fit x's place
    ASSERT_NE(z, nullptr);
    const std::string json = Stats();
    EXPECT_EQ(StatFromJson(json, "loom.stitched_pages"), stitch ? 16u : 0u);
    EXPECT_EQ(StatFromJson(json, "reserved_bytes.all.peak"),
              (stitch ? uint64_t{50} : uint64_t{82}) << 20);
    loom_free(z, 48 * kMiB, 0, nullptr);
    loom_free(y, kMiB, 0, nullptr);
    loom_iteration_end(1);
    ASSERT_EQ(loom_shutdown(), 0) << loom_last_error();
  }
  ASSERT_EQ(loom_configure("stitch=1"), 0);
}

}  // namespace
