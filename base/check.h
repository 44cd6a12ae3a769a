// LOOM_CHECK: always-on assertions for broken invariants (pure C++).
//
// A failed check prints file, line, the condition and an fmt-formatted message
// to stderr and aborts. Checks are for bugs in loom, never for bad input:
// input errors are reported with a Status (status.h).
#ifndef LOOM_BASE_CHECK_H_
#define LOOM_BASE_CHECK_H_

#include <fmt/format.h>

#include <string>

namespace loom::internal {

// Prints the failure and aborts. Never returns.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace loom::internal

// LOOM_CHECK(cond) or LOOM_CHECK(cond, "format {}", args...).
#define LOOM_CHECK(cond, ...)                                       \
  do {                                                              \
    if (!(cond)) [[unlikely]] {                                     \
      ::loom::internal::CheckFailed(__FILE__, __LINE__, #cond,      \
                                    ::fmt::format("" __VA_ARGS__)); \
    }                                                               \
  } while (false)

#define LOOM_CHECK_OP_(a, b, op)                        \
  do {                                                  \
    const auto& loom_a_ = (a);                          \
    const auto& loom_b_ = (b);                          \
    if (!(loom_a_ op loom_b_)) [[unlikely]] {           \
      ::loom::internal::CheckFailed(                    \
          __FILE__, __LINE__, #a " " #op " " #b,        \
          ::fmt::format("{} vs {}", loom_a_, loom_b_)); \
    }                                                   \
  } while (false)

#define LOOM_CHECK_EQ(a, b) LOOM_CHECK_OP_(a, b, ==)
#define LOOM_CHECK_NE(a, b) LOOM_CHECK_OP_(a, b, !=)
#define LOOM_CHECK_LE(a, b) LOOM_CHECK_OP_(a, b, <=)
#define LOOM_CHECK_LT(a, b) LOOM_CHECK_OP_(a, b, <)
#define LOOM_CHECK_GE(a, b) LOOM_CHECK_OP_(a, b, >=)
#define LOOM_CHECK_GT(a, b) LOOM_CHECK_OP_(a, b, >)

// Debug-only checks for expensive invariants (compiled out with NDEBUG).
#ifdef NDEBUG
#define LOOM_DCHECK(cond, ...) \
  do {                         \
  } while (false && (cond))
#else
#define LOOM_DCHECK(cond, ...) LOOM_CHECK(cond, __VA_ARGS__)
#endif

#endif  // LOOM_BASE_CHECK_H_
