// FakeDriver: a bookkeeping-only Driver for tests and dry runs.
//
// Addresses are handed out by a bump pointer from a high base and are never
// dereferenced; handles and events are counters. The base Driver class checks
// the full contract, so misuse is caught exactly as on the other backends.
// On top of that the fake offers what tests need:
//  - a configurable granularity, device count and per-device capacity
//    (Create fails with OUT_OF_MEMORY beyond it);
//  - events that stay pending until CompleteEvents() when
//    set_events_complete_immediately(false), to test stream-ordered reuse;
//  - copies and memsets are checked against the contract but move no data
//    (holds_data() is false; CopyToHost writes zeros).
// Thread-safe.
#ifndef LOOM_VMM_FAKE_DRIVER_H_
#define LOOM_VMM_FAKE_DRIVER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vmm/driver.h"

namespace loom::vmm {

struct FakeDriverOptions {
  uint64_t granularity = uint64_t{2} << 20;  // bytes
  int device_count = 1;
  uint64_t capacity_per_device = uint64_t{80}
                                 << 30;  // bytes of physical memory
};

class FakeDriver final : public Driver {
 public:
  explicit FakeDriver(FakeDriverOptions options = {});
  ~FakeDriver() override;

  std::string_view name() const override { return "fake"; }
  bool holds_data() const override { return false; }

  // With false, recorded events stay pending until CompleteEvents() or a
  // synchronize call on their stream/event.
  void set_events_complete_immediately(bool value);
  // Completes every pending event.
  void CompleteEvents();
  // Events recorded and not yet complete.
  size_t pending_events() const;

 protected:
  StatusOr<int> DoDeviceCount() override;
  StatusOr<DeviceProperties> DoProperties(int device) override;
  StatusOr<uint64_t> DoGranularity(int device, Granularity kind) override;
  StatusOr<uint64_t> DoCreate(int device, uint64_t size) override;
  Status DoRelease(uint64_t handle) override;
  StatusOr<DevicePtr> DoReserve(uint64_t size, uint64_t alignment) override;
  Status DoUnreserve(DevicePtr ptr, uint64_t size) override;
  Status DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
               uint64_t offset) override;
  Status DoUnmap(DevicePtr ptr, uint64_t size) override;
  Status DoSetAccess(DevicePtr ptr, uint64_t size, int device,
                     std::span<const int> peers) override;
  StatusOr<bool> DoCanAccessPeer(int device, int peer) override;
  StatusOr<Stream> DoCreateStream(int device) override;
  Status DoDestroyStream(Stream stream) override;
  Status DoSynchronizeStream(Stream stream) override;
  StatusOr<uint64_t> DoCreateEvent(int device) override;
  Status DoDestroyEvent(uint64_t event) override;
  Status DoRecordEvent(uint64_t event, Stream stream) override;
  StatusOr<bool> DoQueryEvent(uint64_t event) override;
  Status DoSynchronizeEvent(uint64_t event) override;
  Status DoStreamWaitEvent(Stream stream, uint64_t event) override;
  Status DoSynchronizeDevice(int device) override;
  Status DoCopyToDevice(DevicePtr dst, const void* src, uint64_t size) override;
  Status DoCopyToHost(void* dst, DevicePtr src, uint64_t size) override;
  Status DoMemset(DevicePtr dst, uint8_t value, uint64_t size) override;

 private:
  const FakeDriverOptions options_;
  mutable std::mutex mu_;
  std::vector<uint64_t> used_per_device_;
  std::unordered_map<uint64_t, std::pair<int, uint64_t>>
      handles_;  // device, size
  uint64_t next_handle_ = 1;
  uint64_t next_address_ = uint64_t{1} << 44;
  uint64_t next_stream_ = 1;
  std::unordered_set<uint64_t> streams_;
  struct EventState {
    bool recorded = false;
    bool complete = true;
    Stream stream = 0;
  };
  std::unordered_map<uint64_t, EventState> events_;
  uint64_t next_event_ = 1;
  bool events_complete_immediately_ = true;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_FAKE_DRIVER_H_
