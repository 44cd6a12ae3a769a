#include "plan/trace/fingerprint.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom::plan {
namespace {

struct Shape {
  int iterations = 3;
  uint64_t stream = 7;
  uint64_t first_id = 1;
  std::vector<uint64_t> moe_sizes;  // per iteration, inside a dynamic module
  int extra_in = -1;                // iteration with one extra request
  uint64_t second_size = 512;
};

// Set-up allocation, then marked iterations of a fixed pattern.
Trace MakeTrace(const Shape& shape) {
  Trace trace;
  uint64_t id = shape.first_id;
  trace.AddAlloc(id++, 1000, shape.stream);
  for (int i = 0; i < shape.iterations; ++i) {
    trace.AddIterationBegin(i);
    trace.AddPhase("forward");
    const uint64_t a = id++, b = id++;
    trace.AddAlloc(a, 4096, shape.stream);
    trace.AddAlloc(b, shape.second_size, 0);
    if (i < static_cast<int>(shape.moe_sizes.size())) {
      trace.AddModuleEnter("moe", /*dynamic=*/true);
      trace.AddAlloc(id, shape.moe_sizes[i], shape.stream);
      trace.AddFree(id++, shape.stream);
      trace.AddModuleExit("moe");
    }
    if (shape.extra_in == i) {
      trace.AddAlloc(id, 64);
      trace.AddFree(id++);
    }
    trace.AddFree(b, 0);
    trace.AddFree(a, shape.stream);
    trace.AddIterationEnd(i);
  }
  EXPECT_TRUE(ValidateTrace(trace).ok());
  return trace;
}

bool Same(const RequestFingerprint& a, const RequestFingerprint& b) {
  return a.has_steady && b.has_steady && a.steady == b.steady &&
         a.prologue == b.prologue;
}

// The digests of the Python implementation this one replaced (fingerprint
// version 1), so sidecars written before still match.
TEST(FingerprintTest, SameDigestsAsVersionOne) {
  const RequestFingerprint f = FingerprintRequests(
      MakeTrace({.moe_sizes = {100, 200, 300}, .extra_in = 1}));
  EXPECT_EQ(f.version, 1);
  EXPECT_EQ(f.prologue,
            "c36702abda595659fb920c3ed1ee4210699c432529a8584bfe6d8959fadced27");
  EXPECT_EQ(f.steady,
            "646827e4c4b050d3e7d19927e7692b7a4645b6b1a2cca1a6aaf9684c3af34423");
  EXPECT_EQ(f.prologue_allocs, 6u);
  EXPECT_EQ(f.steady_allocs, 2u);
  EXPECT_EQ(f.steady_frees, 2u);
  EXPECT_EQ(f.iterations, 3u);
  EXPECT_TRUE(f.has_steady);
}

TEST(FingerprintTest, IdsAndStreamHandlesDoNotMatter) {
  const RequestFingerprint mine =
      FingerprintRequests(MakeTrace({.stream = 0x7f001, .first_id = 1}));
  const RequestFingerprint theirs =
      FingerprintRequests(MakeTrace({.stream = 0x55aa0, .first_id = 900}));
  EXPECT_TRUE(Same(mine, theirs));
  EXPECT_EQ(mine.steady_allocs, 2u);
  EXPECT_EQ(mine.prologue_allocs, 1u + 2 * 2);
}

TEST(FingerprintTest, DynamicModuleRequestsDoNotCount) {
  const RequestFingerprint dense = FingerprintRequests(MakeTrace({}));
  const RequestFingerprint moe =
      FingerprintRequests(MakeTrace({.moe_sizes = {100, 200, 300}}));
  const RequestFingerprint other =
      FingerprintRequests(MakeTrace({.moe_sizes = {7, 8, 9}}));
  EXPECT_TRUE(Same(dense, moe));
  EXPECT_TRUE(Same(moe, other));
}

TEST(FingerprintTest, DifferencesAreFoundInTheirPart) {
  const RequestFingerprint base = FingerprintRequests(MakeTrace({}));
  // A different size in every iteration: both parts differ.
  const RequestFingerprint sized =
      FingerprintRequests(MakeTrace({.second_size = 1024}));
  EXPECT_NE(base.steady, sized.steady);
  EXPECT_NE(base.prologue, sized.prologue);
  // One extra request in the first iteration: only the prologue differs.
  const RequestFingerprint extra =
      FingerprintRequests(MakeTrace({.extra_in = 0}));
  EXPECT_EQ(base.steady, extra.steady);
  EXPECT_NE(base.prologue, extra.prologue);
  // A request on another stream is another request.
  const RequestFingerprint streams =
      FingerprintRequests(MakeTrace({.stream = 0}));
  EXPECT_NE(base.steady, streams.steady);
}

TEST(FingerprintTest, SteadyPartIsTheLastIterationThatAllocates) {
  Trace trace = MakeTrace({});
  // An empty iteration at the end (loom.finish() right after loom.step()).
  trace.AddIterationBegin(3);
  trace.AddIterationEnd(3);
  const RequestFingerprint padded = FingerprintRequests(trace);
  const RequestFingerprint base = FingerprintRequests(MakeTrace({}));
  EXPECT_EQ(padded.steady, base.steady);
  EXPECT_EQ(padded.prologue, base.prologue);
  EXPECT_EQ(padded.iterations, 4u);
}

TEST(FingerprintTest, NoMarkedIterationHasNoSteadyPart) {
  Trace trace;
  trace.AddAlloc(1, 100);
  trace.AddFree(1);
  const RequestFingerprint f = FingerprintRequests(trace);
  EXPECT_FALSE(f.has_steady);
  EXPECT_EQ(f.prologue_allocs, 1u);
  EXPECT_EQ(f.events, 2u);
  // An open iteration (no closing marker) is not complete either.
  trace.AddIterationBegin(0);
  trace.AddAlloc(2, 100);
  EXPECT_FALSE(FingerprintRequests(trace).has_steady);
}

TEST(FingerprintTest, JsonHasEveryField) {
  const std::string json = FingerprintJson(FingerprintRequests(MakeTrace({})));
  for (const char* key :
       {"\"version\":1", "\"prologue\":\"", "\"steady\":\"",
        "\"prologue_allocs\":5", "\"steady_allocs\":2", "\"steady_frees\":2",
        "\"iterations\":3", "\"events\":", "\"has_steady\":true"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
}

}  // namespace
}  // namespace loom::plan
