#include "plan/planfile/request_table.h"

#include <unordered_map>

#include "base/byte_stream.h"

namespace loom::plan {
namespace {

class Reader {
 public:
  Reader(std::string_view bytes, std::string_view source)
      : bytes_(bytes), source_(source) {}
  StatusOr<uint64_t> Varint(std::string_view what) {
    uint64_t v = 0;
    const size_t at = pos_;
    Status status = ReadVarint(bytes_, &pos_, &v);
    if (!status.ok()) {
      return DataLossError("{}: REQS: bad {} at payload byte {}: {}", source_,
                           what, at, status.message());
    }
    return v;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  std::string_view bytes_;
  std::string_view source_;
  size_t pos_ = 0;
};

}  // namespace

PlanSection EncodeRequestTable(const RequestTable& table) {
  PlanSection section;
  section.tag = kRequestTableTag;
  section.required = false;
  std::string& out = section.payload;
  AppendVarint(&out, ZigZag(table.prologue_iterations));
  AppendVarint(&out, table.prologue.size());
  AppendVarint(&out, table.iteration.size());
  for (const auto* seq : {&table.prologue, &table.iteration}) {
    for (const RequestRef& r : *seq) {
      AppendVarint(&out, r.size);
      AppendVarint(&out, static_cast<uint64_t>(r.buffer + 1));
      AppendVarint(&out, ZigZag(r.start));
      AppendVarint(&out, ZigZag(r.end));
    }
  }
  return section;
}

StatusOr<std::optional<RequestTable>> DecodeRequestTable(
    const PlanFile& plan, std::string_view source) {
  const PlanSection* section = nullptr;
  for (const PlanSection& s : plan.extra) {
    if (s.tag == kRequestTableTag) section = &s;
  }
  if (section == nullptr) return std::optional<RequestTable>();
  Reader r(section->payload, source);
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
    RequestRef ref;
    LOOM_ASSIGN_OR_RETURN(ref.size, r.Varint("size"));
    LOOM_ASSIGN_OR_RETURN(uint64_t buffer, r.Varint("buffer"));
    LOOM_ASSIGN_OR_RETURN(uint64_t start, r.Varint("start"));
    LOOM_ASSIGN_OR_RETURN(uint64_t end, r.Varint("end"));
    ref.start = UnZigZag(start);
    ref.end = UnZigZag(end);
    if (ref.size == 0 || ref.size > (uint64_t{1} << 50)) {
      return OutOfRangeError("{}: REQS: entry {}: size {} out of range", source,
                             i, ref.size);
    }
    if (buffer != 0) {
      auto found = index_of.find(buffer - 1);
      if (found == index_of.end()) {
        return OutOfRangeError("{}: REQS: entry {}: no buffer with id {}",
                               source, i, buffer - 1);
      }
      ref.buffer = static_cast<int64_t>(found->second);
    }
    if (ref.buffer >= 0 && ref.size > plan.buffers[ref.buffer].size) {
      return OutOfRangeError(
          "{}: REQS: entry {}: {} bytes do not fit buffer {} ({} bytes)",
          source, i, ref.size, ref.buffer, plan.buffers[ref.buffer].size);
    }
    if (ref.start < 0 || ref.end < ref.start) {
      return OutOfRangeError("{}: REQS: entry {}: lifetime [{}, {})", source, i,
                             ref.start, ref.end);
    }
    (i < prologue ? table.prologue : table.iteration).push_back(ref);
  }
  if (r.remaining() != 0) {
    return DataLossError("{}: REQS: {} trailing bytes", source, r.remaining());
  }
  return std::optional<RequestTable>(std::move(table));
}

}  // namespace loom::plan
