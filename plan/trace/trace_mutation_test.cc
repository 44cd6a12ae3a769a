// Seeded mutation testing of the trace readers: thousands of damaged inputs
// (bit flips, truncations, inserted, deleted, duplicated and swapped bytes or
// lines, and binary chunks damaged behind a recomputed checksum so that the
// record decoder sees them). Each must either parse into a valid trace that
// round-trips (and can be analysed), or fail with a message naming the
// source. Never crash (run under --config=asan to check memory safety too).
#include <gtest/gtest.h>

#include <random>

#include "plan/analysis/analysis.h"
#include "base/byte_stream.h"
#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_binary.h"
#include "plan/trace/trace_io.h"
#include "plan/analysis/workload.h"
#include "plan/testing/trace_corpus.h"

namespace loom::plan {
namespace {

struct Outcome {
  int parsed = 0;
  int rejected = 0;
};

void Check(const std::string& data, Outcome* outcome) {
  StatusOr<Trace> trace = ParseTrace(data, "m");
  if (!trace.ok()) {
    ++outcome->rejected;
    const std::string message = trace.status().message();
    ASSERT_TRUE(message.starts_with("m:") || message.starts_with("m: "))
        << message;
    ASSERT_GT(message.size(), 4u);
    return;
  }
  ++outcome->parsed;
  ASSERT_TRUE(ValidateTrace(*trace).ok());
  // Analysis copes with any valid trace: every allocation gets a class.
  Workload workload = BuildWorkload(*trace);
  WorkloadAnalysis analysis = AnalyzeWorkload(workload);
  ASSERT_EQ(analysis.classes.size(), workload.allocations.size());
  // Whatever parses can be written again and reads back the same.
  for (TraceFormat format : {TraceFormat::kText, TraceFormat::kBinary}) {
    StatusOr<std::string> again = SerializeTrace(*trace, format);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    StatusOr<Trace> back = ParseTrace(*again, "again");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(*back, *trace);
  }
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t Below(size_t n) { return n == 0 ? 0 : rng_() % n; }

  std::string Mutate(std::string data, bool text) {
    int rounds = 1 + Below(3);
    for (int r = 0; r < rounds; ++r) data = MutateOnce(std::move(data), text);
    return data;
  }

 private:
  std::string MutateOnce(std::string data, bool text) {
    static constexpr char kInteresting[] = {0,    1,   0x7f, '\x80', '\xff',
                                            '\n', ' ', '"',  '\\',   '#',
                                            '9',  '-', '=',  'a'};
    switch (Below(text ? 8 : 6)) {
      case 0:  // flip one bit
        if (!data.empty()) data[Below(data.size())] ^= 1 << Below(8);
        break;
      case 1:  // truncate
        data.resize(Below(data.size() + 1));
        break;
      case 2: {  // insert bytes
        size_t at = Below(data.size() + 1);
        std::string bytes;
        for (size_t n = 1 + Below(4); n > 0; --n) {
          bytes += Below(2) ? kInteresting[Below(sizeof(kInteresting))]
                            : static_cast<char>(rng_());
        }
        data.insert(at, bytes);
        break;
      }
      case 3: {  // delete a range
        size_t at = Below(data.size());
        data.erase(at, 1 + Below(8));
        break;
      }
      case 4: {  // duplicate a range
        size_t at = Below(data.size());
        size_t n = std::min<size_t>(1 + Below(16), data.size() - at);
        data.insert(Below(data.size() + 1), data.substr(at, n));
        break;
      }
      case 5:  // overwrite with an interesting byte
        if (!data.empty()) {
          data[Below(data.size())] = kInteresting[Below(sizeof(kInteresting))];
        }
        break;
      case 6:  // swap two lines (text)
      case 7: {
        std::vector<std::string> lines;
        size_t pos = 0;
        while (pos < data.size()) {
          size_t nl = data.find('\n', pos);
          if (nl == std::string::npos) nl = data.size() - 1;
          lines.push_back(data.substr(pos, nl + 1 - pos));
          pos = nl + 1;
        }
        if (lines.size() >= 2) {
          size_t a = Below(lines.size()), b = Below(lines.size());
          if (Below(2)) {
            std::swap(lines[a], lines[b]);
          } else {
            lines.erase(lines.begin() + a);  // drop a line
          }
        }
        data.clear();
        for (const std::string& line : lines) data += line;
        break;
      }
    }
    return data;
  }

  std::mt19937_64 rng_;
};

// Damages one chunk's payload of a binary file and fixes its length and CRC,
// so the damage reaches the record decoder.
std::string MutateBehindChecksum(const std::string& file, Mutator& mutator) {
  std::vector<size_t> chunks;  // offsets of chunk tags
  size_t pos = 12;
  while (pos + 5 <= file.size()) {
    chunks.push_back(pos);
    pos += 5 + LoadU32(file.data() + pos + 1) + 4;
  }
  if (chunks.empty()) return file;
  size_t at = chunks[mutator.Below(chunks.size())];
  uint32_t length = LoadU32(file.data() + at + 1);
  std::string payload = file.substr(at + 5, length);
  payload = mutator.Mutate(payload, /*text=*/false);
  std::string chunk(1, file[at]);
  AppendU32(&chunk, payload.size());
  chunk += payload;
  AppendU32(&chunk, Crc32c(chunk));
  return file.substr(0, at) + chunk + file.substr(at + 5 + length + 4);
}

std::vector<Trace> Seeds() { return testing::TraceSeeds(); }

TEST(TraceMutationTest, MutatedTextFilesParseOrFailCleanly) {
  Outcome outcome;
  Mutator mutator(20261122);
  for (const Trace& seed : Seeds()) {
    StatusOr<std::string> text = SerializeTrace(seed, TraceFormat::kText);
    ASSERT_TRUE(text.ok());
    for (int i = 0; i < 3000; ++i) {
      Check(mutator.Mutate(*text, /*text=*/true), &outcome);
      if (HasFatalFailure()) return;
    }
  }
  // Both outcomes occur: the mutations are neither all harmless nor all
  // caught by a shallow check.
  EXPECT_GT(outcome.parsed, 50);
  EXPECT_GT(outcome.rejected, 3000);
}

TEST(TraceMutationTest, MutatedBinaryFilesParseOrFailCleanly) {
  Outcome outcome;
  Mutator mutator(42);
  for (const Trace& seed : Seeds()) {
    StatusOr<std::string> binary = SerializeTrace(seed, TraceFormat::kBinary);
    ASSERT_TRUE(binary.ok());
    for (int i = 0; i < 2000; ++i) {
      Check(mutator.Mutate(*binary, /*text=*/false), &outcome);
      if (HasFatalFailure()) return;
      Check(MutateBehindChecksum(*binary, mutator), &outcome);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(outcome.parsed, 50);
  EXPECT_GT(outcome.rejected, 4000);
}

}  // namespace
}  // namespace loom::plan
