// A million-event synthetic trace round-trips binary -> text -> binary
// byte-identically, streaming all the way (no Trace is materialised).
#include <gtest/gtest.h>

#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {
namespace {

// Streams `data` through a reader into a writer of `format`.
std::string Convert(const std::string& data, TraceFormat format) {
  StatusOr<std::unique_ptr<TraceReader>> reader =
      OpenTraceReader(NewMemorySource(data, "in"));
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return "";
  std::string out;
  StatusOr<std::unique_ptr<TraceWriter>> writer =
      NewTraceWriter(NewStringSink(&out, "out"), (*reader)->header(), format);
  EXPECT_TRUE(writer.ok());
  Status status = CopyTrace(**reader, **writer);
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ((*reader)->events_read(), (*writer)->events_written());
  return out;
}

TEST(TraceLargeTest, MillionEventsRoundTripByteIdentically) {
  SyntheticTraceOptions options;
  options.events = 1000000;
  options.layers = 24;
  TraceHeader header;
  header.granularity = 2097152;
  header.provenance = "synthetic 1M";
  std::string binary;
  StatusOr<std::unique_ptr<TraceWriter>> writer = NewTraceWriter(
      NewStringSink(&binary, "1m.ltb"), header, TraceFormat::kBinary);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(WriteSyntheticTrace(options, **writer).ok());
  ASSERT_EQ((*writer)->events_written(), 1000000u);

  std::string text = Convert(binary, TraceFormat::kText);
  ASSERT_FALSE(text.empty());
  EXPECT_TRUE(text.ends_with("\nend 1000000\n"));
  std::string binary2 = Convert(text, TraceFormat::kBinary);
  EXPECT_EQ(binary2.size(), binary.size());
  EXPECT_TRUE(binary2 == binary) << "binary -> text -> binary differs";
  std::string text2 = Convert(binary2, TraceFormat::kText);
  EXPECT_TRUE(text2 == text) << "text -> binary -> text differs";
  // Compact: a few bytes per event.
  EXPECT_LT(binary.size(), 6u * 1000000);
}

}  // namespace
}  // namespace loom::plan
