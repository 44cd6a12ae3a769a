// The stress program's kernels (kernels.h) must report a buffer that
// another writer changed while it was in use, and only then: on the host
// and async backends (stamps through host addresses) and on CUDA (queued
// memsets and copies, here against the stub libcuda).
#include "stress/kernels.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "vmm/driver_factory.h"

namespace loom::stress {
namespace {

class KernelsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    vmm::DriverOptions options;
    options.granularity = 64 << 10;
    options.capacity_per_device = 16 << 20;
    StatusOr<std::unique_ptr<vmm::Driver>> driver =
        vmm::OpenDriver(GetParam(), options);
    if (!driver.ok() && driver.status().message().find(
                            "without CUDA headers") != std::string::npos) {
      GTEST_SKIP() << driver.status().ToString();
    }
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    d_ = std::move(driver).value();
    g_ = *d_->GetGranularity(0, vmm::Granularity::kMinimum);
    va_ = *d_->Reserve(g_);
    h_ = *d_->Create(0, g_);
    ASSERT_TRUE(d_->Map(va_, g_, h_).ok());
    ASSERT_TRUE(d_->SetAccess(va_, g_, 0).ok());
    s1_ = *d_->CreateStream(0);
    s2_ = *d_->CreateStream(0);
    kernels_ = Kernels::For(*d_, /*max_delay_us=*/50,
                            [this](Problem problem, std::string what) {
                              reports_.emplace_back(problem, std::move(what));
                            });
  }
  void TearDown() override {
    if (d_ == nullptr) return;
    kernels_.reset();
    EXPECT_TRUE(d_->DestroyStream(s1_).ok());
    EXPECT_TRUE(d_->DestroyStream(s2_).ok());
    EXPECT_TRUE(d_->Unmap(va_, g_).ok());
    EXPECT_TRUE(d_->Release(h_).ok());
    EXPECT_TRUE(d_->Unreserve(va_, g_).ok());
  }
  Target Buffer(uint64_t stamp) const { return {va_, g_ - 3, stamp, 0}; }

  std::unique_ptr<vmm::Driver> d_;
  uint64_t g_ = 0;
  vmm::DevicePtr va_ = 0;
  vmm::PhysicalHandle h_;
  vmm::Stream s1_ = 0, s2_ = 0;
  std::unique_ptr<Kernels> kernels_;
  std::vector<std::pair<Problem, std::string>> reports_;
};

TEST_P(KernelsTest, ABufferThatKeepsItsStampPasses) {
  kernels_->Produce(s1_, Buffer(7));
  kernels_->Consume(s1_, Buffer(7));
  for (int i = 0; i < 4; ++i) kernels_->Poll();
  kernels_->Drain();
  EXPECT_EQ(kernels_->launched(), 2u);
  EXPECT_TRUE(reports_.empty()) << reports_.front().second;
}

TEST_P(KernelsTest, AnotherWriterWhileInUseIsReported) {
  kernels_->Produce(s1_, Buffer(7));
  ASSERT_TRUE(d_->SynchronizeStream(s1_).ok());
  kernels_->Produce(s2_, Buffer(8));  // another allocation's kernel
  ASSERT_TRUE(d_->SynchronizeStream(s2_).ok());
  kernels_->Consume(s1_, Buffer(7));
  kernels_->Drain();
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0].first, Problem::kCorrupted);
  EXPECT_NE(reports_[0].second.find("buffer 7 at"), std::string::npos)
      << reports_[0].second;
}

// Where kernels are queued (not host: they run at once, on any address).
class QueuedKernelsTest : public KernelsTest {};

TEST_P(QueuedKernelsTest, WorkOnMemoryThatIsNotAccessibleIsAFault) {
  kernels_->Produce(s1_, {va_ + g_, 64, 9, 0});  // beyond the mapping
  kernels_->Consume(s1_, {va_ + g_, 64, 9, 0});
  kernels_->Drain();
  ASSERT_EQ(reports_.size(), 2u);
  EXPECT_EQ(reports_[0].first, Problem::kFault);
  EXPECT_EQ(reports_[1].first, Problem::kFault);
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelsTest,
                         ::testing::Values("host", "async", "cuda"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Backends, QueuedKernelsTest,
                         ::testing::Values("async", "cuda"),
                         [](const auto& info) { return info.param; });

// CUDA's checks run when their stream's work has run: the stub runs it
// only when waited for, and answers the first query "not ready".
TEST(CudaKernelsTest, ChecksRunWhenTheirWorkHasRun) {
  StatusOr<std::unique_ptr<vmm::Driver>> d = vmm::OpenDriver("cuda");
  if (!d.ok() &&
      d.status().message().find("without CUDA headers") != std::string::npos) {
    GTEST_SKIP() << d.status().ToString();
  }
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  vmm::Driver& driver = **d;
  const uint64_t g = *driver.GetGranularity(0, vmm::Granularity::kMinimum);
  const vmm::DevicePtr va = *driver.Reserve(g);
  const vmm::PhysicalHandle h = *driver.Create(0, g);
  ASSERT_TRUE(driver.Map(va, g, h).ok());
  ASSERT_TRUE(driver.SetAccess(va, g, 0).ok());
  std::vector<std::string> reports;
  {
    std::unique_ptr<Kernels> kernels = Kernels::For(
        driver, 0,
        [&](Problem, std::string what) { reports.push_back(std::move(what)); });
    kernels->Produce(0, {va, g, 1, 0});
    kernels->Consume(0, {va, g, 1, 0});
    // Overwritten later in stream order: the check, queued before, must
    // still see its own stamp.
    kernels->Produce(0, {va, g, 2, 0});
    kernels->Poll();  // not ready yet
    EXPECT_EQ(driver.calls(vmm::DriverOp::kQueryEvent), 1u);
    kernels->Poll();  // now run, and checked
    kernels->Poll();  // nothing left
    EXPECT_EQ(driver.calls(vmm::DriverOp::kQueryEvent), 2u);
    EXPECT_TRUE(reports.empty()) << reports.front();
  }
  ASSERT_TRUE(driver.SynchronizeDevice(0).ok());
  ASSERT_TRUE(driver.Unmap(va, g).ok());
  ASSERT_TRUE(driver.Release(h).ok());
  ASSERT_TRUE(driver.Unreserve(va, g).ok());
}

}  // namespace
}  // namespace loom::stress
