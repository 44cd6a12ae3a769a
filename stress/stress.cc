#include "stress/stress.h"

#include <atomic>
#include <chrono>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include "autoplan/replanner.h"
#include "plan/make_plan.h"
#include "stress/kernels.h"
#include "stress/ownership.h"
#include "vmm/allocator.h"
#include "vmm/async_host_driver.h"
#include "vmm/driver_factory.h"
#include "vmm/plan_loader.h"

namespace loom::stress {
namespace {

using vmm::DevicePtr;
using vmm::Stream;

constexpr size_t kMaxFailureTexts = 20;
// The text of an injected driver failure (StressOptions).
constexpr std::string_view kInjected = "injected driver failure";
constexpr int kCheckEvery = 64;

// A buffer the program holds (or a graph's, until its pool is released).
struct Buffer {
  DevicePtr ptr = 0;
  uint64_t size = 0;
  Stream stream = 0;
  int device = 0;
  uint64_t stamp = 0;  // written by its producer, expected by consumers
  uint64_t owner = 0;  // key in the physical-ownership map
};

// A captured graph: its buffers are replayed on its stream until released.
struct Graph {
  vmm::Allocator::PoolId pool;
  int device = 0;
  Stream stream = 0;
  uint64_t owner = 0;  // the ownership key of all its buffers
  std::vector<Buffer> buffers;
};

class Harness {
 public:
  Harness(const StressOptions& options, vmm::Driver& driver)
      : options_(options),
        driver_(driver),
        async_(dynamic_cast<vmm::AsyncHostDriver*>(&driver)),
        kernels_(Kernels::For(driver, options.max_delay_us,
                              [this](Problem problem, std::string what) {
                                Failure(problem == Problem::kFault ? faults_
                                                                   : corrupted_,
                                        std::move(what));
                              })) {}

  Status Init();
  void Run();
  StressReport Finish();

 private:
  struct ThreadState {
    std::mt19937_64 rng;
    std::vector<Buffer> live;
    std::vector<Graph> graphs;
    std::vector<Stream> capture_streams;  // per device
    uint64_t ops = 0;
    // Thread 0 repeats a fixed script of request sizes and frees its oldest
    // buffer first, so the recorded run is regular enough to plan and the
    // plan gets hits; the other threads are random.
    std::vector<uint64_t> script;
    size_t next_in_script = 0;
    bool in_iteration = false;
    uint64_t iteration = 0;
  };

  void ThreadMain(int index);
  void Step(int index, ThreadState& t);
  bool TimeUp() const;

  // Operations.
  // `owner` 0: the buffer owns its bytes alone; else a graph's key, shared
  // by every buffer of that graph.
  void Allocate(ThreadState& t, int device, Stream stream, uint64_t owner,
                Buffer* out, bool* made);
  void Free(ThreadState& t, size_t which);
  void UseOnOtherStream(ThreadState& t, Buffer& b);
  void Capture(int index, ThreadState& t);
  void Replay(ThreadState& t, Graph& g);
  void InstallPlan();

  // Kernels (kernels.h).
  void Produce(Stream stream, const Buffer& b) {
    kernels_->Produce(stream, {b.ptr, b.size, b.stamp, b.device});
  }
  void Consume(Stream stream, const Buffer& b) {
    kernels_->Consume(stream, {b.ptr, b.size, b.stamp, b.device});
  }

  // Physical ownership: every live buffer's bytes, checked at hand-out.
  bool Own(const Buffer& b, vmm::Allocator& a);
  void Disown(const Buffer& b);

  void Failure(std::atomic<uint64_t>& counter, std::string what);
  // Makes one of the next few memory calls fail (StressOptions).
  void InjectDriverFailure(ThreadState& t);
  uint64_t Random(ThreadState& t, uint64_t n) { return t.rng() % n; }
  // Log-uniform from 512 B to max_request, odd sizes included.
  uint64_t RandomSize(ThreadState& t) {
    const double exponent = std::uniform_real_distribution<double>(
        9, std::log2(options_.max_request))(t.rng);
    return std::max<uint64_t>(
        1, static_cast<uint64_t>(std::exp2(exponent)) - Random(t, 512));
  }

  const StressOptions& options_;
  vmm::Driver& driver_;
  vmm::AsyncHostDriver* async_;
  std::unique_ptr<Kernels> kernels_;
  std::vector<std::unique_ptr<vmm::Allocator>> allocators_;
  // After the plan is installed, one per allocator, driven by thread 0:
  // iterations the plan does not fit are re-planned as variants.
  std::vector<std::unique_ptr<autoplan::Replanner>> replanners_;
  std::vector<std::vector<Stream>> streams_;  // per device
  std::vector<Stream> created_streams_;
  std::vector<ThreadState> threads_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> total_ops_{0};
  std::atomic<uint64_t> next_stamp_{1};
  std::atomic<bool> plan_done_{false};

  Ownership ownership_;  // physical bytes of live buffers
  std::mutex mu_;        // guards failures_, events_
  std::vector<std::string> failures_;
  // Idle events for event waits, per device: an event records on its own
  // device's streams only (stream 0 is the default stream of the event's
  // device: one of another device would order nothing).
  std::vector<std::vector<vmm::Event>> events_;

  std::atomic<uint64_t> allocs_{0}, frees_{0}, cross_{0}, waits_{0},
      empty_caches_{0}, ooms_{0}, plans_{0}, captures_{0}, replays_{0},
      corrupted_{0}, invariant_failures_{0}, faults_{0}, driver_failures_{0};
};

Status Harness::Init() {
  for (int d = 0; d < options_.devices; ++d) {
    vmm::AllocatorOptions a;
    a.device = d;
    a.memory_cap_bytes = options_.cap_bytes;
    a.arena_va_bytes = uint64_t{8} << 30;
    a.record_capacity = options_.plan ? (size_t{1} << 20) : 0;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<vmm::Allocator> allocator,
                          vmm::Allocator::Create(driver_, a));
    allocators_.push_back(std::move(allocator));
    // The default stream too, but on CUDA stream 0 is the calling thread's
    // current device's (device 0's here): other devices get one more.
    std::vector<Stream> streams;
    if (d == 0 || driver_.name() != "cuda") streams.push_back(0);
    for (int k = static_cast<int>(streams.size()); k < options_.streams; ++k) {
      LOOM_ASSIGN_OR_RETURN(Stream s, driver_.CreateStream(d));
      streams.push_back(s);
      created_streams_.push_back(s);
    }
    streams_.push_back(std::move(streams));
  }
  threads_.resize(options_.threads);
  for (int i = 0; i < options_.threads; ++i) {
    ThreadState& t = threads_[i];
    t.rng.seed(options_.seed * 1000003 + i);
    if (i == 0) {
      for (int k = 0; k < 37; ++k) t.script.push_back(RandomSize(t));
    }
    for (int d = 0; d < options_.devices; ++d) {
      LOOM_ASSIGN_OR_RETURN(Stream s, driver_.CreateStream(d));
      t.capture_streams.push_back(s);
      created_streams_.push_back(s);
    }
  }
  return OkStatus();
}

bool Harness::TimeUp() const {
  if (options_.max_ops != 0 && total_ops_.load() >= options_.max_ops) {
    return true;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  return elapsed >= options_.seconds;
}

void Harness::Run() {
  start_ = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int i = 0; i < options_.threads; ++i) {
    workers.emplace_back([this, i] { ThreadMain(i); });
  }
  for (std::thread& w : workers) w.join();
}

void Harness::ThreadMain(int index) {
  ThreadState& t = threads_[index];
  while (!TimeUp()) {
    Step(index, t);
    kernels_->Poll();
    ++t.ops;
    const uint64_t ops = ++total_ops_;
    if (ops % kCheckEvery == 0) {
      for (auto& a : allocators_) a->CheckInvariants();
    }
  }
  // Wind down: free everything, release every graph.
  while (!t.live.empty()) Free(t, t.live.size() - 1);
  for (Graph& g : t.graphs) {
    // Disowned first: once released, another thread may get the memory.
    if (!g.buffers.empty()) Disown(g.buffers.front());
    allocators_[g.device]->ReleasePool(g.pool).IgnoreError();
  }
  t.graphs.clear();
  if (t.in_iteration) allocators_[0]->IterationEnd(t.iteration);
}

void Harness::Step(int index, ThreadState& t) {
  // Thread 0 marks iterations and installs the plan once, a third in.
  if (index == 0) {
    if (t.ops % 97 == 0) {
      for (size_t d = 0; d < allocators_.size(); ++d) {
        vmm::Allocator& a = *allocators_[d];
        if (t.in_iteration) a.IterationEnd(t.iteration);
        if (d < replanners_.size()) replanners_[d]->BeforeIterationBegin();
        // Rarely the plans go (refused while static bytes live); the
        // single-thread runs keep theirs, for plan hits.
        if (options_.threads > 1 && Random(t, 128) == 0) {
          a.UnloadPlans().IgnoreError();
        }
        a.IterationBegin(t.iteration + 1);
      }
      if (t.in_iteration) ++t.iteration;
      t.in_iteration = true;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    const bool third = options_.max_ops != 0
                           ? total_ops_.load() * 3 >= options_.max_ops
                           : elapsed * 3 >= options_.seconds;
    if (options_.plan && third && !plan_done_.exchange(true)) InstallPlan();
  }
  const int device = static_cast<int>(Random(t, options_.devices));
  const std::vector<Stream>& streams = streams_[device];
  const uint64_t roll = Random(t, 1000);
  if (roll < 380 || t.live.empty()) {
    Buffer b;
    bool made = false;
    Allocate(t, device, streams[Random(t, streams.size())], 0, &b, &made);
    if (made) t.live.push_back(b);
  } else if (roll < 700) {
    Free(t, t.script.empty() ? Random(t, t.live.size()) : 0);
  } else if (roll < 830) {
    Buffer& b = t.live[Random(t, t.live.size())];
    Consume(b.stream, b);
  } else if (roll < 930) {
    UseOnOtherStream(t, t.live[Random(t, t.live.size())]);
  } else if (roll < 945) {
    allocators_[device]->EmptyCache().IgnoreError();
    ++empty_caches_;
  } else if (roll < 965 && index == 0) {
    // A dynamic module (MoE-like): a request whose size varies.
    vmm::Allocator& a = *allocators_[device];
    a.ModuleEnter("moe", /*dynamic=*/true);
    Buffer b;
    bool made = false;
    Allocate(t, device, streams[0], 0, &b, &made);
    if (made) t.live.push_back(b);
    a.ModuleExit("moe");
  } else if (roll < 985 && options_.graphs) {
    if (!t.graphs.empty() && Random(t, 2) == 0) {
      Replay(t, t.graphs[Random(t, t.graphs.size())]);
    } else {
      Capture(index, t);
    }
  } else if (!t.graphs.empty()) {
    // A graph destroyed: its pool released while replays may be queued.
    const size_t which = Random(t, t.graphs.size());
    Graph g = std::move(t.graphs[which]);
    t.graphs.erase(t.graphs.begin() + which);
    if (!g.buffers.empty()) Disown(g.buffers.front());
    allocators_[g.device]->ReleasePool(g.pool).IgnoreError();
  }
  if (t.live.size() > 48) {
    Free(t, t.script.empty() ? Random(t, t.live.size()) : 0);
  }
}

void Harness::Allocate(ThreadState& t, int device, Stream stream,
                       uint64_t owner, Buffer* out, bool* made) {
  *made = false;
  uint64_t size = 0;
  if (!t.script.empty() && owner == 0) {
    size = t.script[t.next_in_script];
    t.next_in_script = (t.next_in_script + 1) % t.script.size();
  } else {
    size = RandomSize(t);
  }
  vmm::Allocator& a = *allocators_[device];
  if (options_.driver_failure_percent > 0 &&
      static_cast<int>(Random(t, 100)) < options_.driver_failure_percent) {
    InjectDriverFailure(t);
  }
  StatusOr<DevicePtr> ptr = a.Allocate(size, stream);
  ++allocs_;
  if (!ptr.ok()) {
    if (ptr.status().code() == StatusCode::kOutOfMemory) {
      ++ooms_;
      if (!t.live.empty()) Free(t, Random(t, t.live.size()));
      return;
    }
    if (options_.driver_failure_percent > 0 &&
        ptr.status().message().find(kInjected) != std::string_view::npos) {
      ++driver_failures_;  // the program catches it and goes on
      return;
    }
    Failure(invariant_failures_,
            fmt::format("allocation failed: {}", ptr.status().ToString()));
    return;
  }
  Buffer b;
  b.ptr = *ptr;
  b.size = size;
  b.stream = stream;
  b.device = device;
  b.stamp = next_stamp_++;
  b.owner = owner != 0 ? owner : b.stamp;
  if (async_ != nullptr && !async_->CheckHandOut(b.ptr, b.size, stream)) {
    ++faults_;  // described by the driver
  }
  if (!Own(b, a)) {
    // Never use memory that is not ours: it would corrupt the other owner.
    a.Free(b.ptr).IgnoreError();
    ++frees_;
    return;
  }
  Produce(stream, b);
  *out = b;
  *made = true;
}

void Harness::InjectDriverFailure(ThreadState& t) {
  static constexpr vmm::DriverOp kOps[] = {
      vmm::DriverOp::kCreate, vmm::DriverOp::kMap, vmm::DriverOp::kSetAccess,
      vmm::DriverOp::kUnmap, vmm::DriverOp::kRelease};
  driver_.InjectFailure(kOps[Random(t, std::size(kOps))],
                        1 + static_cast<int>(Random(t, 4)),
                        InternalError("{}", kInjected));
}

void Harness::Free(ThreadState& t, size_t which) {
  Buffer b = t.live[which];
  if (t.script.empty()) {
    t.live[which] = t.live.back();
    t.live.pop_back();
  } else {
    t.live.erase(t.live.begin() + which);  // keep the script's order
  }
  Disown(b);
  Status status = allocators_[b.device]->Free(b.ptr);
  ++frees_;
  if (!status.ok()) {
    Failure(invariant_failures_,
            fmt::format("free failed: {}", status.ToString()));
  }
}

void Harness::UseOnOtherStream(ThreadState& t, Buffer& b) {
  const std::vector<Stream>& streams = streams_[b.device];
  if (streams.size() < 2) return;
  Stream other = streams[Random(t, streams.size())];
  if (other == b.stream) return;
  // PyTorch's pattern: the consumer stream waits for the producer's work;
  // record_stream keeps the memory from reuse until the consumer is done.
  vmm::Event event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (events_.size() <= static_cast<size_t>(b.device)) {
      events_.resize(b.device + 1);
    }
    std::vector<vmm::Event>& idle = events_[b.device];
    if (!idle.empty()) {
      event = idle.back();
      idle.pop_back();
    }
  }
  if (event.value == 0) {
    StatusOr<vmm::Event> created = driver_.CreateEvent(b.device);
    if (!created.ok()) return;
    event = *created;
  }
  if (driver_.RecordEvent(event, b.stream).ok() &&
      driver_.StreamWaitEvent(other, event).ok()) {
    ++waits_;
    Status recorded = allocators_[b.device]->RecordStream(b.ptr, other);
    if (!recorded.ok()) {
      Failure(invariant_failures_,
              fmt::format("record_stream failed: {}", recorded.ToString()));
    }
    Consume(other, b);
    ++cross_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  events_[b.device].push_back(event);
}

void Harness::Capture(int index, ThreadState& t) {
  const int device = static_cast<int>(Random(t, options_.devices));
  Graph g;
  g.device = device;
  g.stream = t.capture_streams[device];
  g.pool = {static_cast<uint64_t>(index) + 1, next_stamp_++};
  g.owner = (uint64_t{1} << 63) | g.pool.second;
  vmm::Allocator& a = *allocators_[device];
  const Stream capture = g.stream;
  if (!a.BeginAllocateToPool(g.pool, [capture](Stream s) {
          return s == capture;
        }).ok()) {
    return;
  }
  ++captures_;
  // The captured work: a few buffers, most freed again inside the capture
  // (the graph reuses their memory at every replay).
  std::vector<Buffer> open;
  const int count = 2 + static_cast<int>(Random(t, 5));
  for (int i = 0; i < count; ++i) {
    Buffer b;
    bool made = false;
    Allocate(t, device, capture, g.owner, &b, &made);
    if (!made) continue;
    Consume(capture, b);
    g.buffers.push_back(b);
    open.push_back(b);
    if (Random(t, 3) != 0) {
      const size_t k = Random(t, open.size());
      a.Free(open[k].ptr).IgnoreError();
      ++frees_;
      open.erase(open.begin() + k);
    }
  }
  for (const Buffer& b : open) {
    a.Free(b.ptr).IgnoreError();
    ++frees_;
  }
  a.EndAllocateToPool(g.pool).IgnoreError();
  // The graph owns every byte it used until its pool is released, freed
  // buffers included: a replay writes them again. Buffers freed inside the
  // capture may overlap each other (the graph reuses them in order), so
  // only their union is owned, under one owner key per graph.
  if (g.buffers.empty()) {
    a.ReleasePool(g.pool).IgnoreError();
    return;
  }
  t.graphs.push_back(std::move(g));
}

void Harness::Replay(ThreadState& t, Graph& g) {
  (void)t;
  // Replays follow capture order on the capture stream.
  for (const Buffer& b : g.buffers) {
    Produce(g.stream, b);
    Consume(g.stream, b);
  }
  ++replays_;
}

void Harness::InstallPlan() {
  for (auto& allocator : allocators_) {
    plan::Trace trace = allocator->RecordedTrace();
    plan::MakePlanOptions options;
    options.time_limit_seconds = 0.5;
    options.granule_bytes = options_.granularity;
    options.include_persistent = false;  // they already live in the arena
    StatusOr<plan::MadePlan> made = plan::MakePlan(trace, options);
    if (!made.ok()) continue;
    StatusOr<vmm::RuntimePlan> runtime =
        vmm::ToRuntimePlan(made->file, "stress", options_.granularity);
    if (!runtime.ok()) continue;
    if (allocator->LoadPlan(*std::move(runtime)).ok()) ++plans_;
    allocator->StopRecording();
  }
  for (auto& allocator : allocators_) {
    autoplan::ReplanOptions replan;
    replan.plan_options.time_limit_seconds = 0.2;
    replan.record_capacity = 1 << 16;
    replanners_.push_back(
        std::make_unique<autoplan::Replanner>(*allocator, replan));
  }
}

bool Harness::Own(const Buffer& b, vmm::Allocator& a) {
  std::string conflict =
      ownership_.Take(b.device, b.owner, a.PhysicalExtents(b.ptr));
  if (conflict.empty()) return true;
  Failure(
      invariant_failures_,
      fmt::format("buffer {} ({} bytes at {:#x}, stream {:#x}) was given {}",
                  b.stamp, b.size, b.ptr, b.stream, conflict));
  return false;
}

void Harness::Disown(const Buffer& b) { ownership_.Release(b.owner); }

void Harness::Failure(std::atomic<uint64_t>& counter, std::string what) {
  ++counter;
  std::lock_guard<std::mutex> lock(mu_);
  if (failures_.size() < kMaxFailureTexts) failures_.push_back(std::move(what));
}

StressReport Harness::Finish() {
  driver_.ClearFailures();  // the program is over: teardown does not fail
  kernels_->Drain();
  for (auto& a : allocators_) {
    a->CheckInvariants();
    a->EmptyCache().IgnoreError();
  }
  StressReport r;
  r.ops = total_ops_;
  r.allocs = allocs_;
  r.frees = frees_;
  r.kernels = kernels_->launched();
  r.cross_stream_uses = cross_;
  r.event_waits = waits_;
  r.empty_caches = empty_caches_;
  r.ooms = ooms_;
  r.driver_failures = driver_failures_;
  r.plans_installed = plans_;
  for (const auto& replanner : replanners_) {
    r.replans += replanner->stats().replans;
  }
  r.graph_captures = captures_;
  r.graph_replays = replays_;
  r.corrupted = corrupted_;
  r.invariant_failures = invariant_failures_;
  r.faults = faults_;
  for (auto& a : allocators_) {
    const vmm::AllocatorStats stats = a->stats();
    r.plan_hits += stats.plan_hits;
    r.plan_misses += stats.plan_misses + stats.unplanned;
    r.plan_suspensions += stats.plan_suspensions;
    r.region_reuses += stats.region_reuses;
    r.plans_unloaded += stats.plans_unloaded;
    r.oom_retries += stats.num_alloc_retries;
  }
  if (async_ != nullptr) {
    vmm::AsyncHostDriver::Counters c = async_->counters();
    r.kernels_skipped = c.kernels_skipped;
    // Faults the driver saw on its own (unmaps, kernels that found their
    // memory gone) besides the hand-outs counted above.
    uint64_t hand_outs = faults_;
    r.faults = std::max<uint64_t>(c.faults, hand_outs);
    for (std::string& f : async_->TakeFaults()) {
      if (r.failures.size() < kMaxFailureTexts) r.failures.push_back(f);
    }
  }
  for (std::string& f : failures_) {
    if (r.failures.size() < kMaxFailureTexts) r.failures.push_back(f);
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  for (const std::vector<vmm::Event>& idle : events_) {
    for (vmm::Event e : idle) driver_.DestroyEvent(e).IgnoreError();
  }
  kernels_.reset();     // reports nothing more: every check is done
  replanners_.clear();  // they use the allocators
  allocators_.clear();
  for (Stream s : created_streams_) driver_.DestroyStream(s).IgnoreError();
  return r;
}

}  // namespace

StatusOr<StressReport> RunStress(const StressOptions& options) {
  if (options.threads < 1 || options.threads > 64 || options.streams < 1 ||
      options.streams > 64 || options.devices < 1 || options.devices > 8) {
    return InvalidArgumentError(
        "stress: threads 1..64, streams 1..64 and devices 1..8 (got {}, {}, "
        "{})",
        options.threads, options.streams, options.devices);
  }
  if (!(options.seconds > 0) && options.max_ops == 0) {
    return InvalidArgumentError("stress: give --seconds or --ops");
  }
  if (options.max_request < 1024 || options.granularity == 0) {
    return InvalidArgumentError("stress: max request below 1 KiB");
  }
  if (options.driver_failure_percent < 0 ||
      options.driver_failure_percent > 100) {
    return InvalidArgumentError("stress: driver failures {}% is not 0-100",
                                options.driver_failure_percent);
  }
  vmm::DriverOptions driver_options;
  driver_options.granularity = options.granularity;
  driver_options.device_count = options.devices;
  driver_options.capacity_per_device = uint64_t{4} << 30;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<vmm::Driver> driver,
                        vmm::OpenDriver(options.backend, driver_options));
  StressOptions effective = options;
  if (driver->name() == "cuda") {
    // The device's page size rules; the program keeps its shape in pages.
    LOOM_ASSIGN_OR_RETURN(int count, driver->DeviceCount());
    if (options.devices > count) {
      return InvalidArgumentError("stress: {} devices asked, {} present",
                                  options.devices, count);
    }
    LOOM_ASSIGN_OR_RETURN(
        effective.granularity,
        driver->GetGranularity(0, vmm::Granularity::kMinimum));
    effective.cap_bytes =
        options.cap_bytes / options.granularity * effective.granularity;
    effective.max_request =
        options.max_request / options.granularity * effective.granularity;
    if (effective.max_request == 0) {
      effective.max_request = options.max_request;  // below one page
    }
  }
  StressReport report;
  {
    Harness harness(effective, *driver);
    LOOM_RETURN_IF_ERROR(harness.Init());
    harness.Run();
    report = harness.Finish();
  }
  report.granularity = effective.granularity;
  report.cap_bytes = effective.cap_bytes;
  report.max_request = effective.max_request;
  return report;
}

}  // namespace loom::stress
