// libFuzzer target: the binary trace reader. Each input is read twice: as
// is (framing, checksums), and with every chunk's CRC-32C recomputed so that
// mutations reach the header and record decoders behind the checksum.
#include <cstddef>
#include <cstdint>
#include <string>

#include "bench/fuzz/fuzz_common.h"
#include "base/byte_stream.h"
#include "plan/trace/trace_binary.h"

namespace {

// Walks the chunks of `data` and rewrites each stored CRC to the computed one.
std::string FixChecksums(std::string data) {
  size_t pos = loom::plan::kBinaryTraceMagic.size() + 4;
  while (pos + 5 <= data.size()) {
    uint32_t length = loom::plan::LoadU32(data.data() + pos + 1);
    if (length > data.size() - pos - 5 || data.size() - pos - 5 - length < 4) {
      break;
    }
    uint32_t crc =
        loom::Crc32c(std::string_view(data.data() + pos, 5 + length));
    std::string stored;
    loom::plan::AppendU32(&stored, crc);
    data.replace(pos + 5 + length, 4, stored);
    pos += 5 + length + 4;
  }
  return data;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  loom::plan::FuzzOneTrace(input);
  if (input.starts_with(loom::plan::kBinaryTraceMagic)) {
    loom::plan::FuzzOneTrace(FixChecksums(std::move(input)));
  }
  return 0;
}
