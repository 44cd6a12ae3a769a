#include "vmm/driver.h"

namespace loom::vmm {

std::string_view DriverOpName(DriverOp op) {
  switch (op) {
    case DriverOp::kCreate:
      return "create";
    case DriverOp::kRelease:
      return "release";
    case DriverOp::kReserve:
      return "reserve";
    case DriverOp::kUnreserve:
      return "unreserve";
    case DriverOp::kMap:
      return "map";
    case DriverOp::kUnmap:
      return "unmap";
    case DriverOp::kSetAccess:
      return "set_access";
    case DriverOp::kCreateStream:
      return "create_stream";
    case DriverOp::kDestroyStream:
      return "destroy_stream";
    case DriverOp::kSynchronizeStream:
      return "synchronize_stream";
    case DriverOp::kCreateEvent:
      return "create_event";
    case DriverOp::kDestroyEvent:
      return "destroy_event";
    case DriverOp::kRecordEvent:
      return "record_event";
    case DriverOp::kQueryEvent:
      return "query_event";
    case DriverOp::kSynchronizeEvent:
      return "synchronize_event";
    case DriverOp::kStreamWaitEvent:
      return "stream_wait_event";
    case DriverOp::kSynchronizeDevice:
      return "synchronize_device";
    case DriverOp::kCopyToDevice:
      return "copy_to_device";
    case DriverOp::kCopyToHost:
      return "copy_to_host";
    case DriverOp::kMemset:
      return "memset";
    case DriverOp::kMemsetAsync:
      return "memset_async";
    case DriverOp::kCopyToHostAsync:
      return "copy_to_host_async";
    case DriverOp::kCount:
      break;
  }
  return "unknown";
}

StatusOr<int> Driver::DeviceCount() { return DoDeviceCount(); }

StatusOr<DeviceProperties> Driver::Properties(int device) {
  LOOM_ASSIGN_OR_RETURN(int count, DoDeviceCount());
  if (device < 0 || device >= count) {
    return InvalidArgumentError("device {} does not exist ({} devices)", device,
                                count);
  }
  return DoProperties(device);
}

StatusOr<uint64_t> Driver::GetGranularity(int device, Granularity kind) {
  LOOM_ASSIGN_OR_RETURN(int count, DoDeviceCount());
  if (device < 0 || device >= count) {
    return InvalidArgumentError("device {} does not exist ({} devices)", device,
                                count);
  }
  return DoGranularity(device, kind);
}

StatusOr<uint64_t> Driver::MinimumGranularityLocked(int device) {
  if (device < 0) return InvalidArgumentError("negative device {}", device);
  if (static_cast<size_t>(device) < granularity_.size() &&
      granularity_[device] != 0) {
    return granularity_[device];
  }
  LOOM_ASSIGN_OR_RETURN(int count, DoDeviceCount());
  if (device >= count) {
    return InvalidArgumentError("device {} does not exist ({} devices)", device,
                                count);
  }
  LOOM_ASSIGN_OR_RETURN(uint64_t granularity,
                        DoGranularity(device, Granularity::kMinimum));
  if (granularity == 0) {
    return InternalError("device {} reports granularity 0", device);
  }
  if (granularity_.size() <= static_cast<size_t>(device)) {
    granularity_.resize(device + 1, 0);
  }
  granularity_[device] = granularity;
  return granularity;
}

StatusOr<PhysicalHandle> Driver::Create(int device, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_ASSIGN_OR_RETURN(uint64_t granularity, MinimumGranularityLocked(device));
  LOOM_RETURN_IF_ERROR(contract_.CheckCreate(device, size, granularity));
  LOOM_RETURN_IF_ERROR(SizedCallLocked(DriverOp::kCreate, size));
  LOOM_ASSIGN_OR_RETURN(uint64_t handle, DoCreate(device, size));
  contract_.OnCreate(handle, device, size);
  return PhysicalHandle{handle};
}

Status Driver::Release(PhysicalHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(contract_.CheckRelease(handle.value));
  LOOM_RETURN_IF_ERROR(
      SizedCallLocked(DriverOp::kRelease, contract_.HandleSize(handle.value)));
  LOOM_RETURN_IF_ERROR(DoRelease(handle.value));
  contract_.OnRelease(handle.value);
  return OkStatus();
}

StatusOr<DevicePtr> Driver::Reserve(uint64_t size, uint64_t alignment) {
  std::lock_guard<std::mutex> lock(mu_);
  // Address space is shared by all devices; device 0's granularity rules it.
  LOOM_ASSIGN_OR_RETURN(uint64_t granularity, MinimumGranularityLocked(0));
  LOOM_RETURN_IF_ERROR(contract_.CheckReserve(size, alignment, granularity));
  LOOM_RETURN_IF_ERROR(SizedCallLocked(DriverOp::kReserve, size));
  LOOM_ASSIGN_OR_RETURN(
      DevicePtr ptr, DoReserve(size, alignment == 0 ? granularity : alignment));
  contract_.OnReserve(ptr, size);
  return ptr;
}

Status Driver::Unreserve(DevicePtr ptr, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(contract_.CheckUnreserve(ptr, size));
  LOOM_RETURN_IF_ERROR(SizedCallLocked(DriverOp::kUnreserve, size));
  LOOM_RETURN_IF_ERROR(DoUnreserve(ptr, size));
  contract_.OnUnreserve(ptr);
  return OkStatus();
}

Status Driver::Map(DevicePtr ptr, uint64_t size, PhysicalHandle handle,
                   uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_ASSIGN_OR_RETURN(uint64_t granularity, MinimumGranularityLocked(0));
  LOOM_RETURN_IF_ERROR(
      contract_.CheckMap(ptr, size, handle.value, offset, granularity));
  LOOM_RETURN_IF_ERROR(SizedCallLocked(DriverOp::kMap, size));
  LOOM_RETURN_IF_ERROR(DoMap(ptr, size, handle.value, offset));
  contract_.OnMap(ptr, size, handle.value, offset);
  return OkStatus();
}

Status Driver::Unmap(DevicePtr ptr, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(contract_.CheckUnmap(ptr, size));
  LOOM_RETURN_IF_ERROR(SizedCallLocked(DriverOp::kUnmap, size));
  LOOM_RETURN_IF_ERROR(DoUnmap(ptr, size));
  contract_.OnUnmap(ptr, size);
  return OkStatus();
}

Status Driver::SetAccess(DevicePtr ptr, uint64_t size, int device,
                         std::span<const int> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(MinimumGranularityLocked(device).status());
  for (int peer : peers) {
    LOOM_RETURN_IF_ERROR(MinimumGranularityLocked(peer).status());
  }
  LOOM_RETURN_IF_ERROR(contract_.CheckWholeMappings(ptr, size, "set_access"));
  LOOM_RETURN_IF_ERROR(SizedCallLocked(DriverOp::kSetAccess, size));
  LOOM_RETURN_IF_ERROR(DoSetAccess(ptr, size, device, peers));
  contract_.OnSetAccess(ptr, size);
  return OkStatus();
}

StatusOr<bool> Driver::CanAccessPeer(int device, int peer) {
  LOOM_ASSIGN_OR_RETURN(int count, DoDeviceCount());
  if (device < 0 || device >= count || peer < 0 || peer >= count) {
    return InvalidArgumentError("devices {} and {}: {} devices exist", device,
                                peer, count);
  }
  if (device == peer) return false;
  return DoCanAccessPeer(device, peer);
}

StatusOr<Stream> Driver::CreateStream(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOOM_RETURN_IF_ERROR(MinimumGranularityLocked(device).status());
  }
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kCreateStream));
  return DoCreateStream(device);
}

Status Driver::DestroyStream(Stream stream) {
  if (stream == 0)
    return InvalidArgumentError("destroy_stream: the default stream");
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kDestroyStream));
  return DoDestroyStream(stream);
}

Status Driver::SynchronizeStream(Stream stream) {
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kSynchronizeStream));
  return DoSynchronizeStream(stream);
}

StatusOr<Event> Driver::CreateEvent(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOOM_RETURN_IF_ERROR(MinimumGranularityLocked(device).status());
  }
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kCreateEvent));
  LOOM_ASSIGN_OR_RETURN(uint64_t event, DoCreateEvent(device));
  return Event{event};
}

Status Driver::DestroyEvent(Event event) {
  if (event.value == 0)
    return InvalidArgumentError("destroy_event: null event");
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kDestroyEvent));
  return DoDestroyEvent(event.value);
}

Status Driver::RecordEvent(Event event, Stream stream) {
  if (event.value == 0) return InvalidArgumentError("record_event: null event");
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kRecordEvent));
  return DoRecordEvent(event.value, stream);
}

StatusOr<bool> Driver::QueryEvent(Event event) {
  if (event.value == 0) return InvalidArgumentError("query_event: null event");
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kQueryEvent));
  return DoQueryEvent(event.value);
}

Status Driver::SynchronizeEvent(Event event) {
  if (event.value == 0) {
    return InvalidArgumentError("synchronize_event: null event");
  }
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kSynchronizeEvent));
  return DoSynchronizeEvent(event.value);
}

Status Driver::StreamWaitEvent(Stream stream, Event event) {
  if (event.value == 0) {
    return InvalidArgumentError("stream_wait_event: null event");
  }
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kStreamWaitEvent));
  return DoStreamWaitEvent(stream, event.value);
}

Status Driver::SynchronizeDevice(int device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOOM_RETURN_IF_ERROR(MinimumGranularityLocked(device).status());
  }
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kSynchronizeDevice));
  return DoSynchronizeDevice(device);
}

Status Driver::CheckAccessibleLocked(DevicePtr ptr, uint64_t size) const {
  if (ptr + size < ptr) return InvalidArgumentError("range wraps around");
  return contract_.CheckAccessible(ptr, size);
}

Status Driver::CopyToDevice(DevicePtr dst, const void* src, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(CheckAccessibleLocked(dst, size));
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kCopyToDevice));
  return DoCopyToDevice(dst, src, size);
}

Status Driver::CopyToHost(void* dst, DevicePtr src, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(CheckAccessibleLocked(src, size));
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kCopyToHost));
  return DoCopyToHost(dst, src, size);
}

Status Driver::Memset(DevicePtr dst, uint8_t value, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(CheckAccessibleLocked(dst, size));
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kMemset));
  return DoMemset(dst, value, size);
}

void Driver::InjectFailure(DriverOp op, int nth, Status status) {
  LOOM_CHECK(nth >= 1 && !status.ok());
  std::lock_guard<std::mutex> lock(inject_mu_);
  injections_.push_back({op, nth, std::move(status)});
  injecting_.store(true, std::memory_order_release);
}

void Driver::FailAlways(DriverOp op, Status status) {
  std::lock_guard<std::mutex> lock(inject_mu_);
  always_[static_cast<size_t>(op)] = std::move(status);
  injecting_.store(true, std::memory_order_release);
}

void Driver::ClearFailures() {
  std::lock_guard<std::mutex> lock(inject_mu_);
  injections_.clear();
  for (Status& status : always_) status = OkStatus();
  injecting_.store(false, std::memory_order_release);
}

Status Driver::InjectedFailure(DriverOp op) {
  std::lock_guard<std::mutex> lock(inject_mu_);
  if (!always_[static_cast<size_t>(op)].ok()) {
    return always_[static_cast<size_t>(op)];
  }
  Status result;
  for (auto it = injections_.begin(); it != injections_.end();) {
    if (it->op == op && --it->countdown == 0) {
      if (result.ok()) result = it->status;
      it = injections_.erase(it);
    } else {
      ++it;
    }
  }
  return result;
}

std::map<uint64_t, uint64_t> Driver::sized_calls(DriverOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sized_[static_cast<size_t>(op)];
}

// --- Queued data operations (issue 20 item 6) -----------------------------

Status Driver::MemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                           Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(CheckAccessibleLocked(dst, size));
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kMemsetAsync));
  return DoMemsetAsync(dst, value, size, stream, contract_.DeviceAt(dst));
}

Status Driver::CopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                               Stream stream) {
  if (dst == nullptr && size > 0) {
    return InvalidArgumentError("copy_to_host_async: null destination");
  }
  std::lock_guard<std::mutex> lock(mu_);
  LOOM_RETURN_IF_ERROR(CheckAccessibleLocked(src, size));
  LOOM_RETURN_IF_ERROR(Call(DriverOp::kCopyToHostAsync));
  return DoCopyToHostAsync(dst, src, size, stream, contract_.DeviceAt(src));
}

Status Driver::DoMemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                             Stream, int) {
  return DoMemset(dst, value, size);
}

Status Driver::DoCopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                                 Stream, int) {
  return DoCopyToHost(dst, src, size);
}

uint64_t Driver::calls(DriverOp op) const {
  return calls_[static_cast<size_t>(op)].load(std::memory_order_relaxed);
}

std::array<uint64_t, kDriverOpCount> Driver::all_calls() const {
  std::array<uint64_t, kDriverOpCount> out{};
  for (size_t i = 0; i < kDriverOpCount; ++i) {
    out[i] = calls_[i].load(std::memory_order_relaxed);
  }
  return out;
}

uint64_t Driver::physical_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return contract_.counts().handle_bytes;
}

ContractCounts Driver::contract_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return contract_.counts();
}

MappingLayout Driver::mapping_layout(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return contract_.Layout(device);
}

}  // namespace loom::vmm
