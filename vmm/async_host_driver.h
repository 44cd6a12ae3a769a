// AsyncHostDriver: the host backend (host_driver.h) with CUDA's stream
// semantics, so that stream-order bugs are caught without a GPU.
//
// Memory is the host backend's: one memfd, real aliasing between every
// virtual range mapped to the same physical bytes. On top of it:
//  - every stream is a worker thread with a FIFO queue: streams created here
//    and any other stream value (PyTorch's, the default stream 0), the latter
//    created on first use; Launch() enqueues a Kernel that runs later, after
//    its delay, and touches the device ranges it names through their host
//    addresses (a device address is a host address here);
//  - events have CUDA's meaning: RecordEvent enqueues a marker and the event
//    completes when the stream's worker passes it (an event never recorded
//    is complete); QueryEvent, SynchronizeEvent, SynchronizeStream and
//    SynchronizeDevice wait or answer accordingly; StreamWaitEvent makes the
//    stream's later work wait for the event's;
//  - faults, reported (counted, described) instead of crashing:
//    * Unmap of an address range a queued or running kernel will access
//      (unmapping one range leaves other mappings of the same bytes valid,
//      as on a GPU);
//    * a kernel that finds one of its ranges no longer mapped to the bytes
//      it was launched on (it is skipped, so nothing is touched);
//    * CheckHandOut(ptr, size, stream): bytes handed to `stream` while a
//      kernel queued on another stream still touches them (the allocator
//      reused memory before the other stream's work was done).
// Data corruption (a kernel finding another allocation's stamp) is the
// caller's to detect: kernels are the caller's code.
//
// Same contract checks as every backend (driver.h). Thread-safe.
#ifndef LOOM_VMM_ASYNC_HOST_DRIVER_H_
#define LOOM_VMM_ASYNC_HOST_DRIVER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vmm/host_driver.h"

namespace loom::vmm {

// A device range a kernel reads or writes.
struct KernelAccess {
  DevicePtr ptr = 0;
  uint64_t size = 0;
};

struct Kernel {
  std::vector<KernelAccess> accesses;
  // Runs on the stream's worker once the delay has passed and every access
  // is still mapped as at launch; touches only those ranges.
  std::function<void()> body;
  std::chrono::microseconds delay{0};
};

class AsyncHostDriver final : public HostDriver {
 public:
  static StatusOr<std::unique_ptr<AsyncHostDriver>> Open(
      HostDriverOptions options = {});
  // Waits for every queued kernel, then stops the workers.
  ~AsyncHostDriver() override;

  std::string_view name() const override { return "async"; }

  // Enqueues `kernel` on `stream`. INVALID_ARGUMENT (nothing enqueued) if an
  // access is not mapped and accessible now.
  Status Launch(Stream stream, Kernel kernel);

  // The bytes [ptr, ptr + size) were just handed to `stream`: a fault if a
  // kernel queued or running on another stream still touches them. Returns
  // false on a fault.
  bool CheckHandOut(DevicePtr ptr, uint64_t size, Stream stream);

  struct Counters {
    uint64_t kernels_launched = 0;
    uint64_t kernels_run = 0;
    uint64_t kernels_skipped = 0;  // found their memory unmapped
    uint64_t faults = 0;
  };
  Counters counters() const;
  // Descriptions of the faults so far (the first 64), and forgets them.
  std::vector<std::string> TakeFaults();
  // Waits until every stream's queue is empty.
  void Drain();

 protected:
  Status DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
               uint64_t offset) override;
  Status DoUnmap(DevicePtr ptr, uint64_t size) override;
  Status DoSetAccess(DevicePtr ptr, uint64_t size, int device,
                     std::span<const int> peers) override;
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
  // Queued data operations (issue 20 item 6): kernels on the stream.
  Status DoMemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                       Stream stream, int device) override;
  Status DoCopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                           Stream stream, int device) override;

 private:
  // Physical bytes: an offset range of the memfd.
  struct PhysicalRange {
    uint64_t begin = 0;
    uint64_t end = 0;
  };
  struct Mapping {
    uint64_t size = 0;
    uint64_t file_offset = 0;  // of the mapping's first byte
    bool accessible = false;   // SetAccess done
  };
  struct Item {
    enum class Kind : uint8_t { kKernel, kRecord, kWait };
    Kind kind = Kind::kKernel;
    uint64_t id = 0;          // kernel id, or event id
    uint64_t generation = 0;  // kRecord: the recording; kWait: awaited one
    Kernel kernel;
    // kKernel: per access, the physical bytes it was launched on.
    std::vector<std::vector<PhysicalRange>> physical;
  };
  struct StreamState {
    int device = -1;  // -1: not created here (any device)
    std::deque<Item> queue;
    bool running = false;  // the front item is being executed
    bool stop = false;     // destroyed: the worker ends once idle
    std::thread worker;
  };
  // An event may be recorded again (on any stream) before an earlier
  // recording has completed; waits refer to the recording they were made
  // after, so completion is tracked per recording.
  struct EventState {
    int device = 0;
    uint64_t recorded = 0;       // generation of the last RecordEvent
    std::set<uint64_t> pending;  // generations not yet passed
    bool Done(uint64_t generation) const {
      return !pending.contains(generation);
    }
  };

  explicit AsyncHostDriver(HostDriverOptions options, int fd,
                           uint64_t file_size);

  // REQUIRES: mu_ held. The stream's state, its worker started.
  StreamState& StreamLocked(Stream stream);
  void Work(Stream stream);
  // REQUIRES: mu_ held. Physical bytes behind a mapped device range, or an
  // error if some byte is not mapped.
  StatusOr<std::vector<PhysicalRange>> TranslateLocked(DevicePtr ptr,
                                                       uint64_t size,
                                                       bool need_access) const;
  // REQUIRES: mu_ held. A queued/running kernel (not on `except`, unless
  // `any_stream`) touching `ranges`: its description, or "".
  std::string UserOfLocked(const std::vector<PhysicalRange>& ranges,
                           Stream except, bool any_stream) const;
  void FaultLocked(std::string what);
  bool IdleLocked(int device) const;

  mutable std::mutex mu_;  // everything below
  std::condition_variable changed_;
  std::shared_mutex memory_;  // kernels touch memory shared; unmap unique
  std::map<DevicePtr, Mapping> mappings_;
  std::unordered_map<Stream, std::unique_ptr<StreamState>> streams_;
  std::unordered_map<uint64_t, EventState> events_;
  uint64_t next_stream_ = 1;
  uint64_t next_event_ = 1;
  uint64_t next_kernel_ = 1;
  bool stopping_ = false;
  Counters counters_;
  std::vector<std::string> faults_;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_ASYNC_HOST_DRIVER_H_
