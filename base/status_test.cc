#include "base/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace loom {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("{} is odd", x);
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  LOOM_ASSIGN_OR_RETURN(int half, Half(x));
  LOOM_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status CheckEven(int x) {
  LOOM_RETURN_IF_ERROR(Half(x).status());
  return OkStatus();
}

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndFormattedMessage) {
  Status s = OutOfMemoryError("need {} bytes, {} free", 4096, 0);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(s.ToString(), "OUT_OF_MEMORY: need 4096 bytes, 0 free");
  EXPECT_EQ(s.WithContext("trace.bin").message(),
            "trace.bin: need 4096 bytes, 0 free");
}

TEST(StatusOrTest, ValueAndErrorPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  StatusOr<int> odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "3 is odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

TEST(StatusOrTest, HoldsMoveOnlyTypes) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(7);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> owned = std::move(p).value();
  EXPECT_EQ(*owned, 7);
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> bad = NotFoundError("nothing");
  EXPECT_DEATH((void)bad.value(), "NOT_FOUND: nothing");
}

TEST(CheckDeathTest, FailedCheckPrintsConditionAndMessage) {
  EXPECT_DEATH(LOOM_CHECK(1 + 1 == 3, "math is {}", "broken"),
               "1 \\+ 1 == 3: math is broken");
  EXPECT_DEATH(LOOM_CHECK_EQ(2, 3), "2 vs 3");
}

}  // namespace
}  // namespace loom
