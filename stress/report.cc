// StressReport's JSON form (stress.h).
#include "base/json.h"
#include "stress/stress.h"

namespace loom::stress {

std::string StressReport::Summary() const {
  std::string out = fmt::format(
      "{} ops, {} kernels: faults {}, corrupted {}, invariant failures {}", ops,
      kernels, faults, corrupted, invariant_failures);
  for (const std::string& f : failures) out += "\n  " + f;
  return out;
}

std::string StressReport::ToJson(const StressOptions& options) const {
  JsonWriter w(2);
  w.BeginObject();
  w.Key("backend").String(options.backend);
  w.Key("seed").Uint(options.seed);
  w.Key("threads").Int(options.threads);
  w.Key("streams").Int(options.streams);
  w.Key("devices").Int(options.devices);
  w.Key("granularity").Uint(granularity);
  w.Key("cap_bytes").Uint(cap_bytes);
  w.Key("max_request").Uint(max_request);
  w.Key("seconds").Double(seconds);
  w.Key("ops").Uint(ops);
  w.Key("allocs").Uint(allocs);
  w.Key("frees").Uint(frees);
  w.Key("kernels").Uint(kernels);
  w.Key("kernels_skipped").Uint(kernels_skipped);
  w.Key("cross_stream_uses").Uint(cross_stream_uses);
  w.Key("event_waits").Uint(event_waits);
  w.Key("empty_caches").Uint(empty_caches);
  w.Key("ooms").Uint(ooms);
  w.Key("oom_retries").Uint(oom_retries);
  w.Key("driver_failure_percent").Int(options.driver_failure_percent);
  w.Key("driver_failures").Uint(driver_failures);
  w.Key("plans_installed").Uint(plans_installed);
  w.Key("plan_hits").Uint(plan_hits);
  w.Key("plan_misses").Uint(plan_misses);
  w.Key("plan_suspensions").Uint(plan_suspensions);
  w.Key("region_reuses").Uint(region_reuses);
  w.Key("replans").Uint(replans);
  w.Key("plans_unloaded").Uint(plans_unloaded);
  w.Key("graph_captures").Uint(graph_captures);
  w.Key("graph_replays").Uint(graph_replays);
  w.Key("faults").Uint(faults);
  w.Key("corrupted").Uint(corrupted);
  w.Key("invariant_failures").Uint(invariant_failures);
  w.Key("ok").Bool(ok());
  w.Key("failures").BeginArray();
  for (const std::string& f : failures) w.String(f);
  w.EndArray();
  w.EndObject();
  return w.str();
}

}  // namespace loom::stress
