// GPU driver costs: how long each CUDA virtual-memory call takes.
//
// For handles of 1, 10 and 512 granules (2 MiB, 20 MiB, 1 GiB on current
// GPUs): cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, and
// address reserve/free, each timed around the Driver call (median and p99 in
// microseconds over `--rounds` rounds), plus the granularity the driver
// reports (minimum and recommended). Without a GPU it says so and exits 0:
// the GPU script (tests/gpu/run_gpu.sh) runs it where there is one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "base/flags.h"
#include "base/json.h"
#include "vmm/cuda_driver.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Series {
  std::vector<double> us;
  void Add(Clock::time_point a, Clock::time_point b) {
    us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  double Quantile(double q) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))];
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t rounds = 50;
  bool json = false;
  loom::FlagParser flags("driver_costs", "[--rounds N] [--json]",
                              "Times the CUDA virtual-memory calls loom uses.");
  flags.AddInt("rounds", &rounds, "repetitions per size (default 50)");
  flags.AddBool("json", &json, "print JSON");
  if (auto exit = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)))
    return *exit;
  auto driver = loom::vmm::CudaDriver::Open();
  if (!driver.ok()) {
    std::printf("driver_costs: skipped: %s\n",
                driver.status().message().c_str());
    return 0;
  }
  loom::vmm::Driver& d = **driver;
  auto props = d.Properties(0);
  if (!props.ok()) {
    std::fprintf(stderr, "driver_costs: %s\n",
                 props.status().message().c_str());
    return 1;
  }
  const uint64_t g = props->granularity_minimum;
  loom::JsonWriter w(2);
  w.BeginObject();
  w.Key("device").String(props->name);
  w.Key("driver_version").Int((*driver)->driver_version());
  w.Key("granularity_minimum").Uint(props->granularity_minimum);
  w.Key("granularity_recommended").Uint(props->granularity_recommended);
  w.Key("rounds").Int(rounds);
  w.Key("sizes").BeginArray();
  if (!json) {
    std::printf(
        "device %s, driver %d, granularity %llu minimum / %llu recommended\n",
        props->name.c_str(), (*driver)->driver_version(),
        static_cast<unsigned long long>(props->granularity_minimum),
        static_cast<unsigned long long>(props->granularity_recommended));
    std::printf("%10s %-14s %12s %12s\n", "bytes", "call", "median us",
                "p99 us");
  }
  for (uint64_t granules : {uint64_t{1}, uint64_t{10}, uint64_t{512}}) {
    const uint64_t size = granules * g;
    Series create, map, access, unmap, release, reserve, unreserve;
    for (int64_t r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      auto va = d.Reserve(size);
      auto t1 = Clock::now();
      auto h = d.Create(0, size);
      auto t2 = Clock::now();
      if (!va.ok() || !h.ok()) {
        std::fprintf(stderr, "driver_costs: %s\n",
                     (!va.ok() ? va.status() : h.status()).ToString().c_str());
        return 1;
      }
      loom::Status s = d.Map(*va, size, *h);
      auto t3 = Clock::now();
      if (s.ok()) s = d.SetAccess(*va, size, 0);
      auto t4 = Clock::now();
      if (s.ok()) s = d.Unmap(*va, size);
      auto t5 = Clock::now();
      if (s.ok()) s = d.Release(*h);
      auto t6 = Clock::now();
      if (s.ok()) s = d.Unreserve(*va, size);
      auto t7 = Clock::now();
      if (!s.ok()) {
        std::fprintf(stderr, "driver_costs: %s\n", s.ToString().c_str());
        return 1;
      }
      reserve.Add(t0, t1);
      create.Add(t1, t2);
      map.Add(t2, t3);
      access.Add(t3, t4);
      unmap.Add(t4, t5);
      release.Add(t5, t6);
      unreserve.Add(t6, t7);
    }
    w.BeginObject();
    w.Key("bytes").Uint(size);
    for (auto& [name, series] : std::vector<std::pair<const char*, Series*>>{
             {"cuMemAddressReserve", &reserve},
             {"cuMemCreate", &create},
             {"cuMemMap", &map},
             {"cuMemSetAccess", &access},
             {"cuMemUnmap", &unmap},
             {"cuMemRelease", &release},
             {"cuMemAddressFree", &unreserve}}) {
      const double median = series->Quantile(0.5), p99 = series->Quantile(0.99);
      w.Key(name)
          .BeginObject()
          .Key("median_us")
          .Double(median)
          .Key("p99_us")
          .Double(p99)
          .EndObject();
      if (!json) {
        std::printf("%10llu %-14s %12.1f %12.1f\n",
                    static_cast<unsigned long long>(size), name + 2, median,
                    p99);
      }
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  if (json) std::printf("%s\n", w.str().c_str());
  return 0;
}
