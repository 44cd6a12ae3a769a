// Bad trace files: each reader error, with its exact message.
#include <gtest/gtest.h>

#include "base/byte_stream.h"
#include "plan/testing/trace_corpus.h"
#include "plan/trace/trace_binary.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {
namespace {

struct BadInput {
  std::string data;
  std::string message;
};

std::string Error(const std::string& data, const std::string& source) {
  StatusOr<Trace> trace = ParseTrace(data, source);
  if (trace.ok()) return "<parsed>";
  return trace.status().message();
}

const std::string kHeader =
    "loom-trace 1\ndevice 0\ngranularity 0\nprovenance \"\"\nevents\n";

TEST(TraceErrorsTest, TextReaderRejectsBadInputWithExactMessages) {
  const std::vector<BadInput> cases = {
      {"", "t.ltt: empty file: not a loom trace (no 'loom-trace 1' line)"},
      {"hello\n",
       "t.ltt:1: not a loom trace: expected 'loom-trace 1' as the first "
       "line, found 'hello'"},
      {"loom-trace 2\n",
       "t.ltt:1: unsupported text trace version 2 (this reader knows 1)"},
      {"loom-trace 1\ngranularity 0\n",
       "t.ltt:2: expected the 'device' header line, found 'granularity'"},
      {"loom-trace 1\ndevice 0\n",
       "t.ltt:3: truncated: missing the 'granularity' header line"},
      {"loom-trace 1\ndevice 40000\n",
       "t.ltt:2: header device 40000 outside -1..32767"},
      {"loom-trace 1\ndevice 0\ngranularity 1125899906842625\n",
       "t.ltt:3: granularity 1125899906842625 above the limit 2^50"},
      {"loom-trace 1\ndevice 0\ngranularity 0\nprovenance bare\n",
       "t.ltt:4: the provenance must be a quoted string"},
      {kHeader + "a 1 0\nend 1\n", "t.ltt:6: alloc of request 1 has size 0"},
      {kHeader + "a 1 1125899906842625\n",
       "t.ltt:6: size 1125899906842625 above the limit 2^50"},
      {kHeader + "a 1 99999999999999999999\n",
       "t.ltt:6: size '99999999999999999999' is out of range"},
      {kHeader + "a 1 -5\n",
       "t.ltt:6: size '-5' is not an unsigned decimal number"},
      {kHeader + "a 1\n",
       "t.ltt:6: 'a' needs 2 arguments (usage: a <id> <size> [s=<stream>] "
       "[d=<device>])"},
      {kHeader + "a 1 8\na 1 8\n",
       "t.ltt:7: alloc of request 1 which is already live"},
      {kHeader + "f 3\n", "t.ltt:6: free of request 3 which is not live"},
      {kHeader + "a 1 8 s=1 s=2\n",
       "t.ltt:6: unexpected 's=2' (expected s=<stream> or d=<device>, each at "
       "most once)"},
      {kHeader + "a 1 8 d=40000\n", "t.ltt:6: device 40000 outside 0..32767"},
      {kHeader + "me a\nmx b\n",
       "t.ltt:7: exit of module 'b' while module 'a' is the innermost open "
       "one"},
      {kHeader + "mx a\n", "t.ltt:6: exit of module 'a' with no open module"},
      {kHeader + "me a dyn\n",
       "t.ltt:6: expected 'dynamic' after the module name, found 'dyn'"},
      {kHeader + "ib 0\nie 1\n",
       "t.ltt:7: end of iteration 1 while iteration 0 is open"},
      {kHeader + "ie 1\n",
       "t.ltt:6: end of iteration 1 with no open iteration"},
      {kHeader + "ib 1 2\n", "t.ltt:6: unexpected '2' after the event"},
      {kHeader + "x 1\n", "t.ltt:6: unknown keyword 'x'"},
      {kHeader + "ph \"abc\n", "t.ltt:6: unterminated quoted string"},
      {kHeader + "ph a\"b\n",
       "t.ltt:6: byte '\"' not allowed in a bare token (quote it)"},
      {kHeader + "ph \"\\q\"\n",
       "t.ltt:6: unknown escape '\\x5cq' in a quoted string"},
      {kHeader + "ph \"\\x4\"\n", "t.ltt:6: escape \\x needs two hex digits"},
      {kHeader + "ph \"a\x01\"\n",
       "t.ltt:6: control byte 0x01 in a quoted string (write it as \\x01)"},
      {kHeader + "ph \"a\"b\n", "t.ltt:6: no space after a quoted string"},
      {kHeader + "name a\nname a\n", "t.ltt:7: name 'a' defined twice"},
      {kHeader + "ph " + std::string(5000, 'x') + "\n",
       "t.ltt:6: name of 5000 bytes above the limit 4096"},
      {kHeader + "ph " + std::string(size_t{1} << 21, 'x') + "\n",
       "t.ltt:6: line longer than 1048576 bytes"},
      {kHeader + "a 1 8\n",
       "t.ltt:7: truncated: no 'end' trailer after 1 events"},
      {kHeader + "a 1 8\nend 2\n",
       "t.ltt:7: trailer says 2 events but the file has 1"},
      {kHeader + "end 0\nf 1\n",
       "t.ltt:7: unexpected 'f' after the 'end' trailer"},
      {kHeader + "end 0\n\x89PNG garbage",
       "t.ltt:7: unexpected '\\x89PNG' after the 'end' trailer"},
  };
  for (const BadInput& bad : cases) {
    EXPECT_EQ(Error(bad.data, "t.ltt"), bad.message) << bad.data.substr(0, 200);
  }
}

TEST(TraceErrorsTest, TextReaderAcceptsCommentsBlankLinesAndCrLf) {
  std::string text =
      "# a comment first\n\nloom-trace 1   # magic\r\ndevice 0\r\n"
      "granularity 512\nprovenance \"p\"\nevents\n"
      "  # indented comment\n\t\na 1 8 d=2 s=5 # trailing comment\nf 1\n"
      "end 2\n# after the end\n\n";
  StatusOr<Trace> trace = ParseTrace(text, "ok.ltt");
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 2u);
  EXPECT_EQ(trace->events[0], Event::Alloc(1, 8, 5, 2));
  EXPECT_EQ(trace->header.granularity, 512u);
}

// A binary file assembled chunk by chunk, with correct CRCs unless told.
class BinaryFile {
 public:
  BinaryFile() {
    data_ = std::string(kBinaryTraceMagic);
    AppendU32(&data_, kBinaryTraceVersion);
  }
  BinaryFile& Chunk(char tag, const std::string& payload,
                    std::optional<uint32_t> crc = std::nullopt) {
    std::string chunk(1, tag);
    AppendU32(&chunk, payload.size());
    chunk += payload;
    AppendU32(&chunk, crc.value_or(Crc32c(chunk)));
    data_ += chunk;
    return *this;
  }
  BinaryFile& Header() { return Chunk('H', std::string("\x00\x00\x00", 3)); }
  BinaryFile& Raw(const std::string& bytes) {
    data_ += bytes;
    return *this;
  }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out += static_cast<char>(b);
  return out;
}

TEST(TraceErrorsTest, BinaryReaderRejectsBadInputWithExactMessages) {
  std::string version2(kBinaryTraceMagic);
  AppendU32(&version2, 2);
  const std::string header_end = "t.ltb: offset 24: ";  // first event chunk
  std::string bad_crc_file = BinaryFile().Header().data();
  std::string crc_chunk = "E" + Bytes({2, 0, 0, 0, 1, 3});
  uint32_t crc = Crc32c(crc_chunk);
  const std::vector<BadInput> cases = {
      {version2,
       "t.ltb: offset 8: unsupported binary trace version 2 (this reader "
       "knows 1)"},
      {std::string(kBinaryTraceMagic) + "\x01",
       "t.ltb: offset 9: truncated: the version has 1 of 4 bytes"},
      {BinaryFile().Chunk('E', Bytes({1, 3, 0})).data(),
       "t.ltb: offset 12: expected the header chunk 'H', found 'E'"},
      {BinaryFile().Raw("X\x01").data(),
       "t.ltb: offset 12: unknown chunk tag 0x58"},
      {BinaryFile().Raw("H\xff\xff\xff\xff").data(),
       "t.ltb: offset 12: chunk length 4294967295 above the limit 1048576"},
      {BinaryFile().Raw(Bytes({'H', 5, 0, 0, 0, 0})).data(),
       "t.ltb: offset 12: truncated: chunk has 1 of its 5 payload bytes"},
      {BinaryFile().Chunk('H', Bytes({3, 0, 0})).data(),
       "t.ltb: offset 17: header device -2 outside -1..32767"},
      {BinaryFile().Chunk('H', Bytes({0, 0, 0x80, 0x80, 0x40})).data(),
       "t.ltb: offset 19: provenance of 1048576 bytes above the limit 65536"},
      {BinaryFile().Chunk('H', Bytes({0, 0, 5, 'a'})).data(),
       "t.ltb: offset 19: provenance of 5 bytes runs past the header chunk"},
      {BinaryFile().Chunk('H', Bytes({0, 0, 0, 9})).data(),
       "t.ltb: offset 20: 1 unexpected bytes at the end of the header chunk"},
      {BinaryFile().Header().data(),
       header_end + "truncated: the file ends without a trailer chunk"},
      {BinaryFile().Header().Raw("E\x01").data(),
       header_end + "truncated: chunk header has 2 of 5 bytes"},
      {BinaryFile().Header().Raw(crc_chunk + Bytes({0, 0, 0, 0})).data(),
       header_end + fmt::format("checksum mismatch in chunk 'E' (stored "
                                "0x00000000, computed 0x{:08x})",
                                crc)},
      {BinaryFile().Header().Raw(crc_chunk + Bytes({0})).data(),
       header_end + "truncated: chunk checksum has 1 of 4 bytes"},
      {BinaryFile().Header().Chunk('E', Bytes({0})).data(),
       header_end + "event chunk with no records"},
      {BinaryFile().Header().Chunk('E', Bytes({100, 1, 0, 1})).data(),
       header_end + "event chunk claims 100 records in 3 bytes"},
      {BinaryFile().Header().Chunk('H', Bytes({0, 0, 0})).data(),
       header_end + "a second header chunk"},
      // Records start at offset 30 (chunk at 24, payload at 29, count 1 byte).
      {BinaryFile().Header().Chunk('E', Bytes({1, 0x21, 2, 8})).data(),
       "t.ltb: offset 30: record opcode 0x21 has unknown flag bits"},
      {BinaryFile()
           .Header()
           .Chunk('E', Bytes({1, 0x01, 2, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80,
                              0x80, 0x02}))
           .data(),
       "t.ltb: offset 30: alloc of request 1 has size 1125899906842625 above "
       "2^50"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0x01, 2, 0})).data(),
       "t.ltb: offset 30: alloc of request 1 has size 0"},
      {BinaryFile()
           .Header()
           .Chunk('E', Bytes({1, 0x11, 2, 8, 0xff, 0xff, 3}))
           .data(),
       "t.ltb: offset 30: device 65535 outside 0..32767"},
      {BinaryFile()
           .Header()
           .Chunk('E', Bytes({2, 0x01, 2, 8, 0x01, 0, 8}))
           .data(),
       "t.ltb: offset 33: alloc of request 1 which is already live"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0x02, 4})).data(),
       "t.ltb: offset 30: free of request 2 which is not live"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0x05, 3})).data(),
       "t.ltb: offset 30: phase: name index 3 outside the name table (0 "
       "names)"},
      {BinaryFile().Header().Chunk('E', Bytes({2, 0, 1, 'a', 0x07, 0})).data(),
       "t.ltb: offset 33: exit of module 'a' with no open module"},
      {BinaryFile()
           .Header()
           .Chunk('E', Bytes({2, 0, 1, 'a', 0, 1, 'a'}))
           .data(),
       "t.ltb: offset 33: name 'a' defined twice"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0, 10, 'a'})).data(),
       "t.ltb: offset 30: name of 10 bytes runs past the end of its chunk"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0, 0x80, 0x80, 0x01})).data(),
       "t.ltb: offset 30: name of 16384 bytes above the limit 4096"},
      {BinaryFile()
           .Header()
           .Chunk('E', Bytes({1, 0x03, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                              0xff, 0xff, 0x7f}))
           .data(),
       "t.ltb: offset 30: varint overflows 64 bits"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0x03, 0x80})).data(),
       "t.ltb: offset 30: varint runs past the end of its chunk"},
      {BinaryFile().Header().Chunk('E', Bytes({1, 0x03, 1, 0x03, 2})).data(),
       "t.ltb: offset 32: 2 bytes after the last record of the chunk"},
      {BinaryFile().Header().Chunk('E', Bytes({2, 0x03, 1, 0x03})).data(),
       "t.ltb: offset 32: varint runs past the end of its chunk"},
      {BinaryFile().Header().Chunk('T', Bytes({1, 0, 0})).data(),
       header_end + "trailer says 1 events but the file has 0"},
      {BinaryFile().Header().Chunk('T', Bytes({0, 2, 0})).data(),
       header_end + "trailer says 2 names but the file has 0"},
      {BinaryFile().Header().Chunk('T', Bytes({0, 0, 0, 0})).data(),
       "t.ltb: offset 32: 1 unexpected bytes at the end of the trailer"},
      {BinaryFile().Header().Chunk('T', Bytes({0, 0, 0})).Raw("x").data(),
       "t.ltb: offset 36: trailing garbage after the trailer chunk"},
  };
  for (const BadInput& bad : cases) {
    EXPECT_EQ(Error(bad.data, "t.ltb"), bad.message);
  }
  // And the minimal valid file parses.
  StatusOr<Trace> empty = ParseTrace(
      BinaryFile().Header().Chunk('T', Bytes({0, 0, 0})).data(), "e");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->events.empty());
}

TEST(TraceErrorsTest, EveryTruncationOfABinaryFileIsReported) {
  StatusOr<std::string> data =
      SerializeTrace(testing::SmallSeedTrace(), TraceFormat::kBinary);
  ASSERT_TRUE(data.ok());
  for (size_t length = 0; length < data->size(); ++length) {
    std::string cut = data->substr(0, length);
    StatusOr<Trace> trace = ParseTrace(cut, "cut.ltb");
    ASSERT_FALSE(trace.ok()) << "prefix of " << length << " bytes parsed";
    const std::string message = trace.status().message();
    EXPECT_TRUE(message.starts_with("cut.ltb")) << message;
    if (length >= kBinaryTraceMagic.size()) {
      EXPECT_NE(message.find("truncated"), std::string::npos) << message;
      EXPECT_EQ(trace.status().code(), StatusCode::kDataLoss) << message;
    }
  }
  EXPECT_TRUE(ParseTrace(*data, "full.ltb").ok());
}

TEST(TraceErrorsTest, EveryTruncationOfATextFileIsReported) {
  StatusOr<std::string> data =
      SerializeTrace(testing::SmallSeedTrace(), TraceFormat::kText);
  ASSERT_TRUE(data.ok());
  for (size_t length = 0; length + 1 < data->size(); ++length) {
    StatusOr<Trace> trace = ParseTrace(data->substr(0, length), "cut.ltt");
    ASSERT_FALSE(trace.ok()) << "prefix of " << length << " bytes parsed";
    EXPECT_TRUE(trace.status().message().starts_with("cut.ltt"));
  }
  // Only the final newline is optional.
  EXPECT_TRUE(ParseTrace(data->substr(0, data->size() - 1), "t").ok());
}

TEST(TraceErrorsTest, EveryByteFlipOfABinaryFileIsDetected) {
  StatusOr<std::string> data =
      SerializeTrace(testing::SmallSeedTrace(), TraceFormat::kBinary);
  ASSERT_TRUE(data.ok());
  for (size_t i = 0; i < data->size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = *data;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      StatusOr<Trace> trace = ParseTrace(flipped, "flip.ltb");
      EXPECT_FALSE(trace.ok()) << "byte " << i << " bit " << bit;
    }
  }
}

}  // namespace
}  // namespace loom::plan
