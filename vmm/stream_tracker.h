// StreamTracker: when memory freed on one stream may be used again, for one
// device's allocator (CUDA's stream semantics).
//
// A free on stream S does not mean S's kernels are done with the memory: they
// may still be queued. Reuse by S itself is safe (stream order); reuse by
// another stream, and any unmap or remap of the memory, must wait until the
// work S had queued at the free has completed.
//
// While the device has seen one stream only, a free gets the tag (S, 0):
// nothing for another stream to wait for, since there is none, and nothing
// for the allocator to fence per page (a single-stream training loop pays
// neither an event nor any bookkeeping per free); the tracker only notes
// that S has freed since the last device-wide wait, which unmapping must
// still do first (NeedsWaitForUnmap). When a second stream appears, the
// open epoch of the first is closed by a checkpoint event and Use() returns
// that tag: the allocator then fences every page with it, since any of them
// may hold bytes freed before. From then on each free gets the tag (S, e),
// e being S's current epoch, and records an event on S at the free (a
// checkpoint closing e, so the memory of a free is released by an event
// recorded right after it, while the stream is known to exist). Tag (S, e) is
// complete once a checkpoint of S with epoch >= e has completed (CUDA completes
// a stream's events in order). Nothing is ever inferred from an event recorded
// later than the free, so a busy stream still has its frees released once the
// work before them is done. WaitForAll is the one wait that needs no event: a
// device-wide synchronisation, after which every tag handed out so far is
// complete; it is what the allocator does before unmapping or remapping memory
// whose tags are not complete (as PyTorch synchronises before it releases
// memory).
//
// The tracker also keeps the allocator's wait counters (WaitCounters): every
// event loom records and every stream or device synchronisation it does, by
// the call site that did it (issue 21: what loom does that can make the GPU
// or the host wait, in loom.memory_stats()).
//
// Not thread-safe: the allocator serialises access.
#ifndef LOOM_VMM_STREAM_TRACKER_H_
#define LOOM_VMM_STREAM_TRACKER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "vmm/driver.h"

namespace loom::vmm {

// Where loom waited or recorded something to wait for. Names (WaitSiteName)
// are the keys of loom.memory_stats(): "loom.waits.<site>.<kind>".
enum class WaitSite : uint8_t {
  kFree,              // a checkpoint event at a free (several streams)
  kSecondStream,      // checkpoints when a second stream appears
  kRecordStream,      // events for record_stream's streams at a free
  kRecordStreamSync,  // such a stream synchronised (no event recorded)
  kEmptyCache,        // before empty_cache unmaps and releases
  kPlanInstall,       // before a plan (variant) install unmaps idle arena
  kPlanUnload,        // before the static region's mappings go
  kReclaim,           // before an idle chunk is remapped elsewhere
  kShutdown,          // before the allocator releases everything
  kCount,             // not a site
};
enum class WaitKind : uint8_t {
  kEventRecord,  // an event recorded (a later query or wait may use it)
  kStreamSync,   // the host waited for one stream
  kDeviceSync,   // the host waited for the whole device
  kCount,        // not a kind
};
inline constexpr size_t kWaitSiteCount = static_cast<size_t>(WaitSite::kCount);
inline constexpr size_t kWaitKindCount = static_cast<size_t>(WaitKind::kCount);
std::string_view WaitSiteName(WaitSite site);  // "free", "empty_cache", ...
std::string_view WaitKindName(WaitKind kind);  // "events", "device_syncs", ...

struct WaitCounters {
  std::array<std::array<uint64_t, kWaitKindCount>, kWaitSiteCount> counts{};
  void Add(WaitSite site, WaitKind kind) {
    ++counts[static_cast<size_t>(site)][static_cast<size_t>(kind)];
  }
  uint64_t Get(WaitSite site, WaitKind kind) const {
    return counts[static_cast<size_t>(site)][static_cast<size_t>(kind)];
  }
  // Over every site.
  uint64_t Total(WaitKind kind) const;
};

struct FreeTag {
  Stream stream = 0;
  uint64_t epoch = 0;  // 0: nothing to wait for
};

class StreamTracker {
 public:
  StreamTracker(Driver& driver, int device)
      : driver_(driver), device_(device) {}
  // Destroys the events it holds.
  ~StreamTracker();
  StreamTracker(const StreamTracker&) = delete;
  StreamTracker& operator=(const StreamTracker&) = delete;

  // `stream` is used by a request now (an allocation, or record_stream): the
  // first use of a second stream switches to recording events at frees. On
  // that switch, returns the tags closing what the streams seen before
  // freed (to fence every page with); otherwise nothing.
  std::vector<FreeTag> Use(Stream stream) {
    if (streams_.size() == 1 && streams_[0].stream == stream) return {};
    return UseSlow(stream);
  }
  // The tag of bytes freed on `stream` now.
  FreeTag Released(Stream stream) {
    if (!multi_stream_ && !streams_.empty() && streams_[0].stream == stream) {
      streams_[0].dirty = true;  // the single-stream hot path
      return FreeTag{stream, 0};
    }
    return ReleasedSlow(stream);
  }
  // Tags of bytes released now with respect to every stream seen: another
  // stream may use them once all the others' work before now is done (for
  // memory a CUDA graph may have used on any stream).
  std::vector<FreeTag> ReleasedEverywhere();
  // True when `requester` may use bytes tagged `tag` now: its own stream's
  // frees always; another stream's once their work has completed (an event
  // query, at most once per stream between two calls of NewCall()).
  bool Ready(const FreeTag& tag, Stream requester);
  // True when the tagged work has completed (whatever the requester).
  bool Complete(const FreeTag& tag);
  // Waits until every tag handed out so far is complete: waits for the
  // events of the streams that have them, or synchronises the device once
  // when a tag has no event. No-op when everything is already complete.
  // `site`: who waits (counted).
  Status WaitForAll(WaitSite site);
  // Starts a new allocator call: event queries may be asked again.
  void NewCall() { ++call_; }
  // True when memory freed so far may still be in use by queued work that no
  // per-page fence describes (frees of the single-stream mode since the last
  // device-wide wait): unmapping must WaitForAll first.
  bool NeedsWaitForUnmap() const;

  bool multi_stream() const { return multi_stream_; }
  uint64_t events_recorded() const {
    return waits_.Total(WaitKind::kEventRecord);
  }
  uint64_t device_syncs() const { return waits_.Total(WaitKind::kDeviceSync); }
  const WaitCounters& waits() const { return waits_; }
  // Counts what the allocator itself did (record_stream's events).
  void Count(WaitSite site, WaitKind kind) { waits_.Add(site, kind); }

 private:
  struct Checkpoint {
    uint64_t epoch = 0;
    Event event;
  };
  struct StreamState {
    Stream stream = 0;
    uint64_t open = 1;       // the epoch frees are tagged with now
    uint64_t completed = 0;  // every epoch <= this has completed
    bool dirty = false;      // frees tagged with `open` since it opened
    uint64_t not_done_call = ~uint64_t{0};  // call of the last "not yet"
    std::deque<Checkpoint> checkpoints;     // oldest first
  };

  StreamState& State(Stream stream);
  std::vector<FreeTag> UseSlow(Stream stream);
  FreeTag ReleasedSlow(Stream stream);
  // Records a checkpoint closing `s`'s open epoch. On failure, the epoch
  // stays open (only WaitForAll can complete it).
  void Close(StreamState& s, WaitSite site);
  // Advances `s.completed` over the checkpoints that have completed.
  void Poll(StreamState& s);
  StatusOr<Event> TakeEvent();

  Driver& driver_;
  const int device_;
  std::vector<StreamState> streams_;  // few: a linear scan beats a map
  std::vector<Event> idle_events_;
  bool multi_stream_ = false;
  uint64_t call_ = 0;
  WaitCounters waits_;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_STREAM_TRACKER_H_
