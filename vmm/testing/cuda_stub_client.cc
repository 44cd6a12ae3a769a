#include "vmm/testing/cuda_stub_client.h"

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>

namespace loom::vmm::testing {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

template <typename F>
bool Bind(void* library, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(library, name));
  return out != nullptr;
}

}  // namespace

StatusOr<CudaStub*> CudaStub::Get() {
  static CudaStub* stub = nullptr;
  static Status failure;
  static bool tried = false;
  if (tried) {
    if (stub == nullptr) return failure;
    return stub;
  }
  tried = true;
  const char* path = std::getenv("LOOM_LIBCUDA");
  if (path == nullptr || *path == '\0') {
    failure = UnavailableError("LOOM_LIBCUDA is not set");
    return failure;
  }
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    failure = UnavailableError("cannot load {}: {}", path,
                               error ? error : "unknown error");
    return failure;
  }
  auto* s = new CudaStub();
  s->path_ = path;
  s->library_ = library;
  if (!Bind(library, "loom_stub_set_logging", s->set_logging_) ||
      !Bind(library, "loom_stub_clear", s->clear_) ||
      !Bind(library, "loom_stub_read_log", s->read_log_) ||
      !Bind(library, "loom_stub_read_problems", s->read_problems_) ||
      !Bind(library, "loom_stub_read_counts", s->read_counts_) ||
      !Bind(library, "loom_stub_faults", s->faults_) ||
      !Bind(library, "loom_stub_live", s->live_) ||
      !Bind(library, "cuInit", s->init_) ||
      !Bind(library, "cuDeviceGet", s->device_get_) ||
      !Bind(library, "cuDevicePrimaryCtxRetain", s->retain_) ||
      !Bind(library, "cuDevicePrimaryCtxRelease_v2", s->release_) ||
      !Bind(library, "cuCtxGetCurrent", s->get_current_) ||
      !Bind(library, "cuCtxSetCurrent", s->set_current_)) {
    delete s;
    failure = UnavailableError("{} is not the stub libcuda", path);
    return failure;
  }
  stub = s;
  return stub;
}

void CudaStub::SetLogging(bool on) { set_logging_(on ? 1 : 0); }
void CudaStub::Clear() { clear_(); }

std::string CudaStub::Read(size_t (*reader)(char*, size_t)) const {
  std::string text(reader(nullptr, 0) + 1, '\0');
  text.resize(reader(text.data(), text.size()));
  return text;
}

std::vector<std::string> CudaStub::Log() const {
  return Lines(Read(read_log_));
}

std::vector<std::string> CudaStub::Problems() const {
  return Lines(Read(read_problems_));
}

std::map<std::string, uint64_t> CudaStub::Counts() const {
  std::map<std::string, uint64_t> out;
  for (const std::string& line : Lines(Read(read_counts_))) {
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stoull(line.substr(space + 1));
  }
  return out;
}

uint64_t CudaStub::Count(const std::string& variant) const {
  const std::map<std::string, uint64_t> counts = Counts();
  auto it = counts.find(variant);
  return it == counts.end() ? 0 : it->second;
}

uint64_t CudaStub::faults() const { return faults_(); }

CudaStub::Live CudaStub::live() const {
  uint64_t out[6] = {};
  live_(out);
  return Live{out[0], out[1], out[2], out[3], out[4], out[5]};
}

void* CudaStub::RetainPrimary(int device) {
  LOOM_CHECK(init_(0) == 0);
  int handle = -1;
  LOOM_CHECK(device_get_(&handle, device) == 0);
  void* ctx = nullptr;
  LOOM_CHECK(retain_(&ctx, handle) == 0);
  return ctx;
}

void CudaStub::ReleasePrimary(int device) { LOOM_CHECK(release_(device) == 0); }

void* CudaStub::Current() const {
  void* ctx = nullptr;
  LOOM_CHECK(get_current_(&ctx) == 0);
  return ctx;
}

void CudaStub::SetCurrent(void* ctx) { LOOM_CHECK(set_current_(ctx) == 0); }

}  // namespace loom::vmm::testing
