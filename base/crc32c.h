// CRC-32C (Castagnoli), the checksum of loom's trace and plan files.
#ifndef LOOM_BASE_CRC32C_H_
#define LOOM_BASE_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace loom {

// CRC-32C of `data`, continuing from `crc` (0 to start): Crc32c(b, Crc32c(a))
// is the CRC of a followed by b. Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);

}  // namespace loom

#endif  // LOOM_BASE_CRC32C_H_
