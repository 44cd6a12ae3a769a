// Small text helpers every layer uses in messages and tables. Pure functions,
// no state.
#ifndef LOOM_BASE_TEXT_H_
#define LOOM_BASE_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// `s` without leading blanks (space, tab) and trailing blanks (space, tab,
// carriage return).
std::string_view TrimBlanks(std::string_view s);

// User text for an error message: in single quotes, bytes outside printable
// ASCII (and the quote and backslash) as \xNN, cut after `max_bytes` input
// bytes with "...".
std::string QuotedForMessage(std::string_view text, size_t max_bytes);

// A four-character tag (little-endian in `tag`), unprintable bytes as '?'.
std::string TagName(uint32_t tag);

// "512 B", "1.50 KiB", "34.00 MiB", "5.00 GiB" (binary units up to PiB).
std::string FormatBytes(uint64_t bytes);

// The operating system's reason for a failed file operation, from an errno
// value: strerror's text ("No such file or directory"), or "the system gave
// no reason" for 0. Callers set errno to 0 before the operation.
std::string OsErrorText(int error);

}  // namespace loom

#endif  // LOOM_BASE_TEXT_H_
