// HostDriver: CUDA's virtual-memory model implemented with real CPU virtual
// memory, so aliasing, stomping and data integrity can be tested for real.
//
//  - physical memory is one sparse memfd; a handle is an offset range in it;
//  - a reservation is a PROT_NONE anonymous mapping (MAP_NORESERVE);
//  - Map is mmap(MAP_FIXED | MAP_SHARED) of the handle's memfd range over the
//    reservation, still PROT_NONE; SetAccess makes it read-write;
//  - Unmap puts a PROT_NONE anonymous mapping back;
//  - Release punches the handle's range out of the memfd (its RAM is freed).
// Two virtual ranges mapped to one handle really alias. Untouched pages cost
// no RAM, so an 80 GB trace replays on a small machine. Physical memory per
// device is capped (`capacity_per_device`, default 80 GiB): Create beyond it
// fails with OUT_OF_MEMORY. Streams and events are synchronous (an event is
// complete as soon as it is recorded). Thread-safe.
#ifndef LOOM_VMM_HOST_DRIVER_H_
#define LOOM_VMM_HOST_DRIVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "vmm/driver.h"

namespace loom::vmm {

struct HostDriverOptions {
  uint64_t granularity = uint64_t{2} << 20;  // bytes, multiple of the OS page
  int device_count = 1;
  uint64_t capacity_per_device = uint64_t{80} << 30;
};

class HostDriver : public Driver {
 public:
  // Creates the memfd. Fails (UNAVAILABLE) if the system refuses it, or
  // INVALID_ARGUMENT for options that cannot work.
  static StatusOr<std::unique_ptr<HostDriver>> Open(
      HostDriverOptions options = {});
  ~HostDriver() override;

  std::string_view name() const override { return "host"; }
  bool holds_data() const override { return true; }

  // Bytes of RAM the memfd really uses (pages touched and not punched out).
  StatusOr<uint64_t> ResidentBytes() const;

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

 protected:
  // The memfd behind a driver with `options` (checked): (fd, file size).
  static StatusOr<std::pair<int, uint64_t>> OpenFile(
      const HostDriverOptions& options);
  HostDriver(HostDriverOptions options, int fd, uint64_t file_size);
  const HostDriverOptions& options() const { return options_; }
  // Where `handle`'s bytes start in the memfd. REQUIRES: a live handle.
  uint64_t HandleFileOffset(uint64_t handle) const;

 private:
  // First-fit allocation of `size` bytes of memfd offsets for a device.
  // REQUIRES: mu_ held.
  StatusOr<uint64_t> AllocateFileRange(int device, uint64_t size);
  void FreeFileRange(int device, uint64_t offset, uint64_t size);

  const HostDriverOptions options_;
  const int fd_;
  const uint64_t region_per_device_;  // memfd bytes set aside per device

  mutable std::mutex mu_;
  struct HandleState {
    int device;
    uint64_t file_offset;
    uint64_t size;
  };
  std::unordered_map<uint64_t, HandleState> handles_;
  std::vector<std::map<uint64_t, uint64_t>>
      free_ranges_;  // per device: offset -> size
  std::vector<uint64_t> used_per_device_;
  std::map<uint64_t, uint64_t> reservations_;  // ptr -> size, for cleanup
  uint64_t next_handle_ = 1;
  uint64_t next_event_ = 1;
  std::unordered_set<uint64_t> events_;
  uint64_t next_stream_ = 1;
  std::unordered_set<uint64_t> streams_;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_HOST_DRIVER_H_
