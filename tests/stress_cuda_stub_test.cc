// `loom stress --backend cuda` without a GPU: the stress program's CUDA
// kernels (queued memsets and copies checked when their stream gets there,
// stress/kernels.h) through loom's CUDA backend against the stub libcuda
// (vmm/testing/cuda_stub.h, two devices here), whose streams run queued work
// only when something waits for it. The same program as on the async
// backend, in pages of the device's size.
#include <gtest/gtest.h>

#include <string>

#include "stress/stress.h"

namespace loom::stress {
namespace {

struct Case {
  std::string name;
  uint64_t seed;
  int streams;
  int threads;
  int devices;
  bool plan;
  bool graphs;
};

class CudaStressTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaStressTest, NoFaultNoCorruptionNoSharedByte) {
  const Case& c = GetParam();
  StressOptions o;
  o.backend = "cuda";
  o.seed = c.seed;
  o.streams = c.streams;
  o.threads = c.threads;
  o.devices = c.devices;
  o.plan = c.plan;
  o.graphs = c.graphs;
  o.max_ops = 2500;
  o.seconds = 120;
  StatusOr<StressReport> r = RunStress(o);
  if (!r.ok() &&
      r.status().message().find("without CUDA headers") != std::string::npos) {
    GTEST_SKIP() << r.status().ToString();
  }
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok()) << r->Summary();
  EXPECT_GT(r->kernels, 1000u);
  if (c.streams > 1) EXPECT_GT(r->cross_stream_uses, 0u);
  if (c.graphs) EXPECT_GT(r->graph_captures, 0u);
  if (c.plan) EXPECT_EQ(r->plans_installed, static_cast<uint64_t>(c.devices));
  // The async backend's program in 2 MiB pages: 192 pages of cap, requests
  // of up to 16 pages.
  EXPECT_EQ(r->granularity, uint64_t{2} << 20);
  EXPECT_EQ(r->cap_bytes, uint64_t{384} << 20);
  EXPECT_EQ(r->max_request, uint64_t{32} << 20);
}

INSTANTIATE_TEST_SUITE_P(
    Stub, CudaStressTest,
    ::testing::Values(Case{"all_seed1", 1, 3, 2, 1, true, true},
                      Case{"all_seed2", 2, 3, 2, 1, true, true},
                      Case{"streams_seed3", 3, 3, 2, 1, false, false},
                      Case{"one_stream_seed1", 1, 1, 1, 1, true, false},
                      Case{"two_devices_seed3", 3, 3, 2, 2, true, true},
                      // Corrupted 13 buffers while the harness recorded
                      // events of one device on the default stream for
                      // another's memory (the wait ordered nothing).
                      Case{"two_devices_one_thread_seed4", 4, 3, 1, 2, true,
                           true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(CudaStressOptionsTest, MoreDevicesThanPresentAreRefused) {
  StressOptions o;
  o.backend = "cuda";
  o.devices = 3;  // the stub has 2 here
  o.max_ops = 10;
  StatusOr<StressReport> r = RunStress(o);
  if (!r.ok() &&
      r.status().message().find("without CUDA headers") != std::string::npos) {
    GTEST_SKIP() << r.status().ToString();
  }
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("3 devices asked, 2 present"),
            std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace loom::stress
