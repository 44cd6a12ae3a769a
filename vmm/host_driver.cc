#include "vmm/host_driver.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace loom::vmm {
namespace {

Status Errno(std::string_view what) {
  int error = errno;
  if (error == ENOMEM) {
    return OutOfMemoryError("{}: {}", what, std::strerror(error));
  }
  return InternalError("{}: {}", what, std::strerror(error));
}

void* AsPointer(DevicePtr ptr) { return reinterpret_cast<void*>(ptr); }

}  // namespace

StatusOr<std::unique_ptr<HostDriver>> HostDriver::Open(
    HostDriverOptions options) {
  LOOM_ASSIGN_OR_RETURN(auto file, OpenFile(options));
  return std::unique_ptr<HostDriver>(
      new HostDriver(options, file.first, file.second));
}

StatusOr<std::pair<int, uint64_t>> HostDriver::OpenFile(
    const HostDriverOptions& options) {
  long page = sysconf(_SC_PAGESIZE);
  if (options.granularity == 0 || options.granularity % page != 0) {
    return InvalidArgumentError(
        "host granularity {} must be a positive multiple of the page size {}",
        options.granularity, page);
  }
  if (options.device_count <= 0 || options.device_count > 64) {
    return InvalidArgumentError("host device count {} outside 1..64",
                                options.device_count);
  }
  if (options.capacity_per_device == 0 ||
      options.capacity_per_device > (uint64_t{1} << 44)) {
    return InvalidArgumentError("host capacity {} outside 1 B..16 TiB",
                                options.capacity_per_device);
  }
  int fd = memfd_create("loom-host-physical", MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create").WithContext("host driver");
  // Offsets are set aside generously (4x the capacity) so that fragmentation
  // of the file never makes Create fail while the byte budget has room.
  uint64_t region =
      (options.capacity_per_device * 4 + options.granularity - 1) /
      options.granularity * options.granularity;
  uint64_t file_size = region * options.device_count;
  if (ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
    Status status = Errno("ftruncate of the physical-memory file");
    close(fd);
    return status;
  }
  return std::make_pair(fd, file_size);
}

HostDriver::HostDriver(HostDriverOptions options, int fd, uint64_t file_size)
    : options_(options),
      fd_(fd),
      region_per_device_(file_size / options.device_count),
      free_ranges_(options.device_count),
      used_per_device_(options.device_count, 0) {
  for (int d = 0; d < options.device_count; ++d) {
    free_ranges_[d][d * region_per_device_] = region_per_device_;
  }
}

HostDriver::~HostDriver() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [ptr, size] : reservations_) munmap(AsPointer(ptr), size);
  close(fd_);
}

uint64_t HostDriver::HandleFileOffset(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  return handles_.at(handle).file_offset;
}

StatusOr<uint64_t> HostDriver::ResidentBytes() const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return Errno("fstat");
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

StatusOr<int> HostDriver::DoDeviceCount() { return options_.device_count; }

StatusOr<DeviceProperties> HostDriver::DoProperties(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceProperties p;
  p.ordinal = device;
  p.name = fmt::format("loom host device {}", device);
  p.total_bytes = options_.capacity_per_device;
  p.free_bytes = options_.capacity_per_device - used_per_device_[device];
  p.granularity_minimum = options_.granularity;
  p.granularity_recommended = options_.granularity;
  return p;
}

StatusOr<uint64_t> HostDriver::DoGranularity(int, Granularity) {
  return options_.granularity;
}

StatusOr<uint64_t> HostDriver::AllocateFileRange(int device, uint64_t size) {
  auto& ranges = free_ranges_[device];
  for (auto it = ranges.begin(); it != ranges.end(); ++it) {
    if (it->second < size) continue;
    uint64_t offset = it->first;
    uint64_t remaining = it->second - size;
    ranges.erase(it);
    if (remaining > 0) ranges[offset + size] = remaining;
    return offset;
  }
  return OutOfMemoryError("host device {}: physical-memory file is fragmented",
                          device);
}

void HostDriver::FreeFileRange(int device, uint64_t offset, uint64_t size) {
  auto& ranges = free_ranges_[device];
  auto next = ranges.lower_bound(offset);
  if (next != ranges.end() && offset + size == next->first) {
    size += next->second;
    next = ranges.erase(next);
  }
  if (next != ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  ranges[offset] = size;
}

StatusOr<uint64_t> HostDriver::DoCreate(int device, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& used = used_per_device_[device];
  if (size > options_.capacity_per_device - used) {
    return OutOfMemoryError(
        "host device {}: cannot create {} bytes, {} of {} in use", device, size,
        used, options_.capacity_per_device);
  }
  LOOM_ASSIGN_OR_RETURN(uint64_t offset, AllocateFileRange(device, size));
  used += size;
  uint64_t handle = next_handle_++;
  handles_[handle] = HandleState{device, offset, size};
  return handle;
}

Status HostDriver::DoRelease(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(handle);
  LOOM_CHECK(it != handles_.end());
  const HandleState& h = it->second;
  // Give the pages back to the system; the range reads as zeros afterwards.
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(h.file_offset),
                static_cast<off_t>(h.size)) != 0) {
    return Errno("fallocate(PUNCH_HOLE)");
  }
  FreeFileRange(h.device, h.file_offset, h.size);
  used_per_device_[h.device] -= h.size;
  handles_.erase(it);
  return OkStatus();
}

StatusOr<DevicePtr> HostDriver::DoReserve(uint64_t size, uint64_t alignment) {
  // Over-reserve, then trim to the requested alignment.
  uint64_t span = size + alignment;
  if (span < size) return InvalidArgumentError("reserve: size overflows");
  void* raw = mmap(nullptr, span, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return Errno("mmap(reserve)");
  uint64_t base = reinterpret_cast<uint64_t>(raw);
  uint64_t aligned = (base + alignment - 1) / alignment * alignment;
  if (aligned > base) munmap(raw, aligned - base);
  uint64_t tail = base + span - (aligned + size);
  if (tail > 0) munmap(AsPointer(aligned + size), tail);
  std::lock_guard<std::mutex> lock(mu_);
  reservations_[aligned] = size;
  return aligned;
}

Status HostDriver::DoUnreserve(DevicePtr ptr, uint64_t size) {
  if (munmap(AsPointer(ptr), size) != 0) return Errno("munmap(unreserve)");
  std::lock_guard<std::mutex> lock(mu_);
  reservations_.erase(ptr);
  return OkStatus();
}

Status HostDriver::DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
                         uint64_t offset) {
  uint64_t file_offset;
  {
    std::lock_guard<std::mutex> lock(mu_);
    file_offset = handles_.at(handle).file_offset + offset;
  }
  void* mapped = mmap(AsPointer(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                      fd_, static_cast<off_t>(file_offset));
  if (mapped == MAP_FAILED) return Errno("mmap(map)");
  return OkStatus();
}

Status HostDriver::DoUnmap(DevicePtr ptr, uint64_t size) {
  void* back =
      mmap(AsPointer(ptr), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (back == MAP_FAILED) return Errno("mmap(unmap)");
  return OkStatus();
}

StatusOr<bool> HostDriver::DoCanAccessPeer(int, int) { return true; }

Status HostDriver::DoSetAccess(DevicePtr ptr, uint64_t size, int,
                               std::span<const int>) {
  if (mprotect(AsPointer(ptr), size, PROT_READ | PROT_WRITE) != 0) {
    return Errno("mprotect(set_access)");
  }
  return OkStatus();
}

StatusOr<Stream> HostDriver::DoCreateStream(int) {
  std::lock_guard<std::mutex> lock(mu_);
  Stream stream = (uint64_t{0x4057} << 32) + next_stream_++;
  streams_.insert(stream);
  return stream;
}

Status HostDriver::DoDestroyStream(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_.erase(stream) == 0) {
    return InvalidArgumentError("destroy_stream: {:#x} was not created here",
                                stream);
  }
  return OkStatus();
}

Status HostDriver::DoSynchronizeStream(Stream) { return OkStatus(); }

StatusOr<uint64_t> HostDriver::DoCreateEvent(int) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_event_++;
  events_.insert(id);
  return id;
}

Status HostDriver::DoDestroyEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(event) == 0) {
    return InvalidArgumentError("destroy_event: {} is not a live event", event);
  }
  return OkStatus();
}

Status HostDriver::DoRecordEvent(uint64_t event, Stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!events_.contains(event)) {
    return InvalidArgumentError("record_event: {} is not a live event", event);
  }
  return OkStatus();
}

StatusOr<bool> HostDriver::DoQueryEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!events_.contains(event)) {
    return InvalidArgumentError("query_event: {} is not a live event", event);
  }
  return true;
}

Status HostDriver::DoSynchronizeEvent(uint64_t event) {
  return DoQueryEvent(event).status();
}

Status HostDriver::DoStreamWaitEvent(Stream, uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!events_.contains(event)) {
    return InvalidArgumentError("stream_wait_event: {} is not a live event",
                                event);
  }
  return OkStatus();
}

Status HostDriver::DoSynchronizeDevice(int) { return OkStatus(); }

Status HostDriver::DoCopyToDevice(DevicePtr dst, const void* src,
                                  uint64_t size) {
  std::memcpy(AsPointer(dst), src, size);
  return OkStatus();
}

Status HostDriver::DoCopyToHost(void* dst, DevicePtr src, uint64_t size) {
  std::memcpy(dst, AsPointer(src), size);
  return OkStatus();
}

Status HostDriver::DoMemset(DevicePtr dst, uint8_t value, uint64_t size) {
  std::memset(AsPointer(dst), value, size);
  return OkStatus();
}

}  // namespace loom::vmm
