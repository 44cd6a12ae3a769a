#include "vmm/cuda_driver.h"

#include <gtest/gtest.h>

#include "vmm/driver_factory.h"

namespace loom::vmm {
namespace {

// Without a GPU, opening the CUDA driver fails cleanly (never aborts) with a
// message that says so; with one, it reports a sane driver version.
TEST(CudaDriverTest, OpensOrSaysWhyNot) {
  StatusOr<std::unique_ptr<CudaDriver>> driver = CudaDriver::Open();
  if (!driver.ok()) {
    EXPECT_EQ(driver.status().code(), StatusCode::kUnavailable);
    const std::string& message = driver.status().message();
    EXPECT_TRUE(message.find("no CUDA driver") != std::string::npos ||
                message.find("no CUDA device") != std::string::npos)
        << message;
    GTEST_SKIP() << "no GPU here: " << message;
  }
  EXPECT_GE((*driver)->driver_version(), 11030);
  EXPECT_EQ((*driver)->name(), "cuda");
}

TEST(DriverFactoryTest, OpensEachBackendByName) {
  DriverOptions options;
  options.granularity = 64 << 10;
  options.capacity_per_device = 1 << 20;
  for (std::string_view name : {"host", "fake"}) {
    StatusOr<std::unique_ptr<Driver>> d = OpenDriver(name, options);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ((*d)->name(), name);
    EXPECT_EQ(*(*d)->GetGranularity(0, Granularity::kMinimum), 64u << 10);
  }
  EXPECT_EQ(OpenDriver("tpu").status().code(), StatusCode::kInvalidArgument);
  options.granularity = 100;
  EXPECT_FALSE(OpenDriver("fake", options).ok());
  EXPECT_FALSE(OpenDriver("host", options).ok());
}

}  // namespace
}  // namespace loom::vmm
