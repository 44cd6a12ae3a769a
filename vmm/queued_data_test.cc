// The queued data operations (Driver::MemsetAsync, CopyToHostAsync) on
// every backend: checked against the contract like the synchronous ones,
// in stream order, done once an event recorded after them completes. The
// CUDA backend runs against the stub libcuda (LOOM_LIBCUDA), whose streams
// run queued work only when something waits for it, or on a GPU (in the
// GPU recipe, tests/gpu/run_gpu.sh).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "vmm/async_host_driver.h"
#include "vmm/cuda_driver.h"
#include "vmm/driver.h"
#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kHostGranularity = 64 << 10;

StatusOr<std::unique_ptr<Driver>> Make(std::string_view backend) {
  HostDriverOptions host;
  host.granularity = kHostGranularity;
  host.capacity_per_device = 64 * kHostGranularity;
  if (backend == "fake") {
    FakeDriverOptions fake;
    fake.granularity = kHostGranularity;
    fake.capacity_per_device = 64 * kHostGranularity;
    return std::unique_ptr<Driver>(std::make_unique<FakeDriver>(fake));
  }
  if (backend == "host") {
    LOOM_ASSIGN_OR_RETURN(auto d, HostDriver::Open(host));
    return std::unique_ptr<Driver>(std::move(d));
  }
  if (backend == "async") {
    LOOM_ASSIGN_OR_RETURN(auto d, AsyncHostDriver::Open(host));
    return std::unique_ptr<Driver>(std::move(d));
  }
  LOOM_ASSIGN_OR_RETURN(auto d, CudaDriver::Open());
  return std::unique_ptr<Driver>(std::move(d));
}

class QueuedDataTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<Driver>> driver = Make(GetParam());
    if (!driver.ok() && driver.status().message().find(
                            "without CUDA headers") != std::string::npos) {
      GTEST_SKIP() << driver.status().ToString();
    }
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    d_ = std::move(driver).value();
    g_ = *d_->GetGranularity(0, Granularity::kMinimum);
    va_ = *d_->Reserve(2 * g_);
    h_ = *d_->Create(0, g_);
    ASSERT_TRUE(d_->Map(va_, g_, h_).ok());
  }
  void TearDown() override {
    if (d_ == nullptr) return;
    EXPECT_TRUE(d_->Unmap(va_, g_).ok());
    EXPECT_TRUE(d_->Release(h_).ok());
    EXPECT_TRUE(d_->Unreserve(va_, 2 * g_).ok());
  }

  std::unique_ptr<Driver> d_;
  uint64_t g_ = 0;
  DevicePtr va_ = 0;
  PhysicalHandle h_;
};

TEST_P(QueuedDataTest, RangesAreCheckedLikeTheSynchronousCalls) {
  Driver& d = *d_;
  uint8_t byte = 0;
  // Mapped, not yet accessible; then beyond the mapping.
  EXPECT_EQ(d.MemsetAsync(va_, 1, g_, 0).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.CopyToHostAsync(&byte, va_, 1, 0).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(d.SetAccess(va_, g_, 0).ok());
  EXPECT_EQ(d.MemsetAsync(va_ + g_ - 1, 1, 2, 0).code(),
            StatusCode::kInvalidArgument);  // its last byte is not mapped
  EXPECT_EQ(d.CopyToHostAsync(&byte, va_ + g_, 1, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.CopyToHostAsync(nullptr, va_, 1, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.calls(DriverOp::kMemsetAsync), 0u);
  EXPECT_EQ(d.calls(DriverOp::kCopyToHostAsync), 0u);
}

TEST_P(QueuedDataTest, RunInStreamOrderAndDoneWithTheirEvent) {
  Driver& d = *d_;
  ASSERT_TRUE(d.SetAccess(va_, g_, 0).ok());
  StatusOr<Stream> stream = d.CreateStream(0);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  StatusOr<Event> event = d.CreateEvent(0);
  ASSERT_TRUE(event.ok());
  std::vector<uint8_t> back(g_, 0);
  ASSERT_TRUE(d.MemsetAsync(va_, 0x11, g_, *stream).ok());
  ASSERT_TRUE(d.MemsetAsync(va_ + 100, 0x22, 50, *stream).ok());
  ASSERT_TRUE(d.CopyToHostAsync(back.data(), va_, g_, *stream).ok());
  ASSERT_TRUE(d.RecordEvent(*event, *stream).ok());
  StatusOr<DeviceProperties> device = d.Properties(0);
  ASSERT_TRUE(device.ok());
  if (device->name.starts_with("loom stub")) {
    // The stub libcuda runs queued work only when waited for: not yet (a
    // GPU may well have done it already).
    EXPECT_EQ(back[0], 0);
  }
  ASSERT_TRUE(d.SynchronizeEvent(*event).ok());
  StatusOr<bool> done = d.QueryEvent(*event);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  if (d.holds_data()) {
    EXPECT_EQ(back[0], 0x11);
    EXPECT_EQ(back[99], 0x11);
    EXPECT_EQ(back[100], 0x22);
    EXPECT_EQ(back[149], 0x22);
    EXPECT_EQ(back[150], 0x11);
    EXPECT_EQ(back[g_ - 1], 0x11);
  }
  EXPECT_EQ(d.calls(DriverOp::kMemsetAsync), 2u);
  EXPECT_EQ(d.calls(DriverOp::kCopyToHostAsync), 1u);
  // The default stream too; the device synchronisation waits for it.
  ASSERT_TRUE(d.MemsetAsync(va_, 0x33, 8, 0).ok());
  ASSERT_TRUE(d.CopyToHostAsync(back.data(), va_, 8, 0).ok());
  ASSERT_TRUE(d.SynchronizeDevice(0).ok());
  if (d.holds_data()) EXPECT_EQ(back[7], 0x33);
  ASSERT_TRUE(d.DestroyEvent(*event).ok());
  ASSERT_TRUE(d.DestroyStream(*stream).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, QueuedDataTest,
                         ::testing::Values("fake", "host", "async", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::vmm
