// The CUDA backend against the stub libcuda (vmm/testing/cuda_stub.h), no
// GPU needed: every entry point must be called through the ABI of the
// version it was resolved at, with or without a context current on the
// calling thread (PyTorch's training thread has its primary context
// current; a thread that never touched CUDA has none), and every call must
// leave the caller's context as it found it.
//
// On 2026-11-26 loom resolved every entry point at CUDA_VERSION (13000),
// got cuCtxSynchronize_v2(CUcontext) and cuCtxGetDevice_v2(CUdevice*,
// CUcontext) and called them without the context: loom_load_plan failed on
// an H200 with CUDA_ERROR_CONTEXT_IS_DESTROYED. These tests fail that way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "vmm/cuda_driver.h"
#include "vmm/testing/cuda_stub_client.h"

namespace loom::vmm {
namespace {

using testing::CudaStub;

// The functions the CUDA backend calls, by the stub's variant names: the
// signatures cuda_driver.cc is written against (docs/driver_contract.md).
const std::set<std::string>& AbiLoomCalls() {
  static const std::set<std::string> variants = {
      "cuGetProcAddress_v2",
      "cuInit",
      "cuDriverGetVersion",
      "cuDeviceGetCount",
      "cuDeviceGet",
      "cuDeviceGetName",
      "cuDeviceTotalMem_v2",
      "cuDevicePrimaryCtxRetain",
      "cuDevicePrimaryCtxRelease_v2",
      "cuCtxGetCurrent",
      "cuCtxSetCurrent",
      "cuCtxGetDevice",
      "cuCtxSynchronize",
      "cuDeviceCanAccessPeer",
      "cuMemGetInfo_v2",
      "cuMemGetAllocationGranularity",
      "cuMemCreate",
      "cuMemRelease",
      "cuMemAddressReserve",
      "cuMemAddressFree",
      "cuMemMap",
      "cuMemUnmap",
      "cuMemSetAccess",
      "cuStreamCreate",
      "cuStreamDestroy_v2",
      "cuStreamSynchronize",
      "cuEventCreate",
      "cuEventDestroy_v2",
      "cuEventRecord",
      "cuEventQuery",
      "cuEventSynchronize",
      "cuStreamWaitEvent",
      "cuMemcpyHtoD_v2",
      "cuMemcpyDtoH_v2",
      "cuMemsetD8_v2",
      "cuMemsetD8Async",
      "cuMemcpyDtoHAsync_v2",
  };
  return variants;
}

class CudaDriverOnStubTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef LOOM_NO_CUDA_HEADERS
    GTEST_SKIP() << "built without CUDA headers: the stub libcuda is empty";
#endif
    StatusOr<CudaStub*> stub = CudaStub::Get();
    ASSERT_TRUE(stub.ok()) << stub.status().ToString();
    stub_ = *stub;
    stub_->Clear();
    stub_->SetLogging(true);
    StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Open();
    if (!driver.ok() && driver.status().message().find(
                            "without CUDA headers") != std::string::npos) {
      GTEST_SKIP() << driver.status().ToString();
    }
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    driver_ = std::move(driver).value();
  }

  void TearDown() override {
    if (stub_ == nullptr) return;  // skipped
    driver_.reset();
    stub_->SetLogging(false);
    const CudaStub::Live live = stub_->live();
    EXPECT_EQ(live.handles, 0u);
    EXPECT_EQ(live.reservations, 0u);
    EXPECT_EQ(live.mappings, 0u);
    EXPECT_EQ(live.streams, 0u);
    EXPECT_EQ(live.events, 0u);
    EXPECT_EQ(live.primary_retains, 0u) << "a primary context leaked";
  }

  // Every backend call once, on device 0; the calling thread's context must
  // be the same after each.
  void ExerciseEverything() {
    Driver& d = *driver_;
    void* const context = stub_->Current();
    auto same_context = [&](const char* after) {
      EXPECT_EQ(stub_->Current(), context) << "context changed by " << after;
    };
    StatusOr<DeviceProperties> p = d.Properties(0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->name, "loom stub GPU 0");
    EXPECT_EQ(p->total_bytes, uint64_t{80} << 30);
    EXPECT_EQ(p->free_bytes, p->total_bytes);
    EXPECT_EQ(p->granularity_minimum, uint64_t{2} << 20);
    same_context("Properties");
    const uint64_t g = p->granularity_minimum;
    StatusOr<PhysicalHandle> h = d.Create(0, 2 * g);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    StatusOr<DevicePtr> va = d.Reserve(4 * g);
    ASSERT_TRUE(va.ok()) << va.status().ToString();
    ASSERT_TRUE(d.Map(*va, 2 * g, *h).ok());
    ASSERT_TRUE(d.SetAccess(*va, 2 * g, 0).ok());
    same_context("Create/Reserve/Map/SetAccess");
    ASSERT_TRUE(d.Memset(*va, 0x5A, 2 * g).ok());
    const char text[] = "through the stub";
    ASSERT_TRUE(d.CopyToDevice(*va + g + 3, text, sizeof(text)).ok());
    char back[sizeof(text)] = {};
    ASSERT_TRUE(d.CopyToHost(back, *va + g + 3, sizeof(back)).ok());
    EXPECT_STREQ(back, text);
    uint8_t byte = 0;
    ASSERT_TRUE(d.CopyToHost(&byte, *va + 2 * g - 1, 1).ok());
    EXPECT_EQ(byte, 0x5A);
    same_context("copies");
    StatusOr<Stream> s = d.CreateStream(0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    StatusOr<Event> e = d.CreateEvent(0);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_TRUE(d.MemsetAsync(*va + g, 0x77, g, *s).ok());
    uint8_t queued = 0;
    ASSERT_TRUE(d.CopyToHostAsync(&queued, *va + g, 1, *s).ok());
    ASSERT_TRUE(d.RecordEvent(*e, *s).ok());
    ASSERT_TRUE(d.StreamWaitEvent(0, *e).ok());
    EXPECT_EQ(queued, 0) << "queued work ran before anything waited for it";
    StatusOr<bool> done = d.QueryEvent(*e);  // the stub: not yet
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_FALSE(*done);
    ASSERT_TRUE(d.SynchronizeEvent(*e).ok());
    EXPECT_EQ(queued, 0x77);
    done = d.QueryEvent(*e);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_TRUE(*done);
    ASSERT_TRUE(d.SynchronizeStream(*s).ok());
    ASSERT_TRUE(d.SynchronizeStream(0).ok());
    Status synced = d.SynchronizeDevice(0);
    EXPECT_TRUE(synced.ok()) << synced.ToString();
    same_context("streams and events");
    StatusOr<bool> peer = d.CanAccessPeer(0, 0);
    ASSERT_TRUE(peer.ok());
    EXPECT_FALSE(*peer);
    ASSERT_TRUE(d.DestroyEvent(*e).ok());
    ASSERT_TRUE(d.DestroyStream(*s).ok());
    ASSERT_TRUE(d.Unmap(*va, 2 * g).ok());
    ASSERT_TRUE(d.Release(*h).ok());
    ASSERT_TRUE(d.Unreserve(*va, 4 * g).ok());
    same_context("Unmap/Release/Unreserve");
  }

  // What the stub saw that the code did not mean: variants outside the ABI
  // loom calls, and its problems.
  void ExpectOnlyTheAbiLoomCalls() {
    for (const auto& [variant, n] : stub_->Counts()) {
      EXPECT_TRUE(AbiLoomCalls().contains(variant))
          << variant << " called " << n
          << " times: an entry point resolved at a version whose signature "
             "the code does not use";
    }
    for (const std::string& problem : stub_->Problems()) {
      ADD_FAILURE() << "stub: " << problem;
    }
  }

  CudaStub* stub_ = nullptr;
  std::unique_ptr<CudaDriver> driver_;
};

TEST_F(CudaDriverOnStubTest, ResolvesEachEntryPointAtAVersionItsCallsMatch) {
  // Resolved at Open, each once, for the legacy default stream.
  int resolved = 0;
  for (const std::string& line : stub_->Log()) {
    if (line.rfind("cuGetProcAddress", 0) != 0) continue;
    ++resolved;
    EXPECT_NE(line.find(", 1) -> CUDA_SUCCESS"), std::string::npos) << line;
  }
  EXPECT_GE(resolved, 34);
  EXPECT_EQ(driver_->driver_version(), 13000);
  ExerciseEverything();
  ExpectOnlyTheAbiLoomCalls();
}

// A thread that never touched CUDA (loom.enable in plan mode, a harness
// thread): the device's primary context is made current for each call and
// the thread is left without one.
TEST_F(CudaDriverOnStubTest, WorksWithNoContextCurrent) {
  ASSERT_EQ(stub_->Current(), nullptr);
  ExerciseEverything();
  EXPECT_EQ(stub_->Current(), nullptr);
  EXPECT_GE(stub_->Count("cuCtxSynchronize"), 1u);
  ExpectOnlyTheAbiLoomCalls();
}

// PyTorch's training thread: its primary context is current (the CUDA
// runtime retained it); loom uses it as it is.
TEST_F(CudaDriverOnStubTest, WorksWithPyTorchsContextCurrent) {
  void* primary = stub_->RetainPrimary(0);
  stub_->SetCurrent(primary);
  stub_->Clear();
  ExerciseEverything();
  EXPECT_EQ(stub_->Current(), primary);
  EXPECT_GE(stub_->Count("cuCtxGetDevice"), 1u);
  EXPECT_GE(stub_->Count("cuCtxSynchronize"), 1u);
  ExpectOnlyTheAbiLoomCalls();
  stub_->SetCurrent(nullptr);
  stub_->ReleasePrimary(0);
}

TEST_F(CudaDriverOnStubTest, ALibraryThatIsNotThereIsNoCudaDriver) {
  StatusOr<std::unique_ptr<CudaDriver>> missing =
      CudaDriver::Open("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(missing.status().message().find(
                "no CUDA driver: cannot load /nonexistent/libcuda.so.1"),
            std::string::npos)
      << missing.status().ToString();
}

}  // namespace
}  // namespace loom::vmm
