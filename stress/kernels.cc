#include "stress/kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "vmm/async_host_driver.h"

namespace loom::stress {
namespace {

using vmm::DevicePtr;
using vmm::Stream;

constexpr uint64_t kStampStride = 4096;

// Host memory kernels: queued on the async backend's stream workers, run at
// once on the host backend, nothing on the fake one.
class HostKernels final : public Kernels {
 public:
  HostKernels(vmm::Driver& driver, int max_delay_us, Report report)
      : driver_(driver),
        async_(dynamic_cast<vmm::AsyncHostDriver*>(&driver)),
        max_delay_us_(max_delay_us),
        report_(std::move(report)) {}

  void Produce(Stream stream, const Target& t) override {
    std::vector<DevicePtr> at = StampAddresses(t);
    const uint64_t stamp = t.stamp;
    Launch(stream, t, [at = std::move(at), stamp] {
      for (DevicePtr p : at) {
        std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p))
            .store(stamp, std::memory_order_relaxed);
      }
    });
  }

  void Consume(Stream stream, const Target& t) override {
    std::vector<DevicePtr> at = StampAddresses(t);
    Launch(stream, t, [report = report_, at = std::move(at), t, stream] {
      for (DevicePtr p : at) {
        const uint64_t seen =
            std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p))
                .load(std::memory_order_relaxed);
        if (seen != t.stamp) {
          report(Problem::kCorrupted,
                 fmt::format("buffer {} at {:#x} (stream {:#x}): byte {} "
                             "holds stamp {}, not its own",
                             t.stamp, t.ptr, stream, p - t.ptr, seen));
          return;
        }
      }
    });
  }

  void Drain() override {
    if (async_ != nullptr) async_->Drain();
  }

 private:
  static std::vector<DevicePtr> StampAddresses(const Target& t) {
    std::vector<DevicePtr> out;
    if (t.size < 8) return out;
    for (uint64_t off = 0; off + 8 <= t.size; off += kStampStride) {
      out.push_back(t.ptr + off);
    }
    const uint64_t last = (t.size - 8) & ~uint64_t{7};
    if (out.back() != t.ptr + last) out.push_back(t.ptr + last);
    return out;
  }

  void Launch(Stream stream, const Target& t, std::function<void()> body) {
    ++launched_;
    if (async_ != nullptr) {
      vmm::Kernel kernel;
      kernel.accesses = {{t.ptr, t.size}};
      kernel.body = std::move(body);
      thread_local std::mt19937 delay_rng(
          std::hash<std::thread::id>{}(std::this_thread::get_id()));
      kernel.delay = std::chrono::microseconds(
          max_delay_us_ > 0 ? delay_rng() % max_delay_us_ : 0);
      Status launched = async_->Launch(stream, std::move(kernel));
      if (!launched.ok()) {
        report_(Problem::kFault,
                fmt::format("kernel launch on live memory refused: {}",
                            launched.ToString()));
      }
      return;
    }
    if (driver_.holds_data()) body();
  }

  vmm::Driver& driver_;
  vmm::AsyncHostDriver* async_;
  const int max_delay_us_;
  const Report report_;
};

// Device kernels: a queued memset stamps, a queued copy back and an event
// check. A check's host copy lives until its event has completed.
class CudaKernels final : public Kernels {
 public:
  CudaKernels(vmm::Driver& driver, Report report)
      : driver_(driver), report_(std::move(report)) {}
  ~CudaKernels() override { Drain(); }

  void Produce(Stream stream, const Target& t) override {
    ++launched_;
    Status stamped = driver_.MemsetAsync(t.ptr, Byte(t.stamp), t.size, stream);
    if (!stamped.ok()) {
      report_(Problem::kFault,
              fmt::format("stamp of buffer {} ({} bytes at {:#x}) on stream "
                          "{:#x} refused: {}",
                          t.stamp, t.size, t.ptr, stream, stamped.ToString()));
    }
  }

  void Consume(Stream stream, const Target& t) override {
    ++launched_;
    Check c;
    c.target = t;
    c.stream = stream;
    c.bytes.reset(new uint8_t[t.size]);
    Status copied =
        driver_.CopyToHostAsync(c.bytes.get(), t.ptr, t.size, stream);
    if (!copied.ok()) {
      report_(Problem::kFault,
              fmt::format("check of buffer {} ({} bytes at {:#x}) on stream "
                          "{:#x} refused: {}",
                          t.stamp, t.size, t.ptr, stream, copied.ToString()));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    StatusOr<vmm::Event> event = EventLocked(t.device);
    Status recorded =
        event.ok() ? driver_.RecordEvent(*event, stream) : event.status();
    if (!recorded.ok()) {
      // The copy is queued into c.bytes: wait for the stream instead.
      report_(Problem::kFault, fmt::format("event after a check on stream "
                                           "{:#x}: {}",
                                           stream, recorded.ToString()));
      Status synced = driver_.SynchronizeStream(stream);
      if (synced.ok()) Verify(c);
      if (event.ok()) idle_[t.device].push_back(*event);
      return;
    }
    c.event = *event;
    pending_bytes_ += t.size;
    pending_.push_back(std::move(c));
    while (pending_.size() > kMaxPending || pending_bytes_ > kMaxPendingBytes) {
      FinishFrontLocked(/*wait=*/true);
    }
  }

  void Poll() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another thread is at it
    for (int i = 0; i < kPollsPerCall && !pending_.empty(); ++i) {
      if (!FinishFrontLocked(/*wait=*/false)) break;
    }
  }

  void Drain() override {
    std::lock_guard<std::mutex> lock(mu_);
    while (!pending_.empty()) FinishFrontLocked(/*wait=*/true);
    for (std::vector<vmm::Event>& events : idle_) {
      for (vmm::Event e : events) driver_.DestroyEvent(e).IgnoreError();
      events.clear();
    }
  }

 private:
  static constexpr size_t kMaxPending = 1024;
  static constexpr uint64_t kMaxPendingBytes = uint64_t{256} << 20;
  static constexpr int kPollsPerCall = 4;

  struct Check {
    Target target;
    Stream stream = 0;
    vmm::Event event;
    std::unique_ptr<uint8_t[]> bytes;
  };

  // The byte a stamp writes: never 0, the value of fresh memory.
  static uint8_t Byte(uint64_t stamp) {
    return static_cast<uint8_t>(1 + stamp % 255);
  }

  // REQUIRES: mu_ held.
  StatusOr<vmm::Event> EventLocked(int device) {
    if (idle_.size() <= static_cast<size_t>(device)) idle_.resize(device + 1);
    if (!idle_[device].empty()) {
      vmm::Event e = idle_[device].back();
      idle_[device].pop_back();
      return e;
    }
    return driver_.CreateEvent(device);
  }

  // Finishes the oldest check if its work is done (or after waiting for
  // it); false when it is not done yet. REQUIRES: mu_ held, one pending.
  bool FinishFrontLocked(bool wait) {
    Check& c = pending_.front();
    Status status;
    if (wait) {
      status = driver_.SynchronizeEvent(c.event);
    } else {
      StatusOr<bool> done = driver_.QueryEvent(c.event);
      if (done.ok() && !*done) return false;
      status = done.status();
    }
    if (status.ok()) {
      Verify(c);
    } else {
      report_(Problem::kFault,
              fmt::format("check of buffer {} on stream {:#x}: {}",
                          c.target.stamp, c.stream, status.ToString()));
    }
    idle_[c.target.device].push_back(c.event);
    pending_bytes_ -= c.target.size;
    pending_.pop_front();
    return true;
  }

  void Verify(const Check& c) {
    const uint8_t expected = Byte(c.target.stamp);
    const uint8_t* begin = c.bytes.get();
    const uint8_t* end = begin + c.target.size;
    const uint8_t* bad =
        std::find_if(begin, end, [&](uint8_t b) { return b != expected; });
    if (bad == end) return;
    report_(Problem::kCorrupted,
            fmt::format("buffer {} at {:#x} (stream {:#x}): byte {} holds "
                        "{:#04x}, not its own {:#04x}",
                        c.target.stamp, c.target.ptr, c.stream, bad - begin,
                        *bad, expected));
  }

  vmm::Driver& driver_;
  const Report report_;
  std::mutex mu_;  // guards everything below
  std::deque<Check> pending_;
  uint64_t pending_bytes_ = 0;
  std::vector<std::vector<vmm::Event>> idle_;  // per device
};

}  // namespace

std::unique_ptr<Kernels> Kernels::For(vmm::Driver& driver, int max_delay_us,
                                      Report report) {
  if (driver.name() == "cuda") {
    return std::make_unique<CudaKernels>(driver, std::move(report));
  }
  return std::make_unique<HostKernels>(driver, max_delay_us, std::move(report));
}

}  // namespace loom::stress
