#include "whatif/workloads/perturb.h"

#include <gtest/gtest.h>

#include "whatif/workloads/load.h"

namespace loom::whatif {
namespace {

plan::Trace Dense() {
  StatusOr<Workload> w = LoadWorkload("builtin:dense:layers=2,iterations=3");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::move(w->trace);
}

uint64_t Allocs(const plan::Trace& t) {
  uint64_t n = 0;
  for (const plan::Event& e : t.events) n += e.kind == plan::EventKind::kAlloc;
  return n;
}

TEST(PerturbTest, ParsesFractionsAndPercentages) {
  StatusOr<PerturbOptions> o =
      ParsePerturbOptions("drop=3%,add=0.05, resize=10%,seed=7");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_DOUBLE_EQ(o->drop, 0.03);
  EXPECT_DOUBLE_EQ(o->add, 0.05);
  EXPECT_DOUBLE_EQ(o->resize, 0.10);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(FormatPerturbOptions(*o), "drop=3%,add=5%,resize=10%,seed=7");
  // An added request's largest size: named only when not the default, and
  // read back.
  o = ParsePerturbOptions("add=1%,max_add=256KiB");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->max_add_bytes, 256u << 10);
  EXPECT_EQ(FormatPerturbOptions(*o),
            "drop=0%,add=1%,resize=0%,seed=1,max_add=262144");
  StatusOr<PerturbOptions> again =
      ParsePerturbOptions(FormatPerturbOptions(*o));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->max_add_bytes, 256u << 10);
  for (const char* bad : {"drop=2", "drop=-1%", "jitter=1%", "drop", "seed=x",
                          "add=abc", "max_add=0", "max_add=lots", "max_add="}) {
    EXPECT_EQ(ParsePerturbOptions(bad).status().code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(PerturbTest, NothingChangesWithoutPerturbation) {
  const plan::Trace t = Dense();
  EXPECT_EQ(Perturb(t, PerturbOptions{}), t);
}

TEST(PerturbTest, DropsAddsAndResizesAboutTheirShareAndStaysValid) {
  const plan::Trace t = Dense();
  PerturbOptions o;
  o.drop = 0.1;
  o.add = 0.1;
  o.resize = 0.1;
  o.seed = 3;
  const plan::Trace p = Perturb(t, o);
  ASSERT_TRUE(plan::ValidateTrace(p).ok()) << plan::ValidateTrace(p).ToString();
  const double n = static_cast<double>(Allocs(t));
  const double kept = n * 0.9;
  // Kept requests plus the added ones (10% of those kept).
  EXPECT_NEAR(static_cast<double>(Allocs(p)), kept * 1.1, n * 0.05);
  // Markers are untouched.
  auto markers = [](const plan::Trace& x) {
    uint64_t m = 0;
    for (const plan::Event& e : x.events) {
      m +=
          e.kind != plan::EventKind::kAlloc && e.kind != plan::EventKind::kFree;
    }
    return m;
  };
  EXPECT_EQ(markers(p), markers(t));
  // Same seed, same result; another seed, another one.
  EXPECT_EQ(Perturb(t, o), p);
  o.seed = 4;
  EXPECT_NE(Perturb(t, o), p);
}

}  // namespace
}  // namespace loom::whatif
