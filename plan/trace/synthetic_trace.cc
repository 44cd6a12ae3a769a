#include "plan/trace/synthetic_trace.h"

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace loom::plan {
namespace {

// Where generated events go: names are interned, events emitted in order.
struct Output {
  std::function<StatusOr<uint32_t>(std::string_view)> name;
  std::function<Status(const Event&)> emit;
};

class Generator {
 public:
  Generator(const SyntheticTraceOptions& options, Output out)
      : options_(options), out_(std::move(out)), rng_(options.seed) {}

  Status Run() {
    if (options_.phase_markers) LOOM_RETURN_IF_ERROR(Phase("init"));
    for (int w = 0; w < options_.head_weights && !Full(); ++w) {
      LOOM_RETURN_IF_ERROR(Alloc(Size(w % 7), 0, 0));
    }
    for (uint64_t iteration = 0; !Full(); ++iteration) {
      LOOM_RETURN_IF_ERROR(Iteration(iteration));
    }
    return OkStatus();
  }

 private:
  bool Full() const { return emitted_ >= options_.events; }

  Status Emit(const Event& event) {
    if (Full()) return OkStatus();
    ++emitted_;
    return out_.emit(event);
  }

  // A size class: multiples of 512 with a few odd sizes mixed in.
  uint64_t Size(uint64_t kind) const {
    static constexpr uint64_t kSizes[] = {4194304, 1048576, 262144, 3072,
                                          786432,  512,     1000,   65536};
    return kSizes[kind % 8];
  }

  StatusOr<uint64_t> AllocId(uint64_t size, uint64_t stream, int16_t device) {
    uint64_t id = next_id_++;
    LOOM_RETURN_IF_ERROR(Emit(Event::Alloc(id, size, stream, device)));
    return id;
  }
  Status Alloc(uint64_t size, uint64_t stream, int16_t device) {
    return AllocId(size, stream, device).status();
  }
  Status Free(uint64_t id, uint64_t stream = 0, int16_t device = 0) {
    return Emit(Event::Free(id, stream, device));
  }
  Status Phase(std::string_view name) {
    LOOM_ASSIGN_OR_RETURN(uint32_t index, out_.name(name));
    return Emit(Event::Phase(index));
  }
  Status Enter(std::string_view name, bool dynamic = false) {
    if (!options_.module_markers) return OkStatus();
    LOOM_ASSIGN_OR_RETURN(uint32_t index, out_.name(name));
    return Emit(Event::ModuleEnter(index, dynamic));
  }
  Status Exit(std::string_view name) {
    if (!options_.module_markers) return OkStatus();
    LOOM_ASSIGN_OR_RETURN(uint32_t index, out_.name(name));
    return Emit(Event::ModuleExit(index));
  }

  std::string LayerName(int layer) const {
    if (layer == 0) return "embed \"tokens\"";  // needs quotes in text
    return "layers." + std::to_string(layer);
  }

  Status Iteration(uint64_t iteration) {
    if (options_.iteration_markers) {
      LOOM_RETURN_IF_ERROR(Emit(Event::IterationBegin(iteration)));
    }
    if (options_.phase_markers) LOOM_RETURN_IF_ERROR(Phase(kPhaseForward));
    // Kept activations per layer, freed in reverse order in backward.
    std::vector<std::vector<uint64_t>> kept(options_.layers);
    for (int layer = 0; layer < options_.layers && !Full(); ++layer) {
      std::string name = LayerName(layer);
      LOOM_RETURN_IF_ERROR(Enter(name));
      LOOM_ASSIGN_OR_RETURN(uint64_t a, AllocId(Size(1), 0, 0));
      kept[layer].push_back(a);
      LOOM_ASSIGN_OR_RETURN(uint64_t t, AllocId(Size(2 + layer % 3), 0, 0));
      LOOM_ASSIGN_OR_RETURN(uint64_t b, AllocId(Size(3), 0, 0));
      kept[layer].push_back(b);
      LOOM_RETURN_IF_ERROR(Free(t));
      bool moe = options_.moe_every > 0 &&
                 layer % options_.moe_every == options_.moe_every - 1;
      if (moe) {
        std::string moe_name = name + ".moe";
        LOOM_RETURN_IF_ERROR(Enter(moe_name, /*dynamic=*/true));
        // Token buffers: sizes vary per iteration (routing decides).
        uint64_t tokens = 512 * (1 + rng_() % 64);
        LOOM_ASSIGN_OR_RETURN(uint64_t x, AllocId(tokens, 0, 0));
        kept[layer].push_back(x);
        // A copy on a side stream of the second device.
        LOOM_ASSIGN_OR_RETURN(uint64_t y, AllocId(tokens / 2, 7, 1));
        LOOM_RETURN_IF_ERROR(Free(y, 7, 1));
        LOOM_RETURN_IF_ERROR(Exit(moe_name));
      }
      LOOM_RETURN_IF_ERROR(Exit(name));
    }
    if (options_.phase_markers) LOOM_RETURN_IF_ERROR(Phase(kPhaseBackward));
    for (int layer = options_.layers - 1; layer >= 0 && !Full(); --layer) {
      std::string name = LayerName(layer);
      LOOM_RETURN_IF_ERROR(Enter(name));
      LOOM_ASSIGN_OR_RETURN(uint64_t g, AllocId(Size(4), 0, 0));
      while (!kept[layer].empty()) {
        LOOM_RETURN_IF_ERROR(Free(kept[layer].back()));
        kept[layer].pop_back();
      }
      LOOM_RETURN_IF_ERROR(Free(g));
      LOOM_RETURN_IF_ERROR(Exit(name));
    }
    if (options_.phase_markers) LOOM_RETURN_IF_ERROR(Phase(kPhaseOptimizer));
    LOOM_RETURN_IF_ERROR(Enter("optimizer"));
    for (int k = 0; k < 3; ++k) {
      LOOM_ASSIGN_OR_RETURN(uint64_t o, AllocId(Size(5 + k), 0, 0));
      LOOM_RETURN_IF_ERROR(Free(o));
    }
    LOOM_RETURN_IF_ERROR(Exit("optimizer"));
    if (options_.iteration_markers) {
      LOOM_RETURN_IF_ERROR(Emit(Event::IterationEnd(iteration)));
    }
    return OkStatus();
  }

  const SyntheticTraceOptions& options_;
  Output out_;
  std::mt19937_64 rng_;
  uint64_t emitted_ = 0;
  uint64_t next_id_ = 1;
};

}  // namespace

Trace MakeSyntheticTrace(const SyntheticTraceOptions& options) {
  Trace trace;
  trace.header.provenance = "synthetic";
  Output out{[&](std::string_view name) -> StatusOr<uint32_t> {
               return trace.InternName(name);
             },
             [&](const Event& event) {
               trace.events.push_back(event);
               return OkStatus();
             }};
  Status status = Generator(options, std::move(out)).Run();
  LOOM_CHECK(status.ok(), "{}", status.ToString());
  return trace;
}

Status WriteSyntheticTrace(const SyntheticTraceOptions& options,
                           TraceWriter& writer) {
  Output out{[&](std::string_view name) { return writer.InternName(name); },
             [&](const Event& event) { return writer.Write(event); }};
  LOOM_RETURN_IF_ERROR(Generator(options, std::move(out)).Run());
  return writer.Finish();
}

}  // namespace loom::plan
