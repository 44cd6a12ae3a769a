#include "vmm/stream_tracker.h"

namespace loom::vmm {
namespace {

// Checkpoints kept per stream; beyond that the newest absorbs the one before
// (a later event covers earlier epochs: release is only later, never wrong).
constexpr size_t kMaxCheckpoints = 8;

}  // namespace

std::string_view WaitSiteName(WaitSite site) {
  switch (site) {
    case WaitSite::kFree:
      return "free";
    case WaitSite::kSecondStream:
      return "second_stream";
    case WaitSite::kRecordStream:
      return "record_stream";
    case WaitSite::kRecordStreamSync:
      return "record_stream_sync";
    case WaitSite::kEmptyCache:
      return "empty_cache";
    case WaitSite::kPlanInstall:
      return "plan_install";
    case WaitSite::kPlanUnload:
      return "plan_unload";
    case WaitSite::kReclaim:
      return "reclaim";
    case WaitSite::kShutdown:
      return "shutdown";
    case WaitSite::kCount:
      break;
  }
  return "?";
}

std::string_view WaitKindName(WaitKind kind) {
  switch (kind) {
    case WaitKind::kEventRecord:
      return "events";
    case WaitKind::kStreamSync:
      return "stream_syncs";
    case WaitKind::kDeviceSync:
      return "device_syncs";
    case WaitKind::kCount:
      break;
  }
  return "?";
}

uint64_t WaitCounters::Total(WaitKind kind) const {
  uint64_t total = 0;
  for (const auto& site : counts) total += site[static_cast<size_t>(kind)];
  return total;
}

StreamTracker::~StreamTracker() {
  for (StreamState& s : streams_) {
    for (const Checkpoint& c : s.checkpoints) idle_events_.push_back(c.event);
  }
  for (Event e : idle_events_) driver_.DestroyEvent(e).IgnoreError();
}

StreamTracker::StreamState& StreamTracker::State(Stream stream) {
  for (StreamState& s : streams_) {
    if (s.stream == stream) return s;
  }
  streams_.push_back(StreamState{stream});
  return streams_.back();
}

std::vector<FreeTag> StreamTracker::UseSlow(Stream stream) {
  const size_t before = streams_.size();
  State(stream);
  if (multi_stream_ || streams_.size() < 2 || streams_.size() == before) {
    return {};
  }
  // A second stream: from now on frees record events, and what was freed
  // before on the other streams is closed by a checkpoint now.
  multi_stream_ = true;
  std::vector<FreeTag> closing;
  for (StreamState& s : streams_) {
    if (!s.dirty) continue;
    closing.push_back(FreeTag{s.stream, s.open});
    Close(s, WaitSite::kSecondStream);
  }
  return closing;
}

FreeTag StreamTracker::ReleasedSlow(Stream stream) {
  StreamState& s = State(stream);
  s.dirty = true;
  if (!multi_stream_) return FreeTag{stream, 0};
  const FreeTag tag{stream, s.open};
  Close(s, WaitSite::kFree);
  return tag;
}

bool StreamTracker::NeedsWaitForUnmap() const {
  if (multi_stream_) return false;  // fences describe everything
  for (const StreamState& s : streams_) {
    if (s.dirty) return true;
  }
  return false;
}

std::vector<FreeTag> StreamTracker::ReleasedEverywhere() {
  std::vector<FreeTag> tags;
  for (size_t i = 0; i < streams_.size(); ++i) {
    tags.push_back(Released(streams_[i].stream));
  }
  return tags;
}

StatusOr<Event> StreamTracker::TakeEvent() {
  if (!idle_events_.empty()) {
    Event e = idle_events_.back();
    idle_events_.pop_back();
    return e;
  }
  return driver_.CreateEvent(device_);
}

void StreamTracker::Close(StreamState& s, WaitSite site) {
  StatusOr<Event> event = TakeEvent();
  if (!event.ok()) return;
  if (!driver_.RecordEvent(*event, s.stream).ok()) {
    idle_events_.push_back(*event);
    return;
  }
  waits_.Add(site, WaitKind::kEventRecord);
  if (s.checkpoints.size() >= kMaxCheckpoints) Poll(s);
  if (s.checkpoints.size() >= kMaxCheckpoints) {
    idle_events_.push_back(s.checkpoints.back().event);
    s.checkpoints.pop_back();
  }
  s.checkpoints.push_back({s.open, *event});
  ++s.open;
  s.dirty = false;
}

void StreamTracker::Poll(StreamState& s) {
  while (!s.checkpoints.empty()) {
    StatusOr<bool> done = driver_.QueryEvent(s.checkpoints.front().event);
    if (!done.ok() || !*done) return;
    s.completed = s.checkpoints.front().epoch;
    idle_events_.push_back(s.checkpoints.front().event);
    s.checkpoints.pop_front();
  }
}

bool StreamTracker::Complete(const FreeTag& tag) {
  if (tag.epoch == 0) return true;
  StreamState& s = State(tag.stream);
  if (s.completed >= tag.epoch) return true;
  if (s.not_done_call == call_) return false;
  Poll(s);
  if (s.completed >= tag.epoch) return true;
  s.not_done_call = call_;
  return false;
}

bool StreamTracker::Ready(const FreeTag& tag, Stream requester) {
  return tag.stream == requester || Complete(tag);
}

Status StreamTracker::WaitForAll(WaitSite site) {
  bool pending = false;
  for (StreamState& s : streams_) {
    const uint64_t handed_out = s.dirty ? s.open : s.open - 1;
    if (s.completed < handed_out) {
      Poll(s);
      pending |= s.completed < handed_out;
    }
  }
  if (!pending) return OkStatus();
  LOOM_RETURN_IF_ERROR(driver_.SynchronizeDevice(device_));
  waits_.Add(site, WaitKind::kDeviceSync);
  for (StreamState& s : streams_) {
    if (s.dirty) {
      ++s.open;
      s.dirty = false;
    }
    s.completed = s.open - 1;
    for (const Checkpoint& c : s.checkpoints) idle_events_.push_back(c.event);
    s.checkpoints.clear();
  }
  return OkStatus();
}

}  // namespace loom::vmm
