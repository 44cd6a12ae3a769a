#include "base/crc32c.h"

#include <array>

namespace loom {
namespace {

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char byte : data)
    crc = kTable[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace loom
