#include "base/text.h"

#include <cstring>

#include <fmt/format.h>

namespace loom {

std::string_view TrimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::string QuotedForMessage(std::string_view text, size_t max_bytes) {
  std::string out = "'";
  size_t n = 0;
  for (unsigned char c : text) {
    if (++n > max_bytes) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out + "'";
}

std::string TagName(uint32_t tag) {
  std::string out;
  for (int k = 0; k < 4; ++k) {
    const char c = static_cast<char>((tag >> (8 * k)) & 0xff);
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out;
}

std::string OsErrorText(int error) {
  return error == 0 ? std::string("the system gave no reason")
                    : std::string(std::strerror(error));
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB",
                                           "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

}  // namespace loom
