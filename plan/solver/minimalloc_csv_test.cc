#include "plan/solver/minimalloc_csv.h"

#include <gtest/gtest.h>

namespace loom::plan {
namespace {

TEST(MinimallocCsvTest, ReadsTheReadmeExampleWithTextIds) {
  StatusOr<CsvInstance> csv = ParseMinimallocCsv(
      "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,"
      "4\n",
      "input.12.csv");
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  const Instance& inst = csv->instance;
  ASSERT_EQ(inst.buffers.size(), 5u);
  EXPECT_EQ(inst.labels[3], "b4");
  EXPECT_EQ(inst.buffers[3], (Buffer{3, 9, 21, 4}));
  EXPECT_EQ(LowerBound(inst), 12u);
  // Round trip keeps the text ids.
  EXPECT_EQ(FormatMinimallocCsv(inst).substr(0, 29),
            "id,lower,upper,size\nb1,0,3,4\n");
}

TEST(MinimallocCsvTest, InclusiveEndColumnAndOffsets) {
  StatusOr<CsvInstance> csv =
      ParseMinimallocCsv("buffer,start,end,size,offset\n0,0,2,8,16\n", "x.csv");
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  EXPECT_EQ(csv->instance.buffers[0].end, 3);
  ASSERT_EQ(csv->offsets.size(), 1u);
  EXPECT_EQ(csv->offsets[0], 16u);
  EXPECT_EQ(FormatMinimallocCsv(csv->instance, csv->offsets),
            "id,lower,upper,size,offset\n0,0,3,8,16\n");
}

TEST(MinimallocCsvTest, RejectsBadInputWithFileAndLine) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"", "bad.csv: empty file (no header line)"},
      {"id,lower,size\n",
       "bad.csv:1: header must name id, lower, upper (or end) and size "
       "columns"},
      {"id,lower,upper,size,color\n", "bad.csv:1: unknown column 'color'"},
      {"id,lower,upper,size\n1,0,5\n", "bad.csv:2: 3 fields, the header has 4"},
      {"id,lower,upper,size\n1,0,5,-3\n",
       "bad.csv:2: size '-3' is not a non-negative integer"},
      {"id,lower,upper,size\n1,0,5,12x\n",
       "bad.csv:2: size '12x' is not a non-negative integer"},
      {"id,lower,upper,size\n1,5,5,1\n", "bad.csv:2: empty lifetime [5, 5)"},
      {"id,lower,upper,size\n1,0,5,0\n", "bad.csv:2: size is 0"},
      {"id,lower,upper,size\n1,0,5,99999999999999999999999\n",
       "bad.csv:2: size '99999999999999999999999' is too large"},
      {"id,lower,upper,size\n1,0,5,2251799813685249\n",
       "bad.csv:2: size 2251799813685249 exceeds the limit 2^50"},
      {"id,lower,upper,size,alignment\n1,0,5,8,3\n",
       "bad.csv:2: alignment 3 is not a power of two"},
  };
  for (const Case& c : cases) {
    StatusOr<CsvInstance> csv = ParseMinimallocCsv(c.text, "bad.csv");
    ASSERT_FALSE(csv.ok()) << c.text;
    EXPECT_EQ(csv.status().message(), c.message) << c.text;
  }
}

TEST(MinimallocCsvTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadMinimallocCsv("/nonexistent/x.csv").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom::plan
