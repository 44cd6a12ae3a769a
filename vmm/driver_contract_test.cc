#include "vmm/driver_contract.h"

#include <gtest/gtest.h>

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 4096;

TEST(DriverContractTest, TracksHandlesReservationsAndMappings) {
  DriverContract c;
  ASSERT_TRUE(c.CheckCreate(0, kG, kG).ok());
  c.OnCreate(7, 0, kG);
  c.OnCreate(8, 0, kG);
  ASSERT_TRUE(c.CheckReserve(8 * kG, 0, kG).ok());
  c.OnReserve(100 * kG, 8 * kG);
  // Whole handles only: an offset, or part of a handle, is refused.
  EXPECT_EQ(c.CheckMap(101 * kG, kG, 7, kG, kG).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(c.CheckMap(101 * kG, 2 * kG, 7, 0, kG).code(),
            StatusCode::kUnimplemented);
  ASSERT_TRUE(c.CheckMap(101 * kG, kG, 7, 0, kG).ok());
  c.OnMap(101 * kG, kG, 7, 0);
  ASSERT_TRUE(c.CheckMap(102 * kG, kG, 8, 0, kG).ok());
  c.OnMap(102 * kG, kG, 8, 0);
  // One handle at a second address (an alias) is allowed.
  ASSERT_TRUE(c.CheckMap(104 * kG, kG, 7, 0, kG).ok());
  c.OnMap(104 * kG, kG, 7, 0);
  c.CheckInvariants();
  ContractCounts counts = c.counts();
  EXPECT_EQ(counts.mappings, 3u);
  EXPECT_EQ(counts.mapped_bytes, 3 * kG);
  EXPECT_EQ(counts.handle_bytes, 2 * kG);
  // Access is granted per whole mapping; copies need it everywhere.
  EXPECT_EQ(c.CheckAccessible(101 * kG, 2 * kG).code(),
            StatusCode::kFailedPrecondition);
  c.OnSetAccess(101 * kG, kG);
  EXPECT_TRUE(c.CheckAccessible(101 * kG + 5, 100).ok());
  EXPECT_FALSE(c.CheckAccessible(101 * kG, 2 * kG).ok());
  c.OnSetAccess(102 * kG, kG);
  EXPECT_TRUE(c.CheckAccessible(101 * kG, 2 * kG).ok());
  EXPECT_EQ(c.CheckAccessible(103 * kG, 1).code(),
            StatusCode::kInvalidArgument);
  // Set-access: whole consecutive mappings; unmap: exactly one mapping.
  EXPECT_TRUE(c.CheckWholeMappings(101 * kG, 2 * kG, "set_access").ok());
  EXPECT_FALSE(c.CheckWholeMappings(101 * kG, 3 * kG, "set_access").ok());
  EXPECT_FALSE(c.CheckWholeMappings(100 * kG, 2 * kG, "set_access").ok());
  EXPECT_FALSE(c.CheckUnmap(101 * kG, 2 * kG).ok());
  EXPECT_FALSE(c.CheckUnmap(100 * kG, kG).ok());
  EXPECT_FALSE(c.CheckUnmap(101 * kG, kG / 2).ok());
  ASSERT_TRUE(c.CheckUnmap(101 * kG, kG).ok());
  c.OnUnmap(101 * kG, kG);
  EXPECT_EQ(c.CheckRelease(7).code(), StatusCode::kFailedPrecondition)
      << "still mapped at its alias";
  ASSERT_TRUE(c.CheckUnmap(104 * kG, kG).ok());
  c.OnUnmap(104 * kG, kG);
  ASSERT_TRUE(c.CheckUnmap(102 * kG, kG).ok());
  c.OnUnmap(102 * kG, kG);
  EXPECT_EQ(c.counts().mappings, 0u);
  EXPECT_TRUE(c.CheckRelease(7).ok());
  c.OnRelease(7);
  c.OnRelease(8);
  EXPECT_TRUE(c.CheckUnreserve(100 * kG, 8 * kG).ok());
  c.OnUnreserve(100 * kG);
  c.CheckInvariants();
  EXPECT_EQ(c.DescribeLive(), "");
}

TEST(DriverContractTest, ErrorMessagesSayWhatIsWrong) {
  DriverContract c;
  c.OnCreate(1, 0, kG);
  c.OnReserve(10 * kG, 2 * kG);
  c.OnMap(10 * kG, kG, 1, 0);
  EXPECT_EQ(
      c.CheckRelease(1).message(),
      "release: handle 0x1 still has 4096 bytes mapped; unmap them first");
  EXPECT_EQ(c.CheckMap(10 * kG, kG, 1, 0, kG).message(),
            "map: [0xa000, +4096) overlaps the mapping at 0xa000");
  EXPECT_EQ(c.CheckMap(12 * kG, kG, 1, 0, kG).message(),
            "map: [0xc000, +4096) is not inside one reservation");
  EXPECT_EQ(
      c.CheckUnreserve(10 * kG, 2 * kG).message(),
      "unreserve: [0xa000, +8192) still has a mapping at 0xa000; unmap first");
  EXPECT_NE(c.DescribeLive().find("mapping [0xa000, +4096) of handle 0x1"),
            std::string::npos);
  c.OnCreate(2, 0, 2 * kG);
  EXPECT_EQ(c.CheckMap(11 * kG, kG, 2, kG, kG).message(),
            "map: offset 4096 into handle 0x2: CUDA maps whole handles only "
            "(cuMemMap: CUDA_ERROR_NOT_SUPPORTED)");
  EXPECT_EQ(c.CheckMap(11 * kG, kG, 2, 0, kG).message(),
            "map: 4096 bytes of handle 0x2 of 8192 bytes: CUDA maps whole "
            "handles only (cuMemMap: CUDA_ERROR_NOT_SUPPORTED)");
}

}  // namespace
}  // namespace loom::vmm
