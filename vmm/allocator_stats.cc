#include "vmm/allocator_stats.h"

#include "base/json.h"

namespace loom::vmm {
namespace {

// PyTorch splits stats by pool (small/large); loom has one pool: "all".
void WriteStat(JsonWriter& w, std::string_view name, const Stat& stat) {
  std::string prefix = fmt::format("{}.all.", name);
  w.Key(prefix + "current").Uint(stat.current);
  w.Key(prefix + "peak").Uint(stat.peak);
  w.Key(prefix + "allocated").Uint(stat.allocated);
  w.Key(prefix + "freed").Uint(stat.freed);
}

}  // namespace

std::string SizeName(uint64_t bytes) {
  constexpr std::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (unit + 1 < std::size(kUnits) && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return fmt::format("{}{}", bytes, kUnits[unit]);
}

std::string AllocatorStats::ToJson() const {
  JsonWriter w;
  w.BeginObject();
  WriteStat(w, "allocated_bytes", allocated_bytes);
  WriteStat(w, "requested_bytes", allocated_bytes);
  WriteStat(w, "active_bytes", active_bytes);
  WriteStat(w, "reserved_bytes", reserved_bytes);
  WriteStat(w, "allocation", allocation);
  WriteStat(w, "segment", segment);
  w.Key("num_alloc_retries").Uint(num_alloc_retries);
  w.Key("num_ooms").Uint(num_ooms);
  w.Key("num_device_alloc").Uint(num_device_alloc);
  w.Key("num_device_free").Uint(num_device_free);
  WriteStat(w, "loom.static_bytes", static_bytes);
  WriteStat(w, "loom.dynamic_bytes", dynamic_bytes);
  w.Key("loom.plan_hits").Uint(plan_hits);
  w.Key("loom.plan_misses").Uint(plan_misses);
  w.Key("loom.unplanned").Uint(unplanned);
  w.Key("loom.dynamic_requests").Uint(dynamic_requests);
  w.Key("loom.dynamic_hits").Uint(dynamic_hits);
  w.Key("loom.idle_static_placements").Uint(idle_static_placements);
  w.Key("loom.region_reuses").Uint(region_reuses);
  w.Key("loom.persistent_placements").Uint(persistent_placements);
  w.Key("loom.persistent_pushes").Uint(persistent_pushes);
  w.Key("loom.iterations").Uint(iterations);
  w.Key("loom.last_iteration_hit_rate").Double(last_iteration_hit_rate);
  w.Key("loom.plan_variants").Uint(plan_variants);
  w.Key("loom.plans_unloaded").Uint(plans_unloaded);
  w.Key("loom.plan_suspensions").Uint(plan_suspensions);
  w.Key("loom.suspended_iterations").Uint(suspended_iterations);
  w.Key("loom.last_iteration_suspended").Bool(last_iteration_suspended);
  w.Key("loom.suspended_requests").Uint(suspended_requests);
  w.Key("loom.variant_switches").Uint(variant_switches);
  w.Key("loom.plan_variants_refused").Uint(plan_variants_refused);
  w.Key("loom.plan_verdict").String(plan_verdict);
  w.Key("loom.plan_losses").Uint(plan_losses);
  w.Key("loom.referee_plan_bytes").Uint(referee_plan_bytes);
  w.Key("loom.referee_dynamic_bytes").Uint(referee_dynamic_bytes);
  w.Key("loom.lost_plan_bytes").Uint(lost_plan_bytes);
  w.Key("loom.lost_dynamic_bytes").Uint(lost_dynamic_bytes);
  w.Key("loom.static_region_bytes").Uint(static_region_bytes);
  w.Key("loom.static_backed_bytes").Uint(static_backed_bytes);
  w.Key("loom.arena_mapped_bytes").Uint(arena_mapped_bytes);
  w.Key("loom.arena_maps").Uint(arena_maps);
  w.Key("loom.stitched_pages").Uint(stitched_pages);
  w.Key("loom.stitched_static_pages").Uint(stitched_static_pages);
  w.Key("loom.graph_pool_bytes").Uint(graph_pool_bytes);
  w.Key("loom.stream_events").Uint(stream_events);
  w.Key("loom.device_syncs").Uint(device_syncs);
  for (size_t site = 0; site < kWaitSiteCount; ++site) {
    for (size_t kind = 0; kind < kWaitKindCount; ++kind) {
      w.Key(fmt::format("loom.waits.{}.{}",
                        WaitSiteName(static_cast<WaitSite>(site)),
                        WaitKindName(static_cast<WaitKind>(kind))))
          .Uint(waits.counts[site][kind]);
    }
  }
  w.Key("loom.layout.handles").Uint(layout.handles);
  w.Key("loom.layout.handle_bytes").Uint(layout.handle_bytes);
  w.Key("loom.layout.mappings").Uint(layout.mappings);
  w.Key("loom.layout.mapped_bytes").Uint(layout.mapped_bytes);
  for (const auto& [size, b] : layout.by_handle_size) {
    const std::string prefix =
        fmt::format("loom.layout.handle_size.{}.", SizeName(size));
    w.Key(prefix + "handles").Uint(b.handles);
    w.Key(prefix + "bytes").Uint(b.bytes);
    w.Key(prefix + "mappings").Uint(b.mappings);
  }
  w.Key("loom.trace_events").Uint(trace_events);
  w.Key("loom.trace_earlier_frees").Uint(trace_earlier_frees);
  w.Key("loom.trace_truncated").Bool(trace_truncated);
  uint64_t total = 0;
  for (size_t i = 0; i < kDriverOpCount; ++i) {
    w.Key(fmt::format("loom.driver_calls.{}",
                      DriverOpName(static_cast<DriverOp>(i))))
        .Uint(driver_calls[i]);
    total += driver_calls[i];
  }
  w.Key("loom.driver_calls.total").Uint(total);
  w.EndObject();
  return w.str();
}

}  // namespace loom::vmm
