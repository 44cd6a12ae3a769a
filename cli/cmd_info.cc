// `loom info`: the driver backend, its devices, granularity and memory.
#include <cstdio>

#include "base/flags.h"
#include "base/json.h"
#include "base/text.h"
#include "cli/commands.h"
#include "vmm/cuda_driver.h"
#include "vmm/driver_factory.h"

namespace loom::cli {

int RunInfo(const Args& args) {
  std::string backend = "auto";
  uint64_t granularity = uint64_t{2} << 20;
  int64_t devices = 1;
  uint64_t capacity = uint64_t{80} << 30;
  bool json = false;
  FlagParser flags("info", "[--backend=auto|cuda|host|fake] [--json]",
                   "Shows the driver backend, its devices, their allocation "
                   "granularity and total/free memory.\nWith --backend=auto "
                   "(the default) the CUDA driver is used if present, else the "
                   "host backend, which simulates a device (its memory is "
                   "--capacity's) and says so.");
  flags.AddString("backend", &backend, "auto, cuda, host or fake");
  flags.AddSize("granularity", &granularity,
                "host/fake: granularity (default 2MiB)");
  flags.AddInt("devices", &devices, "host/fake: number of devices (default 1)");
  flags.AddSize("capacity", &capacity,
                "host/fake: memory per device (default 80GiB)");
  flags.AddBool("json", &json, "print JSON");
  if (auto exit = flags.Parse(args)) return *exit;
  if (devices < 1 || devices > 64) {
    std::fprintf(stderr, "loom info: --devices must be in 1..64\n");
    return 2;
  }

  vmm::DriverOptions options;
  options.granularity = granularity;
  options.device_count = static_cast<int>(devices);
  options.capacity_per_device = capacity;
  std::string note;
  StatusOr<std::unique_ptr<vmm::Driver>> driver =
      vmm::OpenDriver(backend == "auto" ? "cuda" : backend, options);
  if (!driver.ok() && backend == "auto") {
    note =
        fmt::format("{}; showing the host backend", driver.status().message());
    driver = vmm::OpenDriver("host", options);
  }
  if (!driver.ok()) {
    std::fprintf(stderr, "loom info: %s\n", driver.status().message().c_str());
    return 1;
  }
  vmm::Driver& d = **driver;
  StatusOr<int> count = d.DeviceCount();
  if (!count.ok()) {
    std::fprintf(stderr, "loom info: %s\n", count.status().message().c_str());
    return 1;
  }
  std::vector<vmm::DeviceProperties> props;
  for (int i = 0; i < *count; ++i) {
    StatusOr<vmm::DeviceProperties> p = d.Properties(i);
    if (!p.ok()) {
      std::fprintf(stderr, "loom info: device %d: %s\n", i,
                   p.status().message().c_str());
      return 1;
    }
    props.push_back(*p);
  }
  // host and fake stand in for a GPU: their devices and memory sizes are
  // the options' (--devices, --capacity), not a real device's.
  const bool simulated = d.name() != "cuda";
  int driver_version = 0;
  if (d.name() == "cuda") {
    driver_version = static_cast<vmm::CudaDriver&>(d).driver_version();
  }

  if (json) {
    JsonWriter w(2);
    w.BeginObject();
    w.Key("backend").String(d.name());
    w.Key("simulated").Bool(simulated);
    if (driver_version != 0) w.Key("driver_version").Int(driver_version);
    if (!note.empty()) w.Key("note").String(note);
    w.Key("granularity").Uint(props.empty() ? 0 : props[0].granularity_minimum);
    w.Key("device_count").Int(*count);
    w.Key("devices").BeginArray();
    for (const vmm::DeviceProperties& p : props) {
      w.BeginObject();
      w.Key("ordinal").Int(p.ordinal);
      w.Key("name").String(p.name);
      w.Key("total_bytes").Uint(p.total_bytes);
      w.Key("free_bytes").Uint(p.free_bytes);
      w.Key("granularity_minimum_bytes").Uint(p.granularity_minimum);
      w.Key("granularity_recommended_bytes").Uint(p.granularity_recommended);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  if (!note.empty()) std::printf("note: %s\n", note.c_str());
  std::printf("backend: %.*s", static_cast<int>(d.name().size()),
              d.name().data());
  if (driver_version != 0) {
    std::printf(" (driver %d.%d)", driver_version / 1000,
                driver_version % 1000 / 10);
  }
  if (simulated) {
    std::printf(
        " (simulated: no GPU; the devices and their memory are "
        "--devices and --capacity, default 1 x 80 GiB)");
  }
  std::printf("\ndevices: %d\n", *count);
  for (const vmm::DeviceProperties& p : props) {
    std::printf(
        "  [%d] %s\n      memory: %s total, %s free%s\n"
        "      granularity: %s minimum, %s recommended\n",
        p.ordinal, p.name.c_str(), FormatBytes(p.total_bytes).c_str(),
        FormatBytes(p.free_bytes).c_str(), simulated ? " (simulated)" : "",
        FormatBytes(p.granularity_minimum).c_str(),
        FormatBytes(p.granularity_recommended).c_str());
  }
  return 0;
}

}  // namespace loom::cli
