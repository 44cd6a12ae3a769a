#include "plan/trace/trace.h"

#include <gtest/gtest.h>

namespace loom::plan {
namespace {

TEST(TraceTest, BuildsAndValidatesAWellFormedTrace) {
  Trace trace;
  trace.AddIterationBegin(0);
  trace.AddPhase(kPhaseForward);
  trace.AddModuleEnter("layers.0.moe", /*dynamic=*/true);
  trace.AddAlloc(1, 4096);
  trace.AddModuleExit("layers.0.moe");
  trace.AddPhase(kPhaseBackward);
  trace.AddFree(1);
  trace.AddIterationEnd(0);
  EXPECT_TRUE(ValidateTrace(trace).ok());
  EXPECT_EQ(trace.names.size(), 3u);
  EXPECT_EQ(trace.events[2].flags, kDynamicModule);
  EXPECT_EQ(trace.events[4].name, trace.events[2].name);
}

TEST(TraceTest, ValidationNamesTheFirstBadEvent) {
  Trace trace;
  trace.AddAlloc(1, 10);
  trace.AddAlloc(1, 10);
  EXPECT_EQ(ValidateTrace(trace).message(),
            "event 1: request 1 allocated while still live");
  trace = Trace();
  trace.AddFree(5);
  EXPECT_EQ(ValidateTrace(trace).message(),
            "event 0: free of request 5 which is not live");
  trace = Trace();
  trace.AddAlloc(1, 0);
  EXPECT_FALSE(ValidateTrace(trace).ok());
  trace = Trace();
  trace.AddModuleEnter("a");
  trace.AddModuleEnter("b");
  trace.AddModuleExit("a");
  EXPECT_FALSE(ValidateTrace(trace).ok());
  trace = Trace();
  trace.events.push_back(Event::Phase(3));
  EXPECT_FALSE(ValidateTrace(trace).ok());
}

}  // namespace
}  // namespace loom::plan
