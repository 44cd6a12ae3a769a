// Runtime: the process-wide state behind libloom.so's C ABI.
//
// Holds the settings, the one Driver of the process and one Allocator per
// device (created on the device's first use). Parses settings strings,
// converts failures into status codes plus a per-thread message, and turns
// plan files into the allocator's RuntimePlan. Thread-safe: a process-wide
// mutex guards configuration and creation; malloc and free find their
// device's allocator without it (each allocator has its own lock).
#ifndef LOOM_TORCH_PLUGIN_RUNTIME_H_
#define LOOM_TORCH_PLUGIN_RUNTIME_H_

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "autoplan/replanner.h"
#include "base/status.h"
#include "vmm/allocator.h"
#include "vmm/driver.h"

namespace loom::plugin {

struct Settings {
  std::string backend = "cuda";
  uint64_t granularity = uint64_t{2} << 20;
  uint64_t device_memory = uint64_t{80} << 30;
  int devices = 1;
  uint64_t cap = 0;
  double fraction = 0;
  uint64_t record = 0;
  std::string plan;
  std::string peers = "auto";  // auto: every device that can access; none
  // Re-planning (autoplan/replanner.h): an iteration no installed plan
  // fits is recorded and planned as a new plan variant in the background.
  bool replan = false;
  double replan_time_limit = 5;  // planner seconds per re-plan
  // The largest physical handle, in granules (vmm::AllocatorOptions).
  uint32_t max_chunk_pages = 512;
  // The arena stitches idle chunks instead of growing past its peak
  // (vmm::AllocatorOptions::stitch_idle_chunks).
  bool stitch = true;
  // One C ABI call in this many is timed (host_timing.h); 0 = none.
  uint32_t host_sample_every = 256;
};

// Parses "key=value;key=value" into `settings` (starting from its values).
Status ParseSettings(std::string_view text, Settings& settings);

class Runtime {
 public:
  static Runtime& Get();

  Status Configure(std::string_view text);
  // The allocator of `device`, created on first use.
  StatusOr<vmm::Allocator*> AllocatorFor(int device);
  // Every allocator created so far.
  std::vector<vmm::Allocator*> Allocators();
  // The allocator of `device` if it exists already, else nullptr.
  vmm::Allocator* ExistingAllocator(int device);
  // Stops recording on every device, now and for devices used later.
  void StopRecording();
  Status LoadPlan(int device, const std::string& path);
  Status WriteTrace(int device, const std::string& path);
  Status SetMemoryFraction(double fraction, int device);
  // The device's statistics as JSON (torch.cuda.memory_stats() keys and
  // loom.*, re-planning included); all zero for a device not used yet.
  std::string StatsJson(int device);

  // Markers, for every device. Devices first used later start from the
  // current state (open iteration, phase, open modules).
  void IterationBegin(uint64_t number);
  void IterationEnd(uint64_t number);
  void Phase(std::string_view name);
  void ModuleEnter(std::string_view name, bool dynamic);
  void ModuleExit(std::string_view name);
  Status Shutdown();

 private:
  Runtime() = default;
  StatusOr<vmm::Allocator*> AllocatorForLocked(int device);

  // What the markers have said so far, for allocators created later.
  struct MarkerState {
    bool in_iteration = false;
    uint64_t iteration = 0;
    std::string phase;
    std::vector<std::pair<std::string, bool>> modules;  // open, outermost first
  };

  static constexpr int kMaxDevices = 1024;
  std::mutex mu_;
  // Allocators by device for the lock-free lookup of AllocatorFor (set once
  // created, cleared by Shutdown, which requires nothing live).
  std::array<std::atomic<vmm::Allocator*>, kMaxDevices> fast_{};
  Settings settings_;
  MarkerState markers_;
  std::unique_ptr<vmm::Driver> driver_;
  std::vector<std::unique_ptr<vmm::Allocator>> allocators_;  // by device
  // With replan=1, one per allocator (same index); destroyed first.
  std::vector<std::unique_ptr<autoplan::Replanner>> replanners_;
};

// The calling thread's last error message.
void SetLastError(const Status& status);
const char* LastError();

}  // namespace loom::plugin

#endif  // LOOM_TORCH_PLUGIN_RUNTIME_H_
