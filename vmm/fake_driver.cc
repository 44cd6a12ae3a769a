#include "vmm/fake_driver.h"

#include <cstring>

namespace loom::vmm {

FakeDriver::FakeDriver(FakeDriverOptions options)
    : options_(options), used_per_device_(options.device_count, 0) {
  LOOM_CHECK(options_.granularity > 0 && options_.granularity % 4096 == 0,
             "fake granularity {} must be a positive multiple of 4096",
             options_.granularity);
  LOOM_CHECK(options_.device_count > 0);
}

FakeDriver::~FakeDriver() = default;

void FakeDriver::set_events_complete_immediately(bool value) {
  std::lock_guard<std::mutex> lock(mu_);
  events_complete_immediately_ = value;
}

void FakeDriver::CompleteEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, event] : events_) event.complete = true;
}

size_t FakeDriver::pending_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, event] : events_)
    n += event.recorded && !event.complete;
  return n;
}

StatusOr<int> FakeDriver::DoDeviceCount() { return options_.device_count; }

StatusOr<DeviceProperties> FakeDriver::DoProperties(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceProperties p;
  p.ordinal = device;
  p.name = fmt::format("loom fake device {}", device);
  p.total_bytes = options_.capacity_per_device;
  p.free_bytes = options_.capacity_per_device - used_per_device_[device];
  p.granularity_minimum = options_.granularity;
  p.granularity_recommended = options_.granularity;
  return p;
}

StatusOr<uint64_t> FakeDriver::DoGranularity(int, Granularity) {
  return options_.granularity;
}

StatusOr<uint64_t> FakeDriver::DoCreate(int device, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& used = used_per_device_[device];
  if (size > options_.capacity_per_device - used) {
    return OutOfMemoryError(
        "fake device {}: cannot create {} bytes, {} of {} in use", device, size,
        used, options_.capacity_per_device);
  }
  used += size;
  uint64_t handle = next_handle_++;
  handles_[handle] = {device, size};
  return handle;
}

Status FakeDriver::DoRelease(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  LOOM_CHECK(it != handles_.end());
  used_per_device_[it->second.first] -= it->second.second;
  handles_.erase(it);
  return OkStatus();
}

StatusOr<DevicePtr> FakeDriver::DoReserve(uint64_t size, uint64_t alignment) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t ptr = (next_address_ + alignment - 1) / alignment * alignment;
  if (ptr + size < ptr || ptr + size > (uint64_t{1} << 56)) {
    return OutOfMemoryError("fake: virtual address space exhausted");
  }
  // Leave a one-granule hole after each reservation so that neighbouring
  // reservations never look contiguous.
  next_address_ = ptr + size + options_.granularity;
  return ptr;
}

Status FakeDriver::DoUnreserve(DevicePtr, uint64_t) { return OkStatus(); }

Status FakeDriver::DoMap(DevicePtr, uint64_t, uint64_t, uint64_t) {
  return OkStatus();
}

Status FakeDriver::DoUnmap(DevicePtr, uint64_t) { return OkStatus(); }

Status FakeDriver::DoSetAccess(DevicePtr, uint64_t, int, std::span<const int>) {
  return OkStatus();
}

StatusOr<bool> FakeDriver::DoCanAccessPeer(int, int) { return true; }

StatusOr<Stream> FakeDriver::DoCreateStream(int) {
  std::lock_guard<std::mutex> lock(mu_);
  // Fake stream handles look like pointers but are never dereferenced.
  Stream stream = (uint64_t{0x5eed} << 32) + next_stream_++;
  streams_.insert(stream);
  return stream;
}

Status FakeDriver::DoDestroyStream(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_.erase(stream) == 0) {
    return InvalidArgumentError("destroy_stream: {:#x} was not created here",
                                stream);
  }
  return OkStatus();
}

Status FakeDriver::DoSynchronizeStream(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, event] : events_) {
    if (event.recorded && event.stream == stream) event.complete = true;
  }
  return OkStatus();
}

StatusOr<uint64_t> FakeDriver::DoCreateEvent(int) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_event_++;
  events_[id] = EventState{};
  return id;
}

Status FakeDriver::DoDestroyEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(event) == 0) {
    return InvalidArgumentError("destroy_event: {} is not a live event", event);
  }
  return OkStatus();
}

Status FakeDriver::DoRecordEvent(uint64_t event, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("record_event: {} is not a live event", event);
  }
  it->second = EventState{true, events_complete_immediately_, stream};
  return OkStatus();
}

StatusOr<bool> FakeDriver::DoQueryEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("query_event: {} is not a live event", event);
  }
  return it->second.complete;
}

Status FakeDriver::DoSynchronizeEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("synchronize_event: {} is not a live event",
                                event);
  }
  it->second.complete = true;
  return OkStatus();
}

Status FakeDriver::DoStreamWaitEvent(Stream, uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!events_.contains(event)) {
    return InvalidArgumentError("stream_wait_event: {} is not a live event",
                                event);
  }
  return OkStatus();
}

Status FakeDriver::DoSynchronizeDevice(int) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, event] : events_) {
    if (event.recorded) event.complete = true;
  }
  return OkStatus();
}

Status FakeDriver::DoCopyToDevice(DevicePtr, const void*, uint64_t) {
  return OkStatus();
}

Status FakeDriver::DoCopyToHost(void* dst, DevicePtr, uint64_t size) {
  std::memset(dst, 0, size);
  return OkStatus();
}

Status FakeDriver::DoMemset(DevicePtr, uint8_t, uint64_t) { return OkStatus(); }

}  // namespace loom::vmm
