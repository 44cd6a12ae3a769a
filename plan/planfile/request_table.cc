#include "plan/planfile/request_table.h"

#include <unordered_map>

#include "base/byte_stream.h"

namespace loom::plan {
namespace {

class Reader {
 public:
  Reader(std::string_view bytes, std::string_view source,
         std::string_view section)
      : bytes_(bytes), source_(source), section_(section) {}
  StatusOr<uint64_t> Varint(std::string_view what) {
    uint64_t v = 0;
    const size_t at = pos_;
    Status status = ReadVarint(bytes_, &pos_, &v);
    if (!status.ok()) {
      return DataLossError("{}: {}: bad {} at payload byte {}: {}", source_,
                           section_, what, at, status.message());
    }
    return v;
  }
  // `n` raw bytes. REQUIRES: n <= remaining().
  std::string_view Bytes(size_t n) {
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  std::string_view bytes_;
  std::string_view source_;
  std::string_view section_;
  size_t pos_ = 0;
};

void AppendEntry(std::string& out, const RequestRef& r) {
  AppendVarint(&out, r.size);
  AppendVarint(&out, static_cast<uint64_t>(r.buffer + 1));
  AppendVarint(&out, ZigZag(r.start));
  AppendVarint(&out, ZigZag(r.end));
}

// One entry (size, buffer id + 1, start, end), checked against the plan;
// `index_of` maps buffer ids to plan indices.
StatusOr<RequestRef> ReadEntry(
    Reader& r, const PlanFile& plan,
    const std::unordered_map<uint64_t, size_t>& index_of,
    std::string_view source, std::string_view section, uint64_t i) {
  RequestRef ref;
  LOOM_ASSIGN_OR_RETURN(ref.size, r.Varint("size"));
  LOOM_ASSIGN_OR_RETURN(uint64_t buffer, r.Varint("buffer"));
  LOOM_ASSIGN_OR_RETURN(uint64_t start, r.Varint("start"));
  LOOM_ASSIGN_OR_RETURN(uint64_t end, r.Varint("end"));
  ref.start = UnZigZag(start);
  ref.end = UnZigZag(end);
  if (ref.size == 0 || ref.size > (uint64_t{1} << 50)) {
    return OutOfRangeError("{}: {}: entry {}: size {} out of range", source,
                           section, i, ref.size);
  }
  if (buffer != 0) {
    auto found = index_of.find(buffer - 1);
    if (found == index_of.end()) {
      return OutOfRangeError("{}: {}: entry {}: no buffer with id {}", source,
                             section, i, buffer - 1);
    }
    ref.buffer = static_cast<int64_t>(found->second);
  }
  if (ref.buffer >= 0 && ref.size > plan.buffers[ref.buffer].size) {
    return OutOfRangeError(
        "{}: {}: entry {}: {} bytes do not fit buffer {} ({} bytes)", source,
        section, i, ref.size, ref.buffer, plan.buffers[ref.buffer].size);
  }
  if (ref.start < 0 || ref.end < ref.start) {
    return OutOfRangeError("{}: {}: entry {}: lifetime [{}, {})", source,
                           section, i, ref.start, ref.end);
  }
  return ref;
}

// The DREQ section's windows into `table`.
Status DecodeDynamicRequests(
    const PlanSection& section, const PlanFile& plan,
    const std::unordered_map<uint64_t, size_t>& index_of,
    std::string_view source, RequestTable& table) {
  Reader r(section.payload, source, "DREQ");
  LOOM_ASSIGN_OR_RETURN(uint64_t windows, r.Varint("window count"));
  // A window takes at least 3 bytes (an empty name, no entry, no early
  // iteration).
  if (windows > r.remaining() / 3) {
    return DataLossError("{}: DREQ: {} windows cannot fit in {} bytes", source,
                         windows, r.remaining());
  }
  uint64_t entry = 0;
  for (uint64_t w = 0; w < windows; ++w) {
    DynamicSequence seq;
    LOOM_ASSIGN_OR_RETURN(uint64_t length, r.Varint("name length"));
    if (length > r.remaining() || length > 4096) {
      return DataLossError("{}: DREQ: window {}: a name of {} bytes", source, w,
                           length);
    }
    seq.window = std::string(r.Bytes(length));
    if (!table.dynamic.empty() && seq.window <= table.dynamic.back().window) {
      return DataLossError("{}: DREQ: window '{}' out of order or repeated",
                           source, seq.window);
    }
    // A counted run of entries (the steady slots, an early iteration's),
    // then each one's call.
    auto read_run = [&](WindowRequests& out) -> Status {
      LOOM_ASSIGN_OR_RETURN(uint64_t count, r.Varint("entry count"));
      if (count > r.remaining() / 4) {
        return DataLossError(
            "{}: DREQ: window '{}': {} entries cannot fit in "
            "{} bytes",
            source, seq.window, count, r.remaining());
      }
      out.requests.reserve(count);
      for (uint64_t i = 0; i < count; ++i, ++entry) {
        LOOM_ASSIGN_OR_RETURN(RequestRef ref, ReadEntry(r, plan, index_of,
                                                        source, "DREQ", entry));
        out.requests.push_back(ref);
      }
      out.calls.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        LOOM_ASSIGN_OR_RETURN(uint64_t call, r.Varint("call"));
        if (call > (uint64_t{1} << 31)) {
          return OutOfRangeError("{}: DREQ: window '{}': call {}", source,
                                 seq.window, call);
        }
        out.calls.push_back(static_cast<uint32_t>(call));
      }
      return OkStatus();
    };
    LOOM_RETURN_IF_ERROR(read_run(seq.steady));
    LOOM_ASSIGN_OR_RETURN(uint64_t early, r.Varint("early iteration count"));
    if (early > static_cast<uint64_t>(table.prologue_iterations)) {
      return OutOfRangeError(
          "{}: DREQ: window '{}': {} early iterations, the plan has {}", source,
          seq.window, early, table.prologue_iterations);
    }
    for (uint64_t j = 0; j < early; ++j)
      LOOM_RETURN_IF_ERROR(read_run(seq.early.emplace_back()));
    table.dynamic.push_back(std::move(seq));
  }
  if (r.remaining() != 0) {
    return DataLossError("{}: DREQ: {} trailing bytes", source, r.remaining());
  }
  return OkStatus();
}

}  // namespace

std::vector<PlanSection> EncodeRequestTable(const RequestTable& table) {
  PlanSection section;
  section.tag = kRequestTableTag;
  section.required = false;
  std::string& out = section.payload;
  AppendVarint(&out, ZigZag(table.prologue_iterations));
  AppendVarint(&out, table.prologue.size());
  AppendVarint(&out, table.iteration.size());
  for (const auto* seq : {&table.prologue, &table.iteration}) {
    for (const RequestRef& r : *seq) AppendEntry(out, r);
  }
  std::vector<PlanSection> sections{std::move(section)};
  if (table.dynamic.empty()) return sections;
  PlanSection dynamic;
  dynamic.tag = kDynamicRequestsTag;
  dynamic.required = false;
  AppendVarint(&dynamic.payload, table.dynamic.size());
  for (const DynamicSequence& seq : table.dynamic) {
    AppendVarint(&dynamic.payload, seq.window.size());
    dynamic.payload += seq.window;
    // A counted run of entries, then each one's call.
    auto append_run = [&](const WindowRequests& run) {
      AppendVarint(&dynamic.payload, run.requests.size());
      for (const RequestRef& r : run.requests) AppendEntry(dynamic.payload, r);
      for (size_t i = 0; i < run.requests.size(); ++i)
        AppendVarint(&dynamic.payload, i < run.calls.size() ? run.calls[i] : 0);
    };
    append_run(seq.steady);
    AppendVarint(&dynamic.payload, seq.early.size());
    for (const WindowRequests& early : seq.early) append_run(early);
  }
  sections.push_back(std::move(dynamic));
  return sections;
}

StatusOr<std::optional<RequestTable>> DecodeRequestTable(
    const PlanFile& plan, std::string_view source) {
  const PlanSection* section = nullptr;
  const PlanSection* dynamic = nullptr;
  for (const PlanSection& s : plan.extra) {
    if (s.tag == kRequestTableTag) section = &s;
    if (s.tag == kDynamicRequestsTag) dynamic = &s;
  }
  if (section == nullptr) return std::optional<RequestTable>();
  Reader r(section->payload, source, "REQS");
  RequestTable table;
  // Entries name buffers by id; the decoded table holds plan indices.
  std::unordered_map<uint64_t, size_t> index_of;
  for (size_t i = 0; i < plan.buffers.size(); ++i)
    index_of.emplace(plan.buffers[i].id, i);
  LOOM_ASSIGN_OR_RETURN(uint64_t prologue_iterations,
                        r.Varint("prologue iterations"));
  table.prologue_iterations = UnZigZag(prologue_iterations);
  if (table.prologue_iterations < 0) {
    return DataLossError("{}: REQS: negative prologue iteration count", source);
  }
  LOOM_ASSIGN_OR_RETURN(uint64_t prologue, r.Varint("prologue count"));
  LOOM_ASSIGN_OR_RETURN(uint64_t iteration, r.Varint("iteration count"));
  // Each entry takes at least 4 bytes: refuse counts the payload cannot hold.
  const uint64_t room = r.remaining() / 4;
  if (prologue > room || iteration > room || prologue + iteration > room) {
    return DataLossError("{}: REQS: {} + {} entries cannot fit in {} bytes",
                         source, prologue, iteration, r.remaining());
  }
  for (uint64_t i = 0; i < prologue + iteration; ++i) {
    LOOM_ASSIGN_OR_RETURN(RequestRef ref,
                          ReadEntry(r, plan, index_of, source, "REQS", i));
    (i < prologue ? table.prologue : table.iteration).push_back(ref);
  }
  if (r.remaining() != 0) {
    return DataLossError("{}: REQS: {} trailing bytes", source, r.remaining());
  }
  if (dynamic != nullptr) {
    LOOM_RETURN_IF_ERROR(
        DecodeDynamicRequests(*dynamic, plan, index_of, source, table));
  }
  return std::optional<RequestTable>(std::move(table));
}

}  // namespace loom::plan
