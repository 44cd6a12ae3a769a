// libFuzzer target: the text trace reader (any input, as a file's bytes).
#include <cstddef>
#include <cstdint>

#include "bench/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::plan::FuzzOneTrace(
      std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
