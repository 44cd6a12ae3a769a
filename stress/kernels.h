// Kernels: the stress program's stand-ins for GPU kernels, per backend. A
// producer stamps a buffer with its own value; a consumer checks, when its
// stream gets to it, that the buffer still holds that value (anything else
// means another allocation wrote there while this one was in use).
//  - async host backend: real kernels queued on the stream's worker
//    (AsyncHostDriver::Launch) after a random delay of up to max_delay_us;
//    they write and read an 8-byte stamp every 4 KiB through the host
//    addresses;
//  - host backend: the same kernels, run at once; fake: nothing (no data);
//  - cuda: a producer is a memset of the whole buffer to its stamp's byte
//    queued on the stream (Driver::MemsetAsync); a consumer is a copy of the
//    whole buffer to host memory queued on the stream (CopyToHostAsync)
//    with an event recorded after it. The check runs on the host once that
//    event has completed (Poll, or Drain at the end), so it sees what the
//    device wrote when it got there.
// Problems go to the Report callback: a fault (a queued operation refused,
// an error from the stream) or a corrupted buffer. Thread-safe.
#ifndef LOOM_STRESS_KERNELS_H_
#define LOOM_STRESS_KERNELS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "vmm/driver.h"

namespace loom::stress {

// A buffer as the kernels see it.
struct Target {
  vmm::DevicePtr ptr = 0;
  uint64_t size = 0;
  uint64_t stamp = 0;  // the producer's value; nonzero
  int device = 0;
};

enum class Problem { kFault, kCorrupted };

class Kernels {
 public:
  using Report = std::function<void(Problem, std::string)>;

  // The kernels for `driver`'s backend (async, host, fake, cuda).
  static std::unique_ptr<Kernels> For(vmm::Driver& driver, int max_delay_us,
                                      Report report);
  virtual ~Kernels() = default;

  // Stamps `t` on `stream`.
  virtual void Produce(vmm::Stream stream, const Target& t) = 0;
  // Checks `t` holds its stamp, on `stream`.
  virtual void Consume(vmm::Stream stream, const Target& t) = 0;
  // Finishes the checks whose work has completed (cuda); cheap to call
  // after every operation.
  virtual void Poll() {}
  // Waits for every queued kernel and finishes every check.
  virtual void Drain() {}

  uint64_t launched() const { return launched_.load(); }

 protected:
  std::atomic<uint64_t> launched_{0};
};

}  // namespace loom::stress

#endif  // LOOM_STRESS_KERNELS_H_
