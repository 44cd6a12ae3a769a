// The state behind the stub libcuda (cuda_stub.h): configuration, primary
// contexts, physical handles, reservations and mappings over host memory,
// streams whose work runs lazily, events, and the record of calls.
//
// One process-wide State; every member is guarded by State::mu, and every
// function here REQUIRES it held. Handles given to callers (contexts,
// streams, events) are pointers to objects that are never freed, so a stale
// or foreign handle can be recognised without dereferencing it.
#ifndef LOOM_VMM_TESTING_CUDA_STUB_STATE_H_
#define LOOM_VMM_TESTING_CUDA_STUB_STATE_H_

#include <cuda.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

struct CUctx_st {
  int device = 0;
  int refcount = 0;
  bool active = false;  // retained and not released since
  CUstream_st* null_stream = nullptr;
};

// Work queued on a stream.
struct StubOp {
  enum class Kind { kMemset, kCopyToHost, kWait };
  Kind kind = Kind::kMemset;
  CUdeviceptr device = 0;
  void* host = nullptr;
  uint8_t value = 0;
  size_t size = 0;
  CUstream_st* wait_stream = nullptr;  // kWait: run it up to wait_target
  uint64_t wait_target = 0;
};

struct CUstream_st {
  CUctx_st* ctx = nullptr;
  bool destroyed = false;
  std::deque<StubOp> queue;       // not run yet, in order
  uint64_t enqueued = 0;          // ops ever queued
  uint64_t executed = 0;          // ops run
  CUresult error = CUDA_SUCCESS;  // a fault, reported at the next wait
};

struct CUevent_st {
  CUctx_st* ctx = nullptr;
  bool destroyed = false;
  CUstream_st* stream = nullptr;  // of the last record; null: never recorded
  uint64_t target = 0;            // complete when stream->executed >= target
  uint64_t recording = 0;         // records so far
  uint64_t answered = 0;          // the recording already answered NOT_READY
};

namespace loom::cuda_stub {

struct Config {
  int devices = 1;
  uint64_t memory = uint64_t{80} << 30;
  uint64_t granularity = uint64_t{2} << 20;
  int driver_version = 13000;
};

struct Handle {
  int device = 0;
  uint64_t size = 0;
  uint8_t* bytes = nullptr;  // host memory, committed on first touch
  bool released = false;
  int mappings = 0;
};

struct Mapping {
  uint64_t size = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;  // into the handle: always 0 (whole handles only)
  std::vector<bool> access;  // per granule: cuMemSetAccess done
};

// A host view of part of a device range.
struct Piece {
  uint8_t* bytes = nullptr;
  size_t size = 0;
};

struct State {
  std::mutex mu;
  bool initialised = false;
  Config config;
  std::vector<std::unique_ptr<CUctx_st>> primary;  // per device
  std::vector<std::unique_ptr<CUstream_st>> streams;
  std::vector<std::unique_ptr<CUevent_st>> events;
  std::unordered_set<const void*> known;  // every context, stream, event

  std::map<uint64_t, Handle> handles;
  uint64_t next_handle = 0x1000;
  std::map<CUdeviceptr, uint64_t> reservations;  // base -> size
  CUdeviceptr next_va = CUdeviceptr{1} << 45;
  std::map<CUdeviceptr, Mapping> mappings;  // base -> mapping
  std::vector<uint64_t> created;            // bytes per device

  bool logging = false;
  std::vector<std::string> log;
  std::map<std::string, uint64_t> counts;
  std::vector<std::string> problems;
  uint64_t faults = 0;
};

// The process's state (never destroyed), locked by the caller.
State& TheState();

// Reads the configuration from the environment (cuda_stub.h).
Config ConfigFromEnvironment();

// Counts a call of `variant` and, while logging, records it.
CUresult Record(State& s, const char* variant, const std::string& args,
                CUresult result);
void Problem(State& s, std::string what);
const char* ResultName(CUresult result);

// The calling thread's current context.
CUctx_st*& Current();
// The context a call without one uses: the current one, checked. Sets
// `error` (INVALID_CONTEXT: none; CONTEXT_IS_DESTROYED) when unusable.
CUctx_st* CurrentContext(State& s, CUresult* error);
// `ctx` checked as a handle: INVALID_CONTEXT if it is none of ours (and a
// problem is reported, naming `variant`), CONTEXT_IS_DESTROYED if released.
CUresult CheckContext(State& s, const void* ctx, const char* variant);
// The stream a handle names: 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD
// are the current context's NULL stream. Null with `error` set if invalid.
CUstream_st* ResolveStream(State& s, CUstream stream, CUresult* error);
CUevent_st* ResolveEvent(State& s, CUevent event, CUresult* error);
CUstream_st* NewStream(State& s, CUctx_st* ctx);

// Host pieces of [ptr, ptr + size): nullopt unless every byte is mapped (and
// accessible, with `need_access`).
std::optional<std::vector<Piece>> Translate(State& s, CUdeviceptr ptr,
                                            uint64_t size, bool need_access);

// Runs `stream`'s queued work until `target` ops have run (UINT64_MAX: all).
void Run(State& s, CUstream_st* stream, uint64_t target);
// Runs every stream of `ctx`; returns (and clears) a fault of any of them.
CUresult RunContext(State& s, CUctx_st* ctx);
// Queues `op` on `stream`.
void Enqueue(CUstream_st* stream, StubOp op);

}  // namespace loom::cuda_stub

// The start of every entry point: takes the lock and checks that cuInit was
// called; STUB_RETURN records the call and returns its result.
#define STUB_ENTER_WITH(variant, args)                             \
  State& s = TheState();                                           \
  std::lock_guard<std::mutex> lock(s.mu);                          \
  const char* const kVariant = variant;                            \
  const std::string kArgs = args;                                  \
  if (!s.initialised) {                                            \
    return Record(s, kVariant, kArgs, CUDA_ERROR_NOT_INITIALIZED); \
  }
#define STUB_ENTER(variant, ...) STUB_ENTER_WITH(variant, Args(__VA_ARGS__))
#define STUB_ENTER0(variant) STUB_ENTER_WITH(variant, "")
#define STUB_RETURN(result) return Record(s, kVariant, kArgs, result)

#endif  // LOOM_VMM_TESTING_CUDA_STUB_STATE_H_
