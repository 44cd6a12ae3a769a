#include "vmm/async_host_driver.h"

#include <algorithm>
#include <cstring>

namespace loom::vmm {
namespace {

constexpr size_t kMaxFaultTexts = 64;

bool Overlaps(uint64_t a_begin, uint64_t a_end, uint64_t b_begin,
              uint64_t b_end) {
  return a_begin < b_end && b_begin < a_end;
}

}  // namespace

StatusOr<std::unique_ptr<AsyncHostDriver>> AsyncHostDriver::Open(
    HostDriverOptions options) {
  LOOM_ASSIGN_OR_RETURN(auto file, OpenFile(options));
  return std::unique_ptr<AsyncHostDriver>(
      new AsyncHostDriver(options, file.first, file.second));
}

AsyncHostDriver::AsyncHostDriver(HostDriverOptions options, int fd,
                                 uint64_t file_size)
    : HostDriver(options, fd, file_size) {}

AsyncHostDriver::~AsyncHostDriver() {
  Drain();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [stream, state] : streams_) {
      workers.push_back(std::move(state->worker));
    }
  }
  changed_.notify_all();
  for (std::thread& worker : workers) {
    if (worker.joinable()) worker.join();
  }
}

AsyncHostDriver::StreamState& AsyncHostDriver::StreamLocked(Stream stream) {
  std::unique_ptr<StreamState>& state = streams_[stream];
  if (state == nullptr) {
    state = std::make_unique<StreamState>();
    state->worker = std::thread([this, stream] { Work(stream); });
  }
  return *state;
}

void AsyncHostDriver::Work(Stream stream) {
  std::unique_lock<std::mutex> lock(mu_);
  StreamState* state = streams_.at(stream).get();
  while (true) {
    changed_.wait(lock, [&] {
      return stopping_ || state->stop || !state->queue.empty();
    });
    if (state->queue.empty()) {
      if (stopping_ || state->stop) return;
      continue;
    }
    Item& item = state->queue.front();
    state->running = true;
    switch (item.kind) {
      case Item::Kind::kRecord: {
        auto it = events_.find(item.id);
        if (it != events_.end()) it->second.pending.erase(item.generation);
        break;
      }
      case Item::Kind::kWait:
        changed_.wait(lock, [&] {
          auto it = events_.find(item.id);
          return stopping_ || it == events_.end() ||
                 it->second.Done(item.generation);
        });
        break;
      case Item::Kind::kKernel: {
        const std::chrono::microseconds delay = item.kernel.delay;
        lock.unlock();
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        std::shared_lock<std::shared_mutex> memory(memory_);
        lock.lock();
        // The memory must still be what the kernel was launched on.
        std::string moved;
        for (size_t i = 0; i < item.kernel.accesses.size() && moved.empty();
             ++i) {
          const KernelAccess& a = item.kernel.accesses[i];
          StatusOr<std::vector<PhysicalRange>> now =
              TranslateLocked(a.ptr, a.size, /*need_access=*/true);
          bool same = now.ok() && now->size() == item.physical[i].size();
          for (size_t j = 0; same && j < now->size(); ++j) {
            same = (*now)[j].begin == item.physical[i][j].begin &&
                   (*now)[j].end == item.physical[i][j].end;
          }
          if (!same) {
            moved = fmt::format(
                "kernel {} on stream {:#x}: [{:#x}, +{}) is no longer mapped "
                "as at launch when it runs",
                item.id, stream, a.ptr, a.size);
          }
        }
        if (!moved.empty()) {
          ++counters_.kernels_skipped;
          FaultLocked(std::move(moved));
        } else if (item.kernel.body) {
          lock.unlock();
          item.kernel.body();
          lock.lock();
          ++counters_.kernels_run;
        } else {
          ++counters_.kernels_run;
        }
        break;
      }
    }
    state->queue.pop_front();
    state->running = false;
    changed_.notify_all();
  }
}

StatusOr<std::vector<AsyncHostDriver::PhysicalRange>>
AsyncHostDriver::TranslateLocked(DevicePtr ptr, uint64_t size,
                                 bool need_access) const {
  std::vector<PhysicalRange> out;
  DevicePtr cursor = ptr;
  const DevicePtr end = ptr + size;
  if (end < ptr) return InvalidArgumentError("range wraps around");
  while (cursor < end) {
    auto it = mappings_.upper_bound(cursor);
    if (it == mappings_.begin()) {
      return InvalidArgumentError("{:#x} is not mapped", cursor);
    }
    --it;
    const DevicePtr map_end = it->first + it->second.size;
    if (cursor >= map_end) {
      return InvalidArgumentError("{:#x} is not mapped", cursor);
    }
    if (need_access && !it->second.accessible) {
      return InvalidArgumentError("{:#x} is mapped but not accessible", cursor);
    }
    const DevicePtr piece_end = std::min(end, map_end);
    const uint64_t file = it->second.file_offset + (cursor - it->first);
    if (!out.empty() && out.back().end == file) {
      out.back().end += piece_end - cursor;
    } else {
      out.push_back({file, file + (piece_end - cursor)});
    }
    cursor = piece_end;
  }
  return out;
}

std::string AsyncHostDriver::UserOfLocked(
    const std::vector<PhysicalRange>& ranges, Stream except,
    bool any_stream) const {
  for (const auto& [stream, state] : streams_) {
    if (!any_stream && stream == except) continue;
    for (const Item& item : state->queue) {
      if (item.kind != Item::Kind::kKernel) continue;
      for (size_t i = 0; i < item.physical.size(); ++i) {
        for (const PhysicalRange& used : item.physical[i]) {
          for (const PhysicalRange& r : ranges) {
            if (Overlaps(used.begin, used.end, r.begin, r.end)) {
              return fmt::format(
                  "kernel {} queued on stream {:#x} (access [{:#x}, +{}))",
                  item.id, stream, item.kernel.accesses[i].ptr,
                  item.kernel.accesses[i].size);
            }
          }
        }
      }
    }
  }
  return "";
}

void AsyncHostDriver::FaultLocked(std::string what) {
  ++counters_.faults;
  if (faults_.size() < kMaxFaultTexts) faults_.push_back(std::move(what));
}

bool AsyncHostDriver::IdleLocked(int device) const {
  for (const auto& [stream, state] : streams_) {
    if (device >= 0 && state->device >= 0 && state->device != device) continue;
    if (!state->queue.empty()) return false;
  }
  return true;
}

Status AsyncHostDriver::Launch(Stream stream, Kernel kernel) {
  std::lock_guard<std::mutex> lock(mu_);
  Item item;
  item.kind = Item::Kind::kKernel;
  item.id = next_kernel_++;
  for (const KernelAccess& a : kernel.accesses) {
    StatusOr<std::vector<PhysicalRange>> physical =
        TranslateLocked(a.ptr, a.size, /*need_access=*/true);
    if (!physical.ok()) {
      return physical.status().WithContext(
          fmt::format("launch on stream {:#x}", stream));
    }
    item.physical.push_back(*std::move(physical));
  }
  item.kernel = std::move(kernel);
  StreamLocked(stream).queue.push_back(std::move(item));
  ++counters_.kernels_launched;
  changed_.notify_all();
  return OkStatus();
}

Status AsyncHostDriver::DoMemsetAsync(DevicePtr dst, uint8_t value,
                                      uint64_t size, Stream stream, int) {
  Kernel kernel;
  kernel.accesses = {{dst, size}};
  kernel.body = [dst, value, size] {
    std::memset(reinterpret_cast<void*>(dst), value, size);
  };
  return Launch(stream, std::move(kernel));
}

Status AsyncHostDriver::DoCopyToHostAsync(void* dst, DevicePtr src,
                                          uint64_t size, Stream stream, int) {
  Kernel kernel;
  kernel.accesses = {{src, size}};
  kernel.body = [dst, src, size] {
    std::memcpy(dst, reinterpret_cast<const void*>(src), size);
  };
  return Launch(stream, std::move(kernel));
}

bool AsyncHostDriver::CheckHandOut(DevicePtr ptr, uint64_t size,
                                   Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<std::vector<PhysicalRange>> physical =
      TranslateLocked(ptr, size, /*need_access=*/false);
  if (!physical.ok()) {
    FaultLocked(fmt::format("[{:#x}, +{}) handed to stream {:#x}: {}", ptr,
                            size, stream, physical.status().message()));
    return false;
  }
  std::string user = UserOfLocked(*physical, stream, /*any_stream=*/false);
  if (user.empty()) return true;
  FaultLocked(fmt::format(
      "[{:#x}, +{}) handed to stream {:#x} while {} still touches it", ptr,
      size, stream, user));
  return false;
}

AsyncHostDriver::Counters AsyncHostDriver::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<std::string> AsyncHostDriver::TakeFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(faults_, {});
}

void AsyncHostDriver::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return IdleLocked(-1); });
}

Status AsyncHostDriver::DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
                              uint64_t offset) {
  std::unique_lock<std::shared_mutex> memory(memory_);
  LOOM_RETURN_IF_ERROR(HostDriver::DoMap(ptr, size, handle, offset));
  std::lock_guard<std::mutex> lock(mu_);
  mappings_[ptr] = Mapping{size, HandleFileOffset(handle) + offset, false};
  return OkStatus();
}

Status AsyncHostDriver::DoUnmap(DevicePtr ptr, uint64_t size) {
  // No kernel body runs while memory is unmapped under it.
  std::unique_lock<std::shared_mutex> memory(memory_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A kernel that will access these addresses (another mapping of the
    // same bytes stays valid: unmapping one address range leaves it alone).
    std::string user;
    for (const auto& [stream, state] : streams_) {
      for (const Item& item : state->queue) {
        if (item.kind != Item::Kind::kKernel || !user.empty()) continue;
        for (const KernelAccess& a : item.kernel.accesses) {
          if (Overlaps(a.ptr, a.ptr + a.size, ptr, ptr + size)) {
            user = fmt::format(
                "kernel {} queued on stream {:#x} (access [{:#x}, +{}))",
                item.id, stream, a.ptr, a.size);
            break;
          }
        }
      }
    }
    if (!user.empty()) {
      FaultLocked(fmt::format("unmap of [{:#x}, +{}) while {} still uses it",
                              ptr, size, user));
    }
  }
  LOOM_RETURN_IF_ERROR(HostDriver::DoUnmap(ptr, size));
  std::lock_guard<std::mutex> lock(mu_);
  mappings_.erase(mappings_.lower_bound(ptr),
                  mappings_.lower_bound(ptr + size));
  return OkStatus();
}

Status AsyncHostDriver::DoSetAccess(DevicePtr ptr, uint64_t size, int device,
                                    std::span<const int> peers) {
  std::unique_lock<std::shared_mutex> memory(memory_);
  LOOM_RETURN_IF_ERROR(HostDriver::DoSetAccess(ptr, size, device, peers));
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = mappings_.lower_bound(ptr);
       it != mappings_.end() && it->first < ptr + size; ++it) {
    it->second.accessible = true;
  }
  return OkStatus();
}

StatusOr<Stream> AsyncHostDriver::DoCreateStream(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  const Stream stream = (uint64_t{0xa57c} << 32) + next_stream_++;
  StreamLocked(stream).device = device;
  return stream;
}

Status AsyncHostDriver::DoDestroyStream(Stream stream) {
  std::thread worker;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end() || it->second->device < 0) {
      return InvalidArgumentError("destroy_stream: {:#x} was not created here",
                                  stream);
    }
    // CUDA lets queued work finish after cuStreamDestroy; so do we.
    StreamState* state = it->second.get();
    changed_.wait(lock, [&] { return state->queue.empty(); });
    state->stop = true;
    worker = std::move(state->worker);
  }
  changed_.notify_all();
  worker.join();
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
  return OkStatus();
}

Status AsyncHostDriver::DoSynchronizeStream(Stream stream) {
  std::unique_lock<std::mutex> lock(mu_);
  StreamState& state = StreamLocked(stream);
  changed_.wait(lock, [&] { return state.queue.empty(); });
  return OkStatus();
}

StatusOr<uint64_t> AsyncHostDriver::DoCreateEvent(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_event_++;
  events_[id].device = device;
  return id;
}

Status AsyncHostDriver::DoDestroyEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(event) == 0) {
    return InvalidArgumentError("destroy_event: {} is not a live event", event);
  }
  changed_.notify_all();  // a wait on it ends (as if complete)
  return OkStatus();
}

Status AsyncHostDriver::DoRecordEvent(uint64_t event, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("record_event: {} is not a live event", event);
  }
  Item item;
  item.kind = Item::Kind::kRecord;
  item.id = event;
  item.generation = ++it->second.recorded;
  it->second.pending.insert(item.generation);
  StreamLocked(stream).queue.push_back(std::move(item));
  changed_.notify_all();
  return OkStatus();
}

StatusOr<bool> AsyncHostDriver::DoQueryEvent(uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("query_event: {} is not a live event", event);
  }
  return it->second.Done(it->second.recorded);
}

Status AsyncHostDriver::DoSynchronizeEvent(uint64_t event) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("synchronize_event: {} is not a live event",
                                event);
  }
  const uint64_t target = it->second.recorded;
  changed_.wait(lock, [&] {
    auto found = events_.find(event);
    return found == events_.end() || found->second.Done(target);
  });
  return OkStatus();
}

Status AsyncHostDriver::DoStreamWaitEvent(Stream stream, uint64_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) {
    return InvalidArgumentError("stream_wait_event: {} is not a live event",
                                event);
  }
  Item item;
  item.kind = Item::Kind::kWait;
  item.id = event;
  item.generation = it->second.recorded;
  StreamLocked(stream).queue.push_back(std::move(item));
  changed_.notify_all();
  return OkStatus();
}

Status AsyncHostDriver::DoSynchronizeDevice(int device) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return IdleLocked(device); });
  return OkStatus();
}

}  // namespace loom::vmm
