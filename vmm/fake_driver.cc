#include "vmm/fake_driver.h"

#include <cstring>

namespace loom::vmm {

FakeDriver::FakeDriver(FakeDriverOptions options)
    : options_(options),
      injections_(kDriverOpCount),
      always_(kDriverOpCount),
      used_per_device_(options.device_count, 0) {
  LOOM_CHECK(options_.granularity > 0 && options_.granularity % 4096 == 0,
             "fake granularity {} must be a positive multiple of 4096",
             options_.granularity);
  LOOM_CHECK(options_.device_count > 0);
}

FakeDriver::~FakeDriver() = default;

void FakeDriver::InjectFailure(DriverOp op, int nth, Status status) {
  LOOM_CHECK(nth >= 1 && !status.ok());
  std::lock_guard<std::mutex> lock(mu_);
  injections_[static_cast<size_t>(op)].push_back({nth, std::move(status)});
}

void FakeDriver::FailAlways(DriverOp op, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  always_[static_cast<size_t>(op)] = std::move(status);
}

void FakeDriver::ClearFailures() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& list : injections_) list.clear();
  for (auto& status : always_) status = OkStatus();
}

Status FakeDriver::MaybeFail(DriverOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t index = static_cast<size_t>(op);
  if (!always_[index].ok()) return always_[index];
  Status result;
  auto& list = injections_[index];
  for (auto it = list.begin(); it != list.end();) {
    if (--it->countdown == 0) {
      if (result.ok()) result = it->status;
      it = list.erase(it);
    } else {
      ++it;
    }
  }
  return result;
}

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
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kCreate));
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
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kRelease));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  LOOM_CHECK(it != handles_.end());
  used_per_device_[it->second.first] -= it->second.second;
  handles_.erase(it);
  return OkStatus();
}

StatusOr<DevicePtr> FakeDriver::DoReserve(uint64_t size, uint64_t alignment) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kReserve));
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

Status FakeDriver::DoUnreserve(DevicePtr, uint64_t) {
  return MaybeFail(DriverOp::kUnreserve);
}

Status FakeDriver::DoMap(DevicePtr, uint64_t, uint64_t, uint64_t) {
  return MaybeFail(DriverOp::kMap);
}

Status FakeDriver::DoUnmap(DevicePtr, uint64_t) {
  return MaybeFail(DriverOp::kUnmap);
}

Status FakeDriver::DoSetAccess(DevicePtr, uint64_t, int, std::span<const int>) {
  return MaybeFail(DriverOp::kSetAccess);
}

StatusOr<bool> FakeDriver::DoCanAccessPeer(int, int) { return true; }

StatusOr<Stream> FakeDriver::DoCreateStream(int) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kCreateStream));
  std::lock_guard<std::mutex> lock(mu_);
  // Fake stream handles look like pointers but are never dereferenced.
  Stream stream = (uint64_t{0x5eed} << 32) + next_stream_++;
  streams_.insert(stream);
  return stream;
}

Status FakeDriver::DoDestroyStream(Stream stream) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kDestroyStream));
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_.erase(stream) == 0) {
    return InvalidArgumentError("destroy_stream: {:#x} was not created here",
                                stream);
  }
  return OkStatus();
}

Status FakeDriver::DoSynchronizeStream(Stream stream) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kSynchronizeStream));
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, event] : events_) {
    if (event.recorded && event.stream == stream) event.complete = true;
  }
  return OkStatus();
}

StatusOr<uint64_t> FakeDriver::DoCreateEvent(int) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kCreateEvent));
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_event_++;
  events_[id] = EventState{};
  return id;
}

Status FakeDriver::DoDestroyEvent(uint64_t event) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kDestroyEvent));
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(event) == 0) {
    return InvalidArgumentError("destroy_event: {} is not a live event", event);
  }
  return OkStatus();
}

Status FakeDriver::DoRecordEvent(uint64_t event, Stream stream) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kRecordEvent));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("record_event: {} is not a live event", event);
  }
  it->second = EventState{true, events_complete_immediately_, stream};
  return OkStatus();
}

StatusOr<bool> FakeDriver::DoQueryEvent(uint64_t event) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kQueryEvent));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("query_event: {} is not a live event", event);
  }
  return it->second.complete;
}

Status FakeDriver::DoSynchronizeEvent(uint64_t event) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kSynchronizeEvent));
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
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kStreamWaitEvent));
  std::lock_guard<std::mutex> lock(mu_);
  if (!events_.contains(event)) {
    return InvalidArgumentError("stream_wait_event: {} is not a live event",
                                event);
  }
  return OkStatus();
}

Status FakeDriver::DoSynchronizeDevice(int) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kSynchronizeDevice));
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, event] : events_) {
    if (event.recorded) event.complete = true;
  }
  return OkStatus();
}

Status FakeDriver::DoCopyToDevice(DevicePtr, const void*, uint64_t) {
  return MaybeFail(DriverOp::kCopyToDevice);
}

Status FakeDriver::DoCopyToHost(void* dst, DevicePtr, uint64_t size) {
  LOOM_RETURN_IF_ERROR(MaybeFail(DriverOp::kCopyToHost));
  std::memset(dst, 0, size);
  return OkStatus();
}

Status FakeDriver::DoMemset(DevicePtr, uint8_t, uint64_t) {
  return MaybeFail(DriverOp::kMemset);
}

}  // namespace loom::vmm
