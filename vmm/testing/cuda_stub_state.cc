#ifndef LOOM_NO_CUDA_HEADERS  // else the stub is an empty library
#include "vmm/testing/cuda_stub_state.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom::cuda_stub {
namespace {

constexpr size_t kMaxLogLines = size_t{1} << 20;
constexpr size_t kMaxProblems = 1000;

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 0);
  if (end == text || *end != '\0') {
    std::fprintf(stderr, "libcuda stub: %s=%s is not a number\n", name, text);
    std::abort();
  }
  return value;
}

std::string Hex(uint64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%#" PRIx64, value);
  return buffer;
}

}  // namespace

State& TheState() {
  static State* state = new State();  // outlives every caller
  return *state;
}

Config ConfigFromEnvironment() {
  Config c;
  c.devices = static_cast<int>(EnvNumber("LOOM_STUB_DEVICES", c.devices));
  c.memory = EnvNumber("LOOM_STUB_DEVICE_MEMORY", c.memory);
  c.granularity = EnvNumber("LOOM_STUB_GRANULARITY", c.granularity);
  c.driver_version =
      static_cast<int>(EnvNumber("LOOM_STUB_DRIVER_VERSION", c.driver_version));
  if (c.devices < 1 || c.devices > 64 || c.granularity == 0 ||
      c.granularity % 4096 != 0 || c.memory == 0 ||
      c.memory % c.granularity != 0) {
    std::fprintf(stderr,
                 "libcuda stub: bad configuration (devices %d, memory %" PRIu64
                 ", granularity %" PRIu64 ")\n",
                 c.devices, c.memory, c.granularity);
    std::abort();
  }
  return c;
}

const char* ResultName(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
      return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE:
      return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT:
      return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case CUDA_ERROR_INVALID_HANDLE:
      return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_READY:
      return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "CUDA_ERROR_NOT_SUPPORTED";
    default:
      return nullptr;
  }
}

CUresult Record(State& s, const char* variant, const std::string& args,
                CUresult result) {
  ++s.counts[variant];
  if (s.logging && s.log.size() < kMaxLogLines) {
    const char* name = ResultName(result);
    s.log.push_back(std::string(variant) + "(" + args + ") -> " +
                    (name != nullptr ? name : std::to_string(result)));
  }
  return result;
}

void Problem(State& s, std::string what) {
  if (s.problems.size() < kMaxProblems) s.problems.push_back(std::move(what));
}

CUctx_st*& Current() {
  thread_local CUctx_st* current = nullptr;
  return current;
}

CUctx_st* CurrentContext(State& s, CUresult* error) {
  CUctx_st* ctx = Current();
  if (ctx == nullptr) {
    *error = CUDA_ERROR_INVALID_CONTEXT;
    return nullptr;
  }
  *error = CheckContext(s, ctx, "current context");
  return *error == CUDA_SUCCESS ? ctx : nullptr;
}

CUresult CheckContext(State& s, const void* ctx, const char* variant) {
  bool ours = false;
  for (const auto& p : s.primary) ours |= p.get() == ctx;
  if (!ours) {
    Problem(s, std::string(variant) + " was given " +
                   Hex(reinterpret_cast<uintptr_t>(ctx)) +
                   ", which is no context (called through a signature "
                   "without one?)");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return static_cast<const CUctx_st*>(ctx)->active
             ? CUDA_SUCCESS
             : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

CUstream_st* NewStream(State& s, CUctx_st* ctx) {
  s.streams.push_back(std::make_unique<CUstream_st>());
  CUstream_st* stream = s.streams.back().get();
  stream->ctx = ctx;
  s.known.insert(stream);
  return stream;
}

CUstream_st* ResolveStream(State& s, CUstream stream, CUresult* error) {
  *error = CUDA_SUCCESS;
  if (stream == nullptr || stream == CU_STREAM_LEGACY ||
      stream == CU_STREAM_PER_THREAD) {
    CUctx_st* ctx = CurrentContext(s, error);
    return ctx == nullptr ? nullptr : ctx->null_stream;
  }
  if (!s.known.contains(stream) || stream->destroyed) {
    *error = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  if (!stream->ctx->active) {
    *error = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return nullptr;
  }
  return stream;
}

CUevent_st* ResolveEvent(State& s, CUevent event, CUresult* error) {
  *error = CUDA_SUCCESS;
  if (event == nullptr || !s.known.contains(event) || event->destroyed) {
    *error = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  if (!event->ctx->active) {
    *error = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return nullptr;
  }
  return event;
}

std::optional<std::vector<Piece>> Translate(State& s, CUdeviceptr ptr,
                                            uint64_t size, bool need_access) {
  std::vector<Piece> pieces;
  const uint64_t g = s.config.granularity;
  CUdeviceptr at = ptr;
  const CUdeviceptr end = ptr + size;
  if (end < ptr) return std::nullopt;
  while (at < end) {
    auto it = s.mappings.upper_bound(at);
    if (it == s.mappings.begin()) return std::nullopt;
    --it;
    const CUdeviceptr base = it->first;
    const Mapping& m = it->second;
    if (at >= base + m.size) return std::nullopt;
    const CUdeviceptr stop = std::min<CUdeviceptr>(end, base + m.size);
    if (need_access) {
      for (uint64_t k = (at - base) / g; k <= (stop - 1 - base) / g; ++k) {
        if (!m.access[k]) return std::nullopt;
      }
    }
    pieces.push_back({s.handles.at(m.handle).bytes + m.offset + (at - base),
                      static_cast<size_t>(stop - at)});
    at = stop;
  }
  return pieces;
}

void Enqueue(CUstream_st* stream, StubOp op) {
  stream->queue.push_back(op);
  ++stream->enqueued;
}

void Run(State& s, CUstream_st* stream, uint64_t target) {
  while (stream->executed < target && !stream->queue.empty()) {
    const StubOp op = stream->queue.front();
    stream->queue.pop_front();
    ++stream->executed;
    if (op.kind == StubOp::Kind::kWait) {
      Run(s, op.wait_stream, op.wait_target);
      continue;
    }
    std::optional<std::vector<Piece>> pieces =
        Translate(s, op.device, op.size, /*need_access=*/true);
    if (!pieces) {
      ++s.faults;
      stream->error = CUDA_ERROR_ILLEGAL_ADDRESS;
      Problem(s, std::string("fault: queued ") +
                     (op.kind == StubOp::Kind::kMemset ? "memset" : "copy") +
                     " of " + std::to_string(op.size) + " bytes at " +
                     Hex(op.device) +
                     " ran on memory no longer mapped and accessible");
      continue;
    }
    uint8_t* host = static_cast<uint8_t*>(op.host);
    for (const Piece& p : *pieces) {
      if (op.kind == StubOp::Kind::kMemset) {
        std::memset(p.bytes, op.value, p.size);
      } else {
        std::memcpy(host, p.bytes, p.size);
        host += p.size;
      }
    }
  }
}

CUresult RunContext(State& s, CUctx_st* ctx) {
  CUresult result = CUDA_SUCCESS;
  for (const auto& stream : s.streams) {
    if (stream->ctx != ctx) continue;
    Run(s, stream.get(), UINT64_MAX);
    if (stream->error != CUDA_SUCCESS) {
      result = stream->error;
      stream->error = CUDA_SUCCESS;
    }
  }
  return result;
}

}  // namespace loom::cuda_stub

#endif  // LOOM_NO_CUDA_HEADERS
