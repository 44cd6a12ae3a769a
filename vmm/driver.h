// vmm::Driver: the narrow interface to CUDA's virtual memory management.
//
// This is the only place in loom that knows about CUDA. Everything above it
// (page pool, slots, the allocator) runs unchanged on three backends:
//   CudaDriver  (cuda_driver.h)  the real driver, loaded with dlopen
//   HostDriver  (host_driver.h)  real virtual memory on the CPU (memfd + mmap)
//   FakeDriver  (fake_driver.h)  bookkeeping only, failure injection
//
// The model is CUDA's: physical memory comes in handles (cuMemCreate), virtual
// address ranges are reserved (cuMemAddressReserve), a whole handle is mapped
// into a reserved range (cuMemMap) and made accessible (cuMemSetAccess);
// unmap, release and unreserve undo each step.
//
// Contract (enforced identically for every backend by this base class, the
// CUDA one included; docs/driver_contract.md names the CUDA behaviour behind
// each rule, and the contract suite in driver_test.cc checks it on every
// backend and on a GPU):
//  - sizes, offsets and addresses are multiples of the minimum granularity;
//  - a mapping is of a whole handle: offset 0 and the handle's size (CUDA
//    refuses anything else with CUDA_ERROR_NOT_SUPPORTED: UNIMPLEMENTED);
//  - a mapping lies inside one reservation and overlaps no other mapping
//    (one handle may be mapped at several addresses: they alias);
//  - Unmap takes exactly one mapping (part of one: CUDA_ERROR_INVALID_VALUE;
//    loom also refuses several in one call); SetAccess takes whole
//    consecutive mappings with no unmapped byte;
//  - a handle is released only when it is mapped nowhere;
//  - a reservation is freed only as a whole and only when nothing is mapped
//    inside it.
// A call that breaks the contract fails with INVALID_ARGUMENT or
// FAILED_PRECONDITION and changes nothing; it never crashes. A backend
// failure (out of memory, driver error) also leaves the state unchanged.
//
// Streams and events have CUDA's meaning: work queued on a stream runs in
// order, later; an event completes when the work queued before it on its
// stream has; StreamWaitEvent orders two streams. The host and fake backends
// run "work" at once (the fake one can hold events pending), the async host
// backend (async_host_driver.h) runs it later on one thread per stream.
//
// Thread safety: every method may be called from any thread. Memory-mapping
// calls are serialised by one mutex held across the backend call (they are
// slow and rare: loom's allocator caches mappings); stream and event calls
// take no lock.
#ifndef LOOM_VMM_DRIVER_H_
#define LOOM_VMM_DRIVER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "vmm/driver_contract.h"

namespace loom::vmm {

using DevicePtr = uint64_t;  // a device virtual address (CUdeviceptr)
using Stream = uint64_t;     // a CUstream / cudaStream_t value; 0 = default

// A physical memory handle (CUmemGenericAllocationHandle). 0 is never valid.
struct PhysicalHandle {
  uint64_t value = 0;
  friend bool operator==(PhysicalHandle, PhysicalHandle) = default;
};

// A CUevent. 0 is never valid.
struct Event {
  uint64_t value = 0;
  friend bool operator==(Event, Event) = default;
};

enum class Granularity { kMinimum, kRecommended };

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t granularity_minimum = 0;
  uint64_t granularity_recommended = 0;
};

// Every call a backend can receive, for counters and failure injection.
enum class DriverOp : uint8_t {
  kCreate,
  kRelease,
  kReserve,
  kUnreserve,
  kMap,
  kUnmap,
  kSetAccess,
  kCreateStream,
  kDestroyStream,
  kSynchronizeStream,
  kCreateEvent,
  kDestroyEvent,
  kRecordEvent,
  kQueryEvent,
  kSynchronizeEvent,
  kStreamWaitEvent,
  kSynchronizeDevice,
  kCopyToDevice,
  kCopyToHost,
  kMemset,
  // Queued data operations (loom stress on CUDA, issue 20 item 6).
  kMemsetAsync,
  kCopyToHostAsync,
  kCount,  // not an operation
};
inline constexpr size_t kDriverOpCount = static_cast<size_t>(DriverOp::kCount);

// "create", "map", ... (the name used in stats and JSON).
std::string_view DriverOpName(DriverOp op);

class Driver {
 public:
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  // REQUIRES: everything created through this driver has been released (a
  // leak is reported by FakeDriver; other backends clean up what they can).
  virtual ~Driver() = default;

  // "cuda", "host" or "fake".
  virtual std::string_view name() const = 0;
  // True when copies and memsets move real bytes (cuda, host); false when
  // they are only checked against the contract (fake).
  virtual bool holds_data() const = 0;

  StatusOr<int> DeviceCount();
  StatusOr<DeviceProperties> Properties(int device);
  // REQUIRES: 0 <= device < DeviceCount().
  StatusOr<uint64_t> GetGranularity(int device, Granularity kind);

  // --- Physical memory ---------------------------------------------------
  // Creates `size` bytes of physical memory on `device`.
  // REQUIRES: size > 0, a multiple of the minimum granularity.
  StatusOr<PhysicalHandle> Create(int device, uint64_t size);
  // REQUIRES: `handle` came from Create, is not released, nothing of it mapped.
  Status Release(PhysicalHandle handle);

  // --- Address space -----------------------------------------------------
  // Reserves `size` bytes of virtual address space aligned to `alignment`
  // (0 = the granularity). REQUIRES: size a multiple of the granularity,
  // alignment 0 or a power-of-two multiple of it.
  StatusOr<DevicePtr> Reserve(uint64_t size, uint64_t alignment = 0);
  // REQUIRES: (ptr, size) is exactly a live reservation with nothing mapped.
  Status Unreserve(DevicePtr ptr, uint64_t size);

  // Maps the whole of `handle` at [ptr, ptr + size). The range is not
  // accessible until SetAccess. REQUIRES: offset 0 and size the handle's
  // (UNIMPLEMENTED otherwise, as CUDA); inside one reservation, overlapping
  // no mapping, aligned to the granularity. `offset` exists so that the
  // refusal can be tested.
  Status Map(DevicePtr ptr, uint64_t size, PhysicalHandle handle,
             uint64_t offset = 0);
  // REQUIRES: [ptr, ptr + size) is exactly one earlier mapping.
  Status Unmap(DevicePtr ptr, uint64_t size);
  // Grants `device` and each of `peers` read-write access to a mapped range
  // (one call). REQUIRES: [ptr, ptr + size) is the union of whole
  // consecutive mappings with no gap; every device exists.
  Status SetAccess(DevicePtr ptr, uint64_t size, int device,
                   std::span<const int> peers = {});
  // Whether `device`'s memory can be made accessible to `peer` (CUDA peer
  // access; false for a device with itself). Not counted as a call.
  StatusOr<bool> CanAccessPeer(int device, int peer);

  // --- Streams and events ------------------------------------------------
  StatusOr<Stream> CreateStream(int device);
  // REQUIRES: `stream` came from CreateStream.
  Status DestroyStream(Stream stream);
  // Works on any stream value (PyTorch's streams included).
  Status SynchronizeStream(Stream stream);
  StatusOr<Event> CreateEvent(int device);
  Status DestroyEvent(Event event);
  // Records `event` on `stream` (any stream value; 0, the default stream,
  // is the default stream of the event's device: CUDA's legacy stream is
  // per context, and the call runs in the event's device's context).
  Status RecordEvent(Event event, Stream stream);
  // True when the work recorded before `event` has completed.
  StatusOr<bool> QueryEvent(Event event);
  Status SynchronizeEvent(Event event);
  // Work queued on `stream` after this call waits for `event`'s work.
  Status StreamWaitEvent(Stream stream, Event event);
  // Waits until all work queued on every stream of `device` has completed
  // (cuCtxSynchronize). The safe wait before unmapping memory whose last
  // users' streams may no longer exist.
  Status SynchronizeDevice(int device);

  // --- Data (tests and checks) -------------------------------------------
  // REQUIRES: the device range is mapped and accessible.
  Status CopyToDevice(DevicePtr dst, const void* src, uint64_t size);
  Status CopyToHost(void* dst, DevicePtr src, uint64_t size);
  Status Memset(DevicePtr dst, uint8_t value, uint64_t size);

  // --- Queued data operations (issue 20 item 6) ---------------------------
  // Work queued on `stream` that runs when the stream gets to it, like a
  // kernel (cuMemsetD8Async, cuMemcpyDtoHAsync): what `loom stress` uses as
  // kernels on the CUDA backend. Backends whose streams run work as it is
  // queued (host, fake) run it at once; the async host backend queues it
  // on the stream's worker. REQUIRES (checked like the data calls above):
  // the device range is mapped and accessible now. The caller keeps it so,
  // and `dst` valid, until the work has run (e.g. until an event recorded
  // after it completes). Stream 0, the default stream, is the default
  // stream of the device whose memory the range is (CUDA's legacy stream
  // is per context: the call runs in that device's context).
  Status MemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                     Stream stream);
  Status CopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                         Stream stream);

  // --- Failure injection (tests) -----------------------------------------
  // On every backend, so that a test serves real memory (host) and still
  // makes the driver fail. An injected failure comes after the contract
  // check and before the backend, so it looks like a backend failure: the
  // call is counted and changes nothing.
  // The `nth` next call of `op` (1 = the very next) fails with `status`.
  // REQUIRES: nth >= 1, !status.ok().
  void InjectFailure(DriverOp op, int nth, Status status);
  // Every call of `op` from now on fails with `status` (until cleared).
  void FailAlways(DriverOp op, Status status);
  void ClearFailures();

  // --- Introspection -----------------------------------------------------
  // Calls that reached the backend, by kind (failed ones included).
  uint64_t calls(DriverOp op) const;
  std::array<uint64_t, kDriverOpCount> all_calls() const;
  // The memory calls of kind `op` that reached the backend, by the bytes
  // each covered (size -> calls): create, release (the handle's size),
  // reserve, unreserve, map, unmap and set-access; empty for other kinds.
  // What a call costs on a GPU depends on its size (bench/gpu/driver_costs).
  std::map<uint64_t, uint64_t> sized_calls(DriverOp op) const;
  // Physical bytes held (created, not released), over all devices.
  uint64_t physical_bytes() const;
  // Live handles, reservations and mappings.
  ContractCounts contract_counts() const;
  // `device`'s live handles and mappings, by handle size.
  MappingLayout mapping_layout(int device) const;

 protected:
  Driver() = default;

  // Backend operations. The base class has already checked the contract and
  // holds the mapping mutex for the memory operations. A failure must leave
  // the backend's state unchanged.
  virtual StatusOr<int> DoDeviceCount() = 0;
  virtual StatusOr<DeviceProperties> DoProperties(int device) = 0;
  virtual StatusOr<uint64_t> DoGranularity(int device, Granularity kind) = 0;
  virtual StatusOr<uint64_t> DoCreate(int device, uint64_t size) = 0;
  virtual Status DoRelease(uint64_t handle) = 0;
  virtual StatusOr<DevicePtr> DoReserve(uint64_t size, uint64_t alignment) = 0;
  virtual Status DoUnreserve(DevicePtr ptr, uint64_t size) = 0;
  virtual Status DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
                       uint64_t offset) = 0;
  virtual Status DoUnmap(DevicePtr ptr, uint64_t size) = 0;
  virtual Status DoSetAccess(DevicePtr ptr, uint64_t size, int device,
                             std::span<const int> peers) = 0;
  virtual StatusOr<bool> DoCanAccessPeer(int device, int peer) = 0;
  virtual StatusOr<Stream> DoCreateStream(int device) = 0;
  virtual Status DoDestroyStream(Stream stream) = 0;
  virtual Status DoSynchronizeStream(Stream stream) = 0;
  virtual StatusOr<uint64_t> DoCreateEvent(int device) = 0;
  virtual Status DoDestroyEvent(uint64_t event) = 0;
  virtual Status DoRecordEvent(uint64_t event, Stream stream) = 0;
  virtual StatusOr<bool> DoQueryEvent(uint64_t event) = 0;
  virtual Status DoSynchronizeEvent(uint64_t event) = 0;
  virtual Status DoStreamWaitEvent(Stream stream, uint64_t event) = 0;
  virtual Status DoSynchronizeDevice(int device) = 0;
  virtual Status DoCopyToDevice(DevicePtr dst, const void* src,
                                uint64_t size) = 0;
  virtual Status DoCopyToHost(void* dst, DevicePtr src, uint64_t size) = 0;
  virtual Status DoMemset(DevicePtr dst, uint8_t value, uint64_t size) = 0;
  // Queued data operations: by default run at once through the synchronous
  // ones, which is stream order for backends that run work as it is queued.
  // `device`: the device whose memory the range is.
  virtual Status DoMemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                               Stream stream, int device);
  virtual Status DoCopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                                   Stream stream, int device);

 private:
  // Counts a call of `op` that reaches the backend; an injected failure
  // for it, if any.
  Status Call(DriverOp op) {
    calls_[static_cast<size_t>(op)].fetch_add(1, std::memory_order_relaxed);
    if (!injecting_.load(std::memory_order_acquire)) [[likely]] {
      return OkStatus();
    }
    return InjectedFailure(op);
  }
  // The same for a memory call, also counted by the bytes it covers.
  // REQUIRES: mu_ held.
  Status SizedCallLocked(DriverOp op, uint64_t bytes) {
    ++sized_[static_cast<size_t>(op)][bytes];
    return Call(op);
  }
  Status InjectedFailure(DriverOp op);
  // Minimum granularity of `device`, cached. REQUIRES: mu_ held.
  StatusOr<uint64_t> MinimumGranularityLocked(int device);
  // Checks that a device range is mapped and accessible. REQUIRES: mu_ held.
  Status CheckAccessibleLocked(DevicePtr ptr, uint64_t size) const;

  mutable std::mutex mu_;  // guards contract_, granularity_, sized_
  DriverContract contract_;
  std::vector<uint64_t> granularity_;  // per device, 0 = not yet asked
  // Memory calls by kind and size (guarded by mu_).
  std::array<std::map<uint64_t, uint64_t>, kDriverOpCount> sized_;
  std::array<std::atomic<uint64_t>, kDriverOpCount> calls_{};

  // Failure injection: any pending (guarded by inject_mu_, taken after mu_).
  std::atomic<bool> injecting_{false};
  std::mutex inject_mu_;
  struct Injection {
    DriverOp op;
    int countdown;  // fails when it reaches 0
    Status status;
  };
  std::vector<Injection> injections_;
  std::array<Status, kDriverOpCount> always_;  // OK = none
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_DRIVER_H_
