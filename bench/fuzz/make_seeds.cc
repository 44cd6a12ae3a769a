// Writes the seed corpus of the trace fuzzers: small valid traces (every
// event kind, quoted names, several chunks) in the text and binary forms.
//   make_seeds <text_dir> <binary_dir>
#include <cstdio>
#include <string>

#include "plan/testing/trace_corpus.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {
namespace {

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds <text_dir> <binary_dir>\n");
    return 2;
  }
  const std::vector<Trace> seeds = testing::TraceSeeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    for (TraceFormat format : {TraceFormat::kText, TraceFormat::kBinary}) {
      std::string path =
          std::string(argv[format == TraceFormat::kText ? 1 : 2]) + "/seed" +
          std::to_string(i) + (format == TraceFormat::kText ? ".ltt" : ".ltb");
      Status status = WriteTrace(path, seeds[i], format);
      if (!status.ok()) {
        std::fprintf(stderr, "%s\n", status.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace loom::plan

int main(int argc, char** argv) { return loom::plan::Main(argc, argv); }
