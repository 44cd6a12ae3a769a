// Plans installed through libloom's C ABI on the CUDA backend, against the
// stub libcuda (vmm/testing/cuda_stub.h; LOOM_LIBCUDA names it), in the two
// situations of a real run:
//  - auto mode: recorded, planned and installed mid-run (loom_load_plan) on
//    the training thread, where PyTorch's primary context is current;
//  - plan mode: installed at enable (loom_init_device with plan=...), before
//    anything touched CUDA on that thread: no context current.
// Every driver call must succeed through the ABI loom resolved (on the H200
// the first case failed: cuCtxSynchronize, CUDA_ERROR_CONTEXT_IS_DESTROYED)
// and leave the thread's context as it was; the plan must then serve.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "torch_plugin/loom_c_api.h"
#include "vmm/testing/cuda_stub_client.h"

namespace {

using loom::vmm::testing::CudaStub;

constexpr ssize_t kMiB = ssize_t{1} << 20;

uint64_t Stat(const std::string& key) {
  std::string json(loom_stats_json(0, nullptr, 0) + 64, '\0');
  loom_stats_json(0, json.data(), json.size());
  size_t at = json.find("\"" + key + "\"");
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return 0;
  return std::stoull(json.substr(json.find(':', at) + 1));
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// A training loop through the C ABI: weights allocated once, then per
// iteration activations freed out of order and a workspace.
class Loop {
 public:
  Loop() {
    for (int i = 0; i < 3; ++i) weights_.push_back(Malloc(6 * kMiB));
  }
  ~Loop() {
    for (void* w : weights_) loom_free(w, 0, 0, nullptr);
  }
  void Iteration(long long number) {
    loom_iteration_begin(number);
    std::vector<void*> live;
    for (ssize_t size :
         {4 * kMiB, 2 * kMiB + 4096, kMiB / 2, 3 * kMiB, 8 * kMiB, 1 * kMiB}) {
      live.push_back(Malloc(size));
    }
    loom_free(live[1], 0, 0, nullptr);
    void* workspace = Malloc(5 * kMiB);
    loom_free(workspace, 0, 0, nullptr);
    for (size_t i = live.size(); i-- > 0;) {
      if (i != 1) loom_free(live[i], 0, 0, nullptr);
    }
    loom_iteration_end(number);
  }

 private:
  static void* Malloc(ssize_t size) {
    void* p = loom_malloc(size, 0, nullptr);
    EXPECT_NE(p, nullptr) << loom_last_error();
    return p;
  }
  std::vector<void*> weights_;
};

class CApiOnCudaStubTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef LOOM_NO_CUDA_HEADERS
    GTEST_SKIP() << "built without CUDA headers: the stub libcuda is empty";
#endif
    loom::StatusOr<CudaStub*> stub = CudaStub::Get();
    ASSERT_TRUE(stub.ok()) << stub.status().ToString();
    stub_ = *stub;
    stub_->Clear();
  }
  void TearDown() override {
    if (stub_ == nullptr) return;  // skipped
    EXPECT_EQ(loom_shutdown(), 0) << loom_last_error();
    const CudaStub::Live live = stub_->live();
    EXPECT_EQ(live.handles, 0u);
    EXPECT_EQ(live.mappings, 0u);
    EXPECT_EQ(live.reservations, 0u);
    for (const std::string& problem : stub_->Problems()) {
      ADD_FAILURE() << "stub: " << problem;
    }
    for (const char* wrong : {"cuCtxSynchronize_v2", "cuCtxGetDevice_v2"}) {
      EXPECT_EQ(stub_->Count(wrong), 0u) << wrong;
    }
  }

  // Records `iterations` on the CUDA backend and plans them: the plan file.
  std::string RecordAndPlan(int iterations) {
    const std::string trace = TempPath("recorded.ltb");
    const std::string plan = TempPath("recorded.lplan");
    EXPECT_EQ(loom_configure("backend=cuda;record=100000"), 0)
        << loom_last_error();
    {
      Loop loop;
      for (int i = 1; i <= iterations; ++i) loop.Iteration(i);
      EXPECT_EQ(loom_write_trace(0, trace.c_str()), 0) << loom_last_error();
    }
    EXPECT_EQ(loom_shutdown(), 0) << loom_last_error();
    EXPECT_EQ(loom_plan_trace(trace.c_str(), plan.c_str(), "time_limit=1"), 0)
        << loom_last_error();
    return plan;
  }

  CudaStub* stub_ = nullptr;
};

TEST_F(CApiOnCudaStubTest, AutoModeInstallsMidRunWithPyTorchsContextCurrent) {
  // PyTorch's side: the CUDA runtime retained the primary context and made
  // it current on the training thread.
  void* primary = stub_->RetainPrimary(0);
  stub_->SetCurrent(primary);
  const std::string trace = TempPath("auto.ltb");
  const std::string plan = TempPath("auto.lplan");
  ASSERT_EQ(loom_configure("backend=cuda;record=100000"), 0)
      << loom_last_error();
  {
    Loop loop;
    for (int i = 1; i <= 3; ++i) loop.Iteration(i);
    // The switch, as auto mode makes it at an iteration boundary.
    ASSERT_EQ(loom_write_trace(0, trace.c_str()), 0) << loom_last_error();
    ASSERT_EQ(loom_plan_trace(trace.c_str(), plan.c_str(), "time_limit=1"), 0)
        << loom_last_error();
    const uint64_t syncs = stub_->Count("cuCtxSynchronize");
    ASSERT_EQ(loom_load_plan(0, plan.c_str()), 0) << loom_last_error();
    // Installing waited for the device (the call that failed on the H200).
    EXPECT_GT(stub_->Count("cuCtxSynchronize"), syncs);
    EXPECT_EQ(loom_stop_recording(), 0);
    EXPECT_EQ(stub_->Current(), primary) << "loom changed PyTorch's context";
    for (int i = 4; i <= 6; ++i) loop.Iteration(i);
    EXPECT_GT(Stat("loom.plan_hits"), 0u);
    EXPECT_EQ(loom_check_invariants(0), 0) << loom_last_error();
  }
  EXPECT_EQ(stub_->Current(), primary);
  ASSERT_EQ(loom_shutdown(), 0) << loom_last_error();
  stub_->SetCurrent(nullptr);
  stub_->ReleasePrimary(0);
  EXPECT_EQ(stub_->live().primary_retains, 0u);
}

TEST_F(CApiOnCudaStubTest, PlanModeInstallsAtEnableWithNoContext) {
  const std::string plan = RecordAndPlan(3);
  // A thread that never touched CUDA, as loom.enable() runs first thing.
  std::thread enable([&] {
    ASSERT_EQ(stub_->Current(), nullptr);
    ASSERT_EQ(loom_configure(("backend=cuda;plan=" + plan).c_str()), 0)
        << loom_last_error();
    ASSERT_EQ(loom_init_device(0), 0) << loom_last_error();
    EXPECT_EQ(stub_->Current(), nullptr) << "loom left a context current";
  });
  enable.join();
  {
    Loop loop;
    for (int i = 1; i <= 3; ++i) loop.Iteration(i);
    EXPECT_GT(Stat("loom.plan_hits"), 0u);
  }
  EXPECT_EQ(loom_check_invariants(0), 0) << loom_last_error();
  EXPECT_EQ(stub_->Current(), nullptr);
}

}  // namespace
