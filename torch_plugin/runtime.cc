#include "torch_plugin/runtime.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>

#include "base/json.h"
#include "base/text.h"
#include "plan/trace/trace_io.h"
#include "torch_plugin/host_timing.h"
#include "vmm/driver_factory.h"
#include "vmm/plan_loader.h"

namespace loom::plugin {
namespace {

thread_local std::string last_error;

// Byte counts: plain integers or with a binary suffix (K, M, G, T, KiB...).
StatusOr<uint64_t> ParseBytes(std::string_view key, std::string_view value) {
  uint64_t number = 0;
  auto [ptr, ec] =
      std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec != std::errc()) {
    return InvalidArgumentError("setting {}: '{}' is not a byte count", key,
                                value);
  }
  std::string_view suffix = value.substr(ptr - value.data());
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KiB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GiB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TiB") {
    shift = 40;
  } else {
    return InvalidArgumentError("setting {}: unknown unit in '{}'", key, value);
  }
  if (shift > 0 && number > (~uint64_t{0} >> shift)) {
    return OutOfRangeError("setting {}: '{}' is too large", key, value);
  }
  return number << shift;
}

// A switch: "0" or "1".
StatusOr<bool> ParseSwitch(std::string_view key, std::string_view value) {
  if (value != "0" && value != "1") {
    return InvalidArgumentError("setting {}: '{}' is not 0 or 1", key, value);
  }
  return value == "1";
}

// `value` read whole as a decimal number (nullopt: empty or not a number).
std::optional<double> ParseNumber(std::string_view value) {
  const std::string copy(value);
  char* end_ptr = nullptr;
  const double number = std::strtod(copy.c_str(), &end_ptr);
  if (copy.empty() || end_ptr != copy.c_str() + copy.size())
    return std::nullopt;
  return number;
}

}  // namespace

Status ParseSettings(std::string_view text, Settings& settings) {
  Settings out = settings;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find_first_of(";\n", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = TrimBlanks(text.substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError("setting '{}' has no '='", item);
    }
    std::string_view key = TrimBlanks(item.substr(0, eq));
    std::string_view value = TrimBlanks(item.substr(eq + 1));
    if (key == "backend") {
      if (value != "cuda" && value != "host" && value != "async" &&
          value != "fake") {
        return InvalidArgumentError(
            "backend '{}' is not cuda, host, async or fake", value);
      }
      out.backend = std::string(value);
    } else if (key == "granularity") {
      LOOM_ASSIGN_OR_RETURN(out.granularity, ParseBytes(key, value));
    } else if (key == "device_memory") {
      LOOM_ASSIGN_OR_RETURN(out.device_memory, ParseBytes(key, value));
    } else if (key == "cap") {
      LOOM_ASSIGN_OR_RETURN(out.cap, ParseBytes(key, value));
    } else if (key == "record") {
      LOOM_ASSIGN_OR_RETURN(out.record, ParseBytes(key, value));
      if (out.record > (uint64_t{1} << 32)) {
        return OutOfRangeError("setting record: {} events is too many",
                               out.record);
      }
    } else if (key == "devices") {
      int devices = 0;
      auto [ptr, ec] =
          std::from_chars(value.data(), value.data() + value.size(), devices);
      if (ec != std::errc() || ptr != value.data() + value.size() ||
          devices < 1 || devices > 64) {
        return InvalidArgumentError("setting devices: '{}' is not in 1..64",
                                    value);
      }
      out.devices = devices;
    } else if (key == "fraction") {
      std::optional<double> fraction = ParseNumber(value);
      if (!fraction || !(*fraction >= 0) || *fraction > 1) {
        return InvalidArgumentError("setting fraction: '{}' is not in [0, 1]",
                                    value);
      }
      out.fraction = *fraction;
    } else if (key == "plan") {
      out.plan = std::string(value);
    } else if (key == "replan") {
      LOOM_ASSIGN_OR_RETURN(out.replan, ParseSwitch(key, value));
    } else if (key == "stitch") {
      LOOM_ASSIGN_OR_RETURN(out.stitch, ParseSwitch(key, value));
    } else if (key == "replan_time_limit") {
      std::optional<double> seconds = ParseNumber(value);
      if (!seconds || !(*seconds > 0) || *seconds > 3600) {
        return InvalidArgumentError(
            "setting replan_time_limit: '{}' is not in (0, 3600] seconds",
            value);
      }
      out.replan_time_limit = *seconds;
    } else if (key == "max_chunk_pages" || key == "host_sample_every") {
      uint32_t n = 0;
      auto [ptr, ec] =
          std::from_chars(value.data(), value.data() + value.size(), n);
      const bool whole =
          ec == std::errc() && ptr == value.data() + value.size();
      if (key == "max_chunk_pages") {
        if (!whole || n < 1 || n > vmm::PagePool::kMaxChunkPages) {
          return InvalidArgumentError(
              "setting max_chunk_pages: '{}' is not in 1..{}", value,
              vmm::PagePool::kMaxChunkPages);
        }
        out.max_chunk_pages = n;
      } else {
        if (!whole || n > HostTiming::kMaxEvery || (n & (n - 1)) != 0) {
          return InvalidArgumentError(
              "setting host_sample_every: '{}' is not 0 or a power of two up "
              "to {}",
              value, HostTiming::kMaxEvery);
        }
        out.host_sample_every = n;
      }
    } else if (key == "peers") {
      if (value != "auto" && value != "none") {
        return InvalidArgumentError("setting peers: '{}' is not auto or none",
                                    value);
      }
      out.peers = std::string(value);
    } else {
      return InvalidArgumentError("unknown setting '{}'", key);
    }
  }
  settings = out;
  return OkStatus();
}

Runtime& Runtime::Get() {
  static Runtime* runtime = new Runtime();  // never destroyed: outlives tensors
  return *runtime;
}

Status Runtime::Configure(std::string_view text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!allocators_.empty() || driver_ != nullptr) {
    return FailedPreconditionError(
        "loom is already serving allocations; configure it before the first "
        "one "
        "(or shut it down first)");
  }
  LOOM_RETURN_IF_ERROR(ParseSettings(text, settings_));
  HostTiming::Get().set_every(settings_.host_sample_every);
  return OkStatus();
}

StatusOr<vmm::Allocator*> Runtime::AllocatorFor(int device) {
  // The hot path (every malloc and free): no process-wide lock once the
  // device's allocator exists; the allocator has its own.
  if (device >= 0 && device < kMaxDevices) {
    vmm::Allocator* known = fast_[device].load(std::memory_order_acquire);
    if (known != nullptr) return known;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return AllocatorForLocked(device);
}

StatusOr<vmm::Allocator*> Runtime::AllocatorForLocked(int device) {
  if (device < 0 || device >= kMaxDevices)
    return InvalidArgumentError("bad device {}", device);
  if (static_cast<size_t>(device) < allocators_.size() &&
      allocators_[device] != nullptr) {
    return allocators_[device].get();
  }
  if (driver_ == nullptr) {
    vmm::DriverOptions options;
    options.granularity = settings_.granularity;
    options.device_count = settings_.devices;
    options.capacity_per_device = settings_.device_memory;
    LOOM_ASSIGN_OR_RETURN(driver_, vmm::OpenDriver(settings_.backend, options));
  }
  vmm::AllocatorOptions options;
  options.device = device;
  options.memory_cap_bytes = settings_.cap;
  options.memory_fraction = settings_.fraction;
  options.record_capacity = settings_.record;
  options.max_chunk_pages = settings_.max_chunk_pages;
  options.stitch_idle_chunks = settings_.stitch;
  if (settings_.peers == "auto") {
    // Every device that can reach this one's memory gets access to it, as
    // PyTorch enables peer access between devices that support it.
    LOOM_ASSIGN_OR_RETURN(int count, driver_->DeviceCount());
    for (int peer = 0; peer < count; ++peer) {
      StatusOr<bool> can = driver_->CanAccessPeer(device, peer);
      if (can.ok() && *can) options.peer_devices.push_back(peer);
    }
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<vmm::Allocator> allocator,
                        vmm::Allocator::Create(*driver_, options));
  if (!settings_.plan.empty()) {
    LOOM_ASSIGN_OR_RETURN(
        uint64_t granularity,
        driver_->GetGranularity(device, vmm::Granularity::kMinimum));
    LOOM_ASSIGN_OR_RETURN(vmm::RuntimePlan plan,
                          vmm::ReadRuntimePlan(settings_.plan, granularity));
    LOOM_RETURN_IF_ERROR(allocator->LoadPlan(std::move(plan)));
  }
  // Bring the new device up to the markers' current state.
  if (markers_.in_iteration) allocator->IterationBegin(markers_.iteration);
  if (!markers_.phase.empty()) allocator->Phase(markers_.phase);
  for (const auto& [name, dynamic] : markers_.modules) {
    allocator->ModuleEnter(name, dynamic);
  }
  if (allocators_.size() <= static_cast<size_t>(device)) {
    allocators_.resize(device + 1);
  }
  allocators_[device] = std::move(allocator);
  if (settings_.replan) {
    if (replanners_.size() <= static_cast<size_t>(device)) {
      replanners_.resize(device + 1);
    }
    autoplan::ReplanOptions replan;
    replan.background = true;  // training goes on while it plans
    replan.plan_options.time_limit_seconds = settings_.replan_time_limit;
    replanners_[device] =
        std::make_unique<autoplan::Replanner>(*allocators_[device], replan);
  }
  fast_[device].store(allocators_[device].get(), std::memory_order_release);
  return allocators_[device].get();
}

std::vector<vmm::Allocator*> Runtime::Allocators() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<vmm::Allocator*> out;
  for (auto& a : allocators_) {
    if (a != nullptr) out.push_back(a.get());
  }
  return out;
}

vmm::Allocator* Runtime::ExistingAllocator(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || static_cast<size_t>(device) >= allocators_.size())
    return nullptr;
  return allocators_[device].get();
}

void Runtime::StopRecording() {
  std::lock_guard<std::mutex> lock(mu_);
  settings_.record = 0;
  for (auto& a : allocators_) {
    if (a != nullptr) a->StopRecording();
  }
}

Status Runtime::LoadPlan(int device, const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(vmm::Allocator * allocator, AllocatorFor(device));
  uint64_t granularity;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOOM_ASSIGN_OR_RETURN(granularity, driver_->GetGranularity(
                                           device, vmm::Granularity::kMinimum));
  }
  LOOM_ASSIGN_OR_RETURN(vmm::RuntimePlan plan,
                        vmm::ReadRuntimePlan(path, granularity));
  return allocator->LoadPlan(std::move(plan));
}

Status Runtime::WriteTrace(int device, const std::string& path) {
  vmm::Allocator* allocator = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (settings_.record == 0) {
      return FailedPreconditionError(
          "no trace is being recorded (configure record=EVENTS first)");
    }
    if (device < 0 || static_cast<size_t>(device) >= allocators_.size() ||
        allocators_[device] == nullptr) {
      return FailedPreconditionError("device {} has served no allocation yet",
                                     device);
    }
    allocator = allocators_[device].get();
  }
  plan::TraceFormat format =
      path.size() >= 4 && path.substr(path.size() - 4) == ".ltt"
          ? plan::TraceFormat::kText
          : plan::TraceFormat::kBinary;
  plan::Trace trace = allocator->RecordedTrace();
  if (allocator->stats().trace_truncated) {
    return OutOfRangeError(
        "the trace buffer filled up ({} events); record with a larger "
        "record=EVENTS",
        settings_.record);
  }
  return plan::WriteTrace(path, trace, format);
}

Status Runtime::SetMemoryFraction(double fraction, int device) {
  (void)device;
  if (!(fraction >= 0) || fraction > 1) {
    return InvalidArgumentError("memory fraction {} is not in [0, 1]",
                                fraction);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!allocators_.empty()) {
    return FailedPreconditionError(
        "loom applies a memory fraction only before the first allocation "
        "(set it with loom.enable(fraction=...))");
  }
  settings_.fraction = fraction;
  return OkStatus();
}

void Runtime::IterationBegin(uint64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  markers_.in_iteration = true;
  markers_.iteration = number;
  for (size_t d = 0; d < allocators_.size(); ++d) {
    if (allocators_[d] == nullptr) continue;
    if (d < replanners_.size() && replanners_[d] != nullptr) {
      replanners_[d]->BeforeIterationBegin();
    }
    allocators_[d]->IterationBegin(number);
  }
}

std::string Runtime::StatsJson(int device) {
  vmm::Allocator* a = ExistingAllocator(device);
  std::string json =
      a != nullptr ? a->stats().ToJson() : vmm::AllocatorStats{}.ToJson();
  autoplan::ReplanStats r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (device >= 0 && static_cast<size_t>(device) < replanners_.size() &&
        replanners_[device] != nullptr) {
      r = replanners_[device]->stats();
    } else {
      r.state = settings_.replan ? "waiting" : "off";
    }
  }
  // Appended to the allocator's object: the re-planner's figures.
  json.pop_back();  // '}'
  json += fmt::format(
      ",\"loom.replan_attempts\":{},\"loom.replans\":{},"
      "\"loom.replan_duplicates\":{},\"loom.replan_failures\":{},"
      "\"loom.replan_state\":{},\"loom.replan_error\":{}}}",
      r.attempts, r.replans, r.duplicates, r.failures,
      JsonWriter::Quote(r.state), JsonWriter::Quote(r.last_error));
  // And the C ABI's sampled host time.
  json.pop_back();  // '}'
  json += HostTiming::Get().JsonMembers();
  json += '}';
  return json;
}

void Runtime::IterationEnd(uint64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  markers_.in_iteration = false;
  for (auto& a : allocators_) {
    if (a != nullptr) a->IterationEnd(number);
  }
}

void Runtime::Phase(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  markers_.phase = std::string(name);
  for (auto& a : allocators_) {
    if (a != nullptr) a->Phase(name);
  }
}

void Runtime::ModuleEnter(std::string_view name, bool dynamic) {
  std::lock_guard<std::mutex> lock(mu_);
  markers_.modules.emplace_back(std::string(name), dynamic);
  for (auto& a : allocators_) {
    if (a != nullptr) a->ModuleEnter(name, dynamic);
  }
}

void Runtime::ModuleExit(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = markers_.modules.rbegin(); it != markers_.modules.rend();
       ++it) {
    if (it->first == name) {
      markers_.modules.erase(std::next(it).base());
      break;
    }
  }
  for (auto& a : allocators_) {
    if (a != nullptr) a->ModuleExit(name);
  }
}

Status Runtime::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& a : allocators_) {
    if (a != nullptr && a->stats().active_bytes.current != 0) {
      return FailedPreconditionError(
          "cannot shut down: {} bytes still allocated",
          a->stats().active_bytes.current);
    }
  }
  for (std::atomic<vmm::Allocator*>& a : fast_) {
    a.store(nullptr, std::memory_order_release);
  }
  replanners_.clear();  // joins a planner still running
  allocators_.clear();
  driver_.reset();
  markers_ = MarkerState{};
  return OkStatus();
}

void SetLastError(const Status& status) { last_error = status.ToString(); }
const char* LastError() { return last_error.c_str(); }

}  // namespace loom::plugin
