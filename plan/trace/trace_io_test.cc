#include "plan/trace/trace_io.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_binary.h"
#include "plan/trace/trace_text.h"

namespace loom::plan {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Every event kind, every field, names that need quoting.
Trace HandMadeTrace() {
  Trace trace;
  trace.header.device = -1;
  trace.header.granularity = 2097152;
  trace.header.provenance = "snapshot \"x\".pickle\n\\ \x01 caf\xc3\xa9";
  trace.events.push_back(Event::Alloc(7, 512));  // head
  trace.AddIterationBegin(0);
  trace.AddPhase(kPhaseForward);
  trace.AddModuleEnter("layers.0.moe", /*dynamic=*/true);
  trace.events.push_back(
      Event::Alloc(17, 4096, /*stream=*/94281, /*device=*/3));
  trace.AddModuleEnter("name with space");
  trace.events.push_back(Event::Alloc(uint64_t{1} << 63, uint64_t{1} << 50));
  trace.AddModuleExit("name with space");
  trace.AddModuleExit("layers.0.moe");
  trace.AddPhase("#hash\t\"q\"\\");
  trace.events.push_back(Event::Free(17, 94281, 3));
  trace.events.push_back(Event::Free(uint64_t{1} << 63, 0, 1));
  trace.AddModuleEnter("");
  trace.AddModuleExit("");
  trace.AddIterationEnd(0);
  trace.AddIterationBegin(18446744073709551615u);
  return trace;
}

constexpr std::string_view kHandMadeText =
    "loom-trace 1\n"
    "device -1\n"
    "granularity 2097152\n"
    "provenance \"snapshot \\\"x\\\".pickle\\n\\\\ \\x01 caf\\xc3\\xa9\"\n"
    "events\n"
    "a 7 512\n"
    "ib 0\n"
    "ph forward\n"
    "me layers.0.moe dynamic\n"
    "a 17 4096 s=94281 d=3\n"
    "me \"name with space\"\n"
    "a 9223372036854775808 1125899906842624\n"
    "mx \"name with space\"\n"
    "mx layers.0.moe\n"
    "ph \"#hash\\t\\\"q\\\"\\\\\"\n"
    "f 17 s=94281 d=3\n"
    "f 9223372036854775808 d=1\n"
    "me \"\"\n"
    "mx \"\"\n"
    "ie 0\n"
    "ib 18446744073709551615\n"
    "end 16\n";

TEST(TraceIoTest, TextFormOfAHandMadeTraceIsExact) {
  Trace trace = HandMadeTrace();
  ASSERT_TRUE(ValidateTrace(trace).ok());
  StatusOr<std::string> text = SerializeTrace(trace, TraceFormat::kText);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, kHandMadeText);
  StatusOr<Trace> back = ParseTrace(*text, "hand.ltt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, trace);
}

TEST(TraceIoTest, BinaryRoundTripsAndConvertsByteIdentically) {
  Trace trace = HandMadeTrace();
  StatusOr<std::string> binary = SerializeTrace(trace, TraceFormat::kBinary);
  ASSERT_TRUE(binary.ok()) << binary.status().ToString();
  EXPECT_EQ(binary->substr(0, 8), kBinaryTraceMagic);
  StatusOr<Trace> back = ParseTrace(*binary, "hand.ltb");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, trace);
  // binary -> text -> binary, and text -> binary -> text.
  StatusOr<std::string> text = SerializeTrace(*back, TraceFormat::kText);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, kHandMadeText);
  StatusOr<Trace> from_text = ParseTrace(*text, "hand.ltt");
  ASSERT_TRUE(from_text.ok());
  StatusOr<std::string> binary2 =
      SerializeTrace(*from_text, TraceFormat::kBinary);
  ASSERT_TRUE(binary2.ok());
  EXPECT_EQ(*binary2, *binary);
}

TEST(TraceIoTest, BinaryEncodingIsAsDocumented) {
  Trace trace;
  trace.header.granularity = 2097152;
  trace.header.provenance = "x";
  trace.AddAlloc(5, 4096);
  trace.AddFree(5);
  StatusOr<std::string> binary = SerializeTrace(trace, TraceFormat::kBinary);
  ASSERT_TRUE(binary.ok());
  auto chunk = [](char tag, std::string payload) {
    std::string out(1, tag);
    AppendU32(&out, payload.size());
    out += payload;
    AppendU32(&out, Crc32c(out));
    return out;
  };
  std::string expected(kBinaryTraceMagic);
  expected += std::string("\x01\x00\x00\x00", 4);
  expected += chunk('H', std::string("\x00\x80\x80\x80\x01\x01x", 7));
  // 2 records: alloc (op 1, zigzag(5) = 10, size 4096 = 0x80 0x20), free
  // (op 2, zigzag(0)).
  expected += chunk('E', std::string("\x02\x01\x0a\x80\x20\x02\x00", 7));
  expected +=
      chunk('T', std::string("\x02\x00\x01", 3));  // events, names, chunks
  EXPECT_EQ(*binary, expected);
}

TEST(TraceIoTest, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c("56789", Crc32c("1234")), 0xE3069283u);
}

TEST(TraceIoTest, NameTableOrderAndUnusedNamesSurvive) {
  Trace trace;
  trace.names = {"unused", "backward", "forward", "tail"};
  trace.events.push_back(Event::Phase(2));
  trace.events.push_back(Event::Phase(1));
  trace.events.push_back(Event::Phase(2));
  for (TraceFormat format : {TraceFormat::kText, TraceFormat::kBinary}) {
    StatusOr<std::string> data = SerializeTrace(trace, format);
    ASSERT_TRUE(data.ok());
    StatusOr<Trace> back = ParseTrace(*data, "names");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, trace);
  }
  StatusOr<std::string> text = SerializeTrace(trace, TraceFormat::kText);
  EXPECT_EQ(*text,
            "loom-trace 1\ndevice 0\ngranularity 0\nprovenance \"\"\nevents\n"
            "name unused\nname backward\nph forward\nph backward\nph forward\n"
            "name tail\nend 3\n");
}

TEST(TraceIoTest, ReaderStreamsAndGrowsItsNameTable) {
  Trace trace = HandMadeTrace();
  StatusOr<std::string> binary = SerializeTrace(trace, TraceFormat::kBinary);
  ASSERT_TRUE(binary.ok());
  for (TraceFormat format : {TraceFormat::kText, TraceFormat::kBinary}) {
    StatusOr<std::string> data = SerializeTrace(trace, format);
    StatusOr<std::unique_ptr<TraceReader>> reader =
        OpenTraceReader(NewMemorySource(*data, "stream"));
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ((*reader)->format(), format);
    EXPECT_EQ((*reader)->header(), trace.header);
    EXPECT_TRUE((*reader)->names().empty());
    Event event;
    std::vector<size_t> name_counts;
    while (true) {
      StatusOr<bool> more = (*reader)->Next(&event);
      ASSERT_TRUE(more.ok()) << more.status().ToString();
      if (!*more) break;
      name_counts.push_back((*reader)->names().size());
    }
    ASSERT_EQ(name_counts.size(), trace.events.size());
    EXPECT_EQ(name_counts[3], 2u);  // forward, layers.0.moe
    EXPECT_EQ(name_counts.back(), 5u);
    // The end is sticky.
    StatusOr<bool> again = (*reader)->Next(&event);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(*again);
  }
}

TEST(TraceIoTest, WriterRejectsInvalidEventsAndStaysFailed) {
  std::string out;
  StatusOr<std::unique_ptr<TraceWriter>> writer = NewTraceWriter(
      NewStringSink(&out, "w.ltb"), TraceHeader(), TraceFormat::kBinary);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(Event::Alloc(1, 10)).ok());
  Status status = (*writer)->Write(Event::Free(2));
  EXPECT_EQ(status.message(),
            "w.ltb: event 1: free of request 2 which is not live");
  EXPECT_EQ((*writer)->Write(Event::Free(1)), status);
  EXPECT_EQ((*writer)->Finish(), status);

  writer = NewTraceWriter(NewStringSink(&out, "w.ltt"), TraceHeader(),
                          TraceFormat::kText);
  ASSERT_TRUE((*writer)->AddName("a").ok());
  EXPECT_EQ((*writer)->AddName("a").message(), "w.ltt: name 'a' defined twice");

  writer = NewTraceWriter(NewStringSink(&out, "w.ltt"), TraceHeader(),
                          TraceFormat::kText);
  Event odd = Event::IterationBegin(1);
  odd.stream = 4;
  EXPECT_EQ((*writer)->Write(odd).message(),
            "w.ltt: event 0: iter_begin event with a non-zero 'stream' field");

  TraceHeader bad;
  bad.device = -2;
  EXPECT_EQ(NewTraceWriter(NewStringSink(&out, "h"), bad, TraceFormat::kText)
                .status()
                .message(),
            "h: header device -2 outside -1..32767");
}

TEST(TraceIoTest, SyntheticTraceConvertsThroughFilesLosslessly) {
  SyntheticTraceOptions options;
  options.events = 20000;
  Trace trace = MakeSyntheticTrace(options);
  ASSERT_EQ(trace.events.size(), 20000u);
  ASSERT_TRUE(ValidateTrace(trace).ok());
  std::string ltb = ::testing::TempDir() + "synthetic.ltb";
  std::string ltt = ::testing::TempDir() + "synthetic.ltt";
  std::string ltb2 = ::testing::TempDir() + "synthetic2.ltb";
  ASSERT_TRUE(WriteTrace(ltb, trace, TraceFormat::kBinary).ok());
  ASSERT_TRUE(ConvertTrace(ltb, ltt, TraceFormat::kText).ok());
  ASSERT_TRUE(ConvertTrace(ltt, ltb2, TraceFormat::kBinary).ok());
  EXPECT_EQ(ReadFile(ltb), ReadFile(ltb2));
  StatusOr<Trace> back = ReadTrace(ltt);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, trace);
  EXPECT_GT(ReadFile(ltt).size(), 2 * ReadFile(ltb).size());

  // The streaming generator writes the same bytes.
  std::string streamed;
  StatusOr<std::unique_ptr<TraceWriter>> writer = NewTraceWriter(
      NewStringSink(&streamed, "s"), trace.header, TraceFormat::kBinary);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(WriteSyntheticTrace(options, **writer).ok());
  EXPECT_EQ(streamed, ReadFile(ltb));
  EXPECT_EQ(ConvertTrace(ltb, ltb, TraceFormat::kText).message(),
            ltb + ": cannot convert a trace onto itself");
}

TEST(TraceIoTest, MissingFileIsNotFound) {
  StatusOr<Trace> trace = ReadTrace("/nonexistent/x.ltb");
  EXPECT_EQ(trace.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(trace.status().message(),
            "/nonexistent/x.ltb: cannot open: No such file or directory");
}

TEST(TraceIoTest, FormatNames) {
  EXPECT_EQ(FormatTextName("layers.0"), "layers.0");
  EXPECT_EQ(FormatTextName("a b"), "\"a b\"");
  EXPECT_EQ(FormatTextName("#x"), "\"#x\"");
  EXPECT_EQ(*ParseTraceFormat("ltb"), TraceFormat::kBinary);
  EXPECT_FALSE(ParseTraceFormat("xml").ok());
}

}  // namespace
}  // namespace loom::plan
