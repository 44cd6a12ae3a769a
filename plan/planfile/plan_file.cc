#include "plan/planfile/plan_file.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/text.h"

namespace loom::plan {
namespace {

constexpr uint32_t kMeta = PlanTag("META");
constexpr uint32_t kFigs = PlanTag("FIGS");
constexpr uint32_t kBufs = PlanTag("BUFS");
constexpr uint32_t kDyns = PlanTag("DYNS");
constexpr uint32_t kRequiredFlag = 1;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kSectionHeaderBytes = 16;
constexpr size_t kBufferRecordBytes = 48;
constexpr uint32_t kMaxSections = 1024;
constexpr uint32_t kMaxString = 1 << 20;
constexpr uint64_t kMaxBytes = uint64_t{1} << 56;
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 34;

bool PrintableTag(uint32_t tag) {
  for (int k = 0; k < 4; ++k) {
    const uint32_t c = (tag >> (8 * k)) & 0xff;
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// ---- writing --------------------------------------------------------------

void PutU32(std::string& out, uint32_t v) {
  for (int k = 0; k < 4; ++k) out += static_cast<char>((v >> (8 * k)) & 0xff);
}
void PutU64(std::string& out, uint64_t v) {
  for (int k = 0; k < 8; ++k) out += static_cast<char>((v >> (8 * k)) & 0xff);
}
void PutI64(std::string& out, int64_t v) {
  PutU64(out, static_cast<uint64_t>(v));
}
void PutF64(std::string& out, double v) {
  PutU64(out, std::bit_cast<uint64_t>(v));
}
void PutStr(std::string& out, std::string_view s) {
  LOOM_CHECK_LE(s.size(), kMaxString);
  PutU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

void PutSection(std::string& out, uint32_t tag, bool required,
                std::string_view payload) {
  const size_t begin = out.size();
  PutU32(out, tag);
  PutU32(out, required ? kRequiredFlag : 0);
  PutU64(out, payload.size());
  out += payload;
  PutU32(out, Crc32c(std::string_view(out).substr(begin)));
}

// ---- reading --------------------------------------------------------------

// Reads little-endian values from a payload; errors name the absolute
// offset of the value in the file.
class Reader {
 public:
  Reader(std::string_view data, size_t base, std::string_view source,
         std::string section)
      : data_(data),
        base_(base),
        source_(source),
        section_(std::move(section)) {}

  size_t offset() const { return base_ + pos_; }
  size_t left() const { return data_.size() - pos_; }

  Status Error(std::string_view what) const { return ErrorAt(offset(), what); }
  Status ErrorAt(size_t at, std::string_view what) const {
    return DataLossError("{}: offset {}: section '{}': {}", source_, at,
                         section_, what);
  }

  Status Need(size_t bytes, std::string_view what) const {
    if (left() < bytes) {
      return Error(fmt::format("payload ends inside the {} ({} of {} bytes)",
                               what, left(), bytes));
    }
    return OkStatus();
  }

  StatusOr<uint64_t> U64(std::string_view what) {
    LOOM_RETURN_IF_ERROR(Need(8, what));
    uint64_t v = 0;
    for (int k = 7; k >= 0; --k) {
      v = (v << 8) | static_cast<uint8_t>(data_[pos_ + k]);
    }
    pos_ += 8;
    return v;
  }
  StatusOr<uint32_t> U32(std::string_view what) {
    LOOM_RETURN_IF_ERROR(Need(4, what));
    uint32_t v = 0;
    for (int k = 3; k >= 0; --k) {
      v = (v << 8) | static_cast<uint8_t>(data_[pos_ + k]);
    }
    pos_ += 4;
    return v;
  }
  StatusOr<uint8_t> U8(std::string_view what) {
    LOOM_RETURN_IF_ERROR(Need(1, what));
    return static_cast<uint8_t>(data_[pos_++]);
  }
  StatusOr<int64_t> I64(std::string_view what) {
    LOOM_ASSIGN_OR_RETURN(uint64_t v, U64(what));
    return static_cast<int64_t>(v);
  }
  StatusOr<double> F64(std::string_view what) {
    const size_t at = offset();
    LOOM_ASSIGN_OR_RETURN(uint64_t v, U64(what));
    const double d = std::bit_cast<double>(v);
    if (!std::isfinite(d) || d < 0) {
      return ErrorAt(
          at, fmt::format("{} is not a finite non-negative number", what));
    }
    return d;
  }
  StatusOr<std::string> Str(std::string_view what) {
    const size_t at = offset();
    LOOM_ASSIGN_OR_RETURN(uint32_t length, U32(what));
    if (length > kMaxString) {
      return ErrorAt(at, fmt::format("{} length {} above the limit {}", what,
                                     length, kMaxString));
    }
    LOOM_RETURN_IF_ERROR(Need(length, what));
    std::string s(data_.substr(pos_, length));
    pos_ += length;
    return s;
  }
  Status End() const {
    if (left() != 0) {
      return Error(
          fmt::format("{} unexpected bytes at the end of the payload", left()));
    }
    return OkStatus();
  }

 private:
  std::string_view data_;
  size_t base_;
  size_t pos_ = 0;
  std::string_view source_;
  std::string section_;
};

Status ParseMeta(Reader& r, PlanFile* plan) {
  LOOM_ASSIGN_OR_RETURN(plan->source, r.Str("source"));
  LOOM_ASSIGN_OR_RETURN(plan->fingerprint, r.U64("fingerprint"));
  LOOM_ASSIGN_OR_RETURN(plan->algorithm, r.Str("algorithm"));
  LOOM_ASSIGN_OR_RETURN(plan->requested, r.Str("requested algorithm"));
  size_t at = r.offset();
  LOOM_ASSIGN_OR_RETURN(plan->size_round, r.U64("size rounding"));
  if (plan->size_round == 0 || plan->size_round > kMaxBytes) {
    return r.ErrorAt(at, fmt::format("size rounding {} outside [1, 2^56]",
                                     plan->size_round));
  }
  at = r.offset();
  LOOM_ASSIGN_OR_RETURN(plan->min_alignment, r.U64("minimum alignment"));
  if (!PowerOfTwo(plan->min_alignment) || plan->min_alignment > kMaxBytes) {
    return r.ErrorAt(
        at,
        fmt::format("minimum alignment {} is not a power of two in [1, 2^56]",
                    plan->min_alignment));
  }
  at = r.offset();
  LOOM_ASSIGN_OR_RETURN(plan->granule_bytes, r.U64("granule size"));
  if (plan->granule_bytes == 0 || plan->granule_bytes > kMaxBytes) {
    return r.ErrorAt(at, fmt::format("granule size {} outside [1, 2^56]",
                                     plan->granule_bytes));
  }
  LOOM_ASSIGN_OR_RETURN(plan->capacity, r.U64("capacity"));
  LOOM_ASSIGN_OR_RETURN(plan->time_limit_seconds, r.F64("time limit"));
  return r.End();
}

Status ParseFigs(Reader& r, PlanFile* plan) {
  LOOM_ASSIGN_OR_RETURN(plan->peak_bytes, r.U64("peak"));
  LOOM_ASSIGN_OR_RETURN(plan->lower_bound_bytes, r.U64("lower bound"));
  LOOM_ASSIGN_OR_RETURN(plan->peak_granules, r.U64("peak granules"));
  LOOM_ASSIGN_OR_RETURN(plan->seconds, r.F64("seconds"));
  size_t at = r.offset();
  LOOM_ASSIGN_OR_RETURN(uint8_t optimal, r.U8("optimal flag"));
  if (optimal > 1)
    return r.ErrorAt(at, fmt::format("optimal flag {} is not 0 or 1", optimal));
  plan->optimal = optimal == 1;
  at = r.offset();
  LOOM_ASSIGN_OR_RETURN(plan->period, r.I64("period"));
  if (plan->period < 0 || static_cast<uint64_t>(plan->period) > kMaxBytes) {
    return r.ErrorAt(at,
                     fmt::format("period {} outside [0, 2^56]", plan->period));
  }
  at = r.offset();
  LOOM_ASSIGN_OR_RETURN(plan->region_size, r.U64("region size"));
  if (plan->region_size > (uint64_t{1} << 62)) {
    return r.ErrorAt(
        at, fmt::format("region size {} above 2^62", plan->region_size));
  }
  if (plan->peak_bytes > plan->region_size) {
    return r.ErrorAt(at, fmt::format("peak {} above the region size {}",
                                     plan->peak_bytes, plan->region_size));
  }
  if (plan->lower_bound_bytes > plan->peak_bytes) {
    return r.Error(fmt::format("lower bound {} above the peak {}",
                               plan->lower_bound_bytes, plan->peak_bytes));
  }
  return r.End();
}

Status ParseBufs(Reader& r, const PlanFile& meta, PlanFile* plan) {
  const size_t at = r.offset();
  LOOM_ASSIGN_OR_RETURN(uint64_t count, r.U64("buffer count"));
  if (count > r.left() / kBufferRecordBytes ||
      r.left() != count * kBufferRecordBytes) {
    return r.ErrorAt(
        at, fmt::format("{} buffers need {} bytes, the payload has {}", count,
                        count * kBufferRecordBytes, r.left()));
  }
  plan->buffers.resize(count);
  uint64_t reach = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const size_t record = r.offset();
    PlannedBuffer& b = plan->buffers[i];
    LOOM_ASSIGN_OR_RETURN(b.id, r.U64("id"));
    LOOM_ASSIGN_OR_RETURN(b.offset, r.U64("offset"));
    LOOM_ASSIGN_OR_RETURN(b.size, r.U64("size"));
    LOOM_ASSIGN_OR_RETURN(b.start, r.I64("start"));
    LOOM_ASSIGN_OR_RETURN(b.end, r.I64("end"));
    LOOM_ASSIGN_OR_RETURN(b.alignment, r.U64("alignment"));
    auto bad = [&](std::string_view what) {
      return r.ErrorAt(record,
                       fmt::format("buffer {} (id {}): {}", i, b.id, what));
    };
    if (b.size == 0 || b.size > kMaxBytes) {
      return bad(fmt::format("size {} outside [1, 2^56]", b.size));
    }
    if (!PowerOfTwo(b.alignment) || b.alignment > kMaxBytes) {
      return bad(fmt::format("alignment {} is not a power of two in [1, 2^56]",
                             b.alignment));
    }
    if (b.start >= b.end) {
      return bad(fmt::format("empty lifetime [{}, {})", b.start, b.end));
    }
    if (meta.period > 0 && (b.start < 0 || b.start >= meta.period ||
                            b.end - b.start > meta.period)) {
      return bad(fmt::format("lifetime [{}, {}) does not fit the period {}",
                             b.start, b.end, meta.period));
    }
    if (b.offset % b.alignment != 0 || b.offset % meta.min_alignment != 0) {
      return bad(fmt::format("offset {} is not aligned to {}", b.offset,
                             std::max(b.alignment, meta.min_alignment)));
    }
    if (b.offset > meta.region_size || meta.region_size - b.offset < b.size) {
      return bad(fmt::format("[{}, +{}) runs past the region size {}", b.offset,
                             b.size, meta.region_size));
    }
    reach = std::max(reach, b.offset + b.size);
  }
  if (count > 0 && reach != meta.peak_bytes) {
    return r.ErrorAt(at, fmt::format("the buffers reach {} but the peak is {}",
                                     reach, meta.peak_bytes));
  }
  return r.End();
}

Status ParseDyns(Reader& r, const PlanFile& meta, PlanFile* plan) {
  size_t at = r.offset();
  LOOM_ASSIGN_OR_RETURN(uint64_t count, r.U64("window count"));
  if (count > r.left() / 28) {
    return r.ErrorAt(
        at, fmt::format("{} windows cannot fit in {} bytes", count, r.left()));
  }
  plan->dynamic_spaces.resize(count);
  for (uint64_t w = 0; w < count; ++w) {
    ReusableSpace& space = plan->dynamic_spaces[w];
    at = r.offset();
    LOOM_ASSIGN_OR_RETURN(space.window.start, r.I64("window start"));
    LOOM_ASSIGN_OR_RETURN(space.window.end, r.I64("window end"));
    LOOM_ASSIGN_OR_RETURN(space.window.name, r.Str("window name"));
    const TimeWindow& win = space.window;
    if (win.start < 0 || win.start >= win.end ||
        (meta.period > 0 &&
         (win.start >= meta.period || win.end - win.start > meta.period))) {
      return r.ErrorAt(
          at, fmt::format("window {}: [{}, {}) is not a valid window", w,
                          win.start, win.end));
    }
    at = r.offset();
    LOOM_ASSIGN_OR_RETURN(uint64_t ranges, r.U64("range count"));
    if (ranges > r.left() / 16) {
      return r.ErrorAt(
          at, fmt::format("window {}: {} ranges cannot fit in {} bytes", w,
                          ranges, r.left()));
    }
    uint64_t previous = 0;
    for (uint64_t k = 0; k < ranges; ++k) {
      at = r.offset();
      AddressRange range;
      LOOM_ASSIGN_OR_RETURN(range.lo, r.U64("range start"));
      LOOM_ASSIGN_OR_RETURN(range.hi, r.U64("range end"));
      if (range.lo >= range.hi || range.hi > meta.region_size ||
          (k > 0 && range.lo <= previous)) {
        return r.ErrorAt(
            at, fmt::format("window {}: range [{}, {}) is empty, unsorted, "
                            "touching the previous one or beyond the region",
                            w, range.lo, range.hi));
      }
      previous = range.hi;
      space.ranges.push_back(range);
      const uint64_t g = meta.granule_bytes;
      const uint64_t glo = (range.lo / g + (range.lo % g != 0 ? 1 : 0)) * g;
      const uint64_t ghi = range.hi / g * g;
      if (glo < ghi) space.granules.push_back({glo, ghi});
    }
  }
  return r.End();
}

}  // namespace

std::string EncodePlanFile(const PlanFile& plan) {
  std::string out(kPlanMagic);
  PutU32(out, kPlanVersion);
  const uint32_t sections = 3 + (plan.dynamic_spaces.empty() ? 0 : 1) +
                            static_cast<uint32_t>(plan.extra.size());
  PutU32(out, sections);
  std::string p;
  PutStr(p, plan.source);
  PutU64(p, plan.fingerprint);
  PutStr(p, plan.algorithm);
  PutStr(p, plan.requested);
  PutU64(p, plan.size_round);
  PutU64(p, plan.min_alignment);
  PutU64(p, plan.granule_bytes);
  PutU64(p, plan.capacity);
  PutF64(p, plan.time_limit_seconds);
  PutSection(out, kMeta, true, p);
  p.clear();
  PutU64(p, plan.peak_bytes);
  PutU64(p, plan.lower_bound_bytes);
  PutU64(p, plan.peak_granules);
  PutF64(p, plan.seconds);
  p += static_cast<char>(plan.optimal ? 1 : 0);
  PutI64(p, plan.period);
  PutU64(p, plan.region_size);
  PutSection(out, kFigs, true, p);
  p.clear();
  p.reserve(8 + plan.buffers.size() * kBufferRecordBytes);
  PutU64(p, plan.buffers.size());
  for (const PlannedBuffer& b : plan.buffers) {
    PutU64(p, b.id);
    PutU64(p, b.offset);
    PutU64(p, b.size);
    PutI64(p, b.start);
    PutI64(p, b.end);
    PutU64(p, b.alignment);
  }
  PutSection(out, kBufs, true, p);
  if (!plan.dynamic_spaces.empty()) {
    p.clear();
    PutU64(p, plan.dynamic_spaces.size());
    for (const ReusableSpace& space : plan.dynamic_spaces) {
      PutI64(p, space.window.start);
      PutI64(p, space.window.end);
      PutStr(p, space.window.name);
      PutU64(p, space.ranges.size());
      for (const AddressRange& r : space.ranges) {
        PutU64(p, r.lo);
        PutU64(p, r.hi);
      }
    }
    PutSection(out, kDyns, false, p);
  }
  for (const PlanSection& section : plan.extra) {
    LOOM_CHECK(section.tag != kMeta && section.tag != kFigs &&
                   section.tag != kBufs && section.tag != kDyns,
               "extra section with a reserved tag '{}'", TagName(section.tag));
    PutSection(out, section.tag, section.required, section.payload);
  }
  return out;
}

bool LooksLikePlanFile(std::string_view bytes) {
  return bytes.starts_with(kPlanMagic);
}

StatusOr<PlanFile> DecodePlanFile(std::string_view bytes,
                                  std::string_view source) {
  auto error = [&](size_t at, std::string_view what) {
    return DataLossError("{}: offset {}: {}", source, at, what);
  };
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int k = 3; k >= 0; --k)
      v = (v << 8) | static_cast<uint8_t>(bytes[at + k]);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; --k)
      v = (v << 8) | static_cast<uint8_t>(bytes[at + k]);
    return v;
  };
  if (bytes.empty()) {
    return InvalidArgumentError(
        "{}: offset 0: empty file (not a loom plan file)", source);
  }
  const size_t magic_bytes = std::min(bytes.size(), kPlanMagic.size());
  if (bytes.substr(0, magic_bytes) != kPlanMagic.substr(0, magic_bytes)) {
    return InvalidArgumentError(
        "{}: offset 0: bad magic (not a loom plan file)", source);
  }
  if (bytes.size() < kHeaderBytes) {
    return error(bytes.size(), fmt::format("truncated header ({} of {} bytes)",
                                           bytes.size(), kHeaderBytes));
  }
  const uint32_t version = u32(8);
  if (version != kPlanVersion) {
    return InvalidArgumentError(
        "{}: offset 8: unsupported version {} (this reader reads {})", source,
        version, kPlanVersion);
  }
  const uint32_t count = u32(12);
  if (count > kMaxSections) {
    return error(12, fmt::format("section count {} above the limit {}", count,
                                 kMaxSections));
  }
  struct Raw {
    uint32_t tag;
    size_t base;  // file offset of the payload
    std::string_view payload;
  };
  std::vector<Raw> known;
  PlanFile plan;
  size_t pos = kHeaderBytes;
  for (uint32_t s = 0; s < count; ++s) {
    if (bytes.size() - pos < kSectionHeaderBytes) {
      return error(
          pos,
          fmt::format("truncated: section {} of {} starts here but only {} "
                      "bytes are left",
                      s + 1, count, bytes.size() - pos));
    }
    const uint32_t tag = u32(pos);
    const uint32_t flags = u32(pos + 4);
    const uint64_t length = u64(pos + 8);
    if (!PrintableTag(tag))
      return error(pos, fmt::format("bad section tag 0x{:08x}", tag));
    const std::string name = TagName(tag);
    if ((flags & ~kRequiredFlag) != 0) {
      return error(pos + 4, fmt::format("section '{}' has unknown flags 0x{:x}",
                                        name, flags));
    }
    const size_t left = bytes.size() - pos - kSectionHeaderBytes;
    if (length > left || left - length < 4) {
      return error(
          pos + 8,
          fmt::format("truncated: section '{}' needs {} bytes, {} are left",
                      name, length + 4, left));
    }
    const size_t base = pos + kSectionHeaderBytes;
    const size_t crc_at = base + length;
    const uint32_t stored = u32(crc_at);
    const uint32_t computed =
        Crc32c(bytes.substr(pos, kSectionHeaderBytes + length));
    if (stored != computed) {
      return error(
          crc_at,
          fmt::format("checksum mismatch in section '{}' (stored 0x{:08x}, "
                      "computed 0x{:08x})",
                      name, stored, computed));
    }
    const std::string_view payload = bytes.substr(base, length);
    const bool required = (flags & kRequiredFlag) != 0;
    if (tag == kMeta || tag == kFigs || tag == kBufs || tag == kDyns) {
      for (const Raw& raw : known) {
        if (raw.tag == tag)
          return error(pos, fmt::format("duplicate section '{}'", name));
      }
      if (tag != kDyns && !required) {
        return error(pos + 4,
                     fmt::format("section '{}' must be marked required", name));
      }
      known.push_back({tag, base, payload});
    } else if (required) {
      return error(pos, fmt::format("unsupported required section '{}'", name));
    } else {
      plan.extra.push_back({tag, false, std::string(payload)});
    }
    pos = crc_at + 4;
  }
  if (pos != bytes.size()) {
    return error(pos, fmt::format("{} trailing bytes after the last section",
                                  bytes.size() - pos));
  }
  // Known sections, in dependency order: META and FIGS before BUFS/DYNS.
  for (uint32_t tag : {kMeta, kFigs, kBufs, kDyns}) {
    const Raw* raw = nullptr;
    for (const Raw& r : known) {
      if (r.tag == tag) raw = &r;
    }
    if (raw == nullptr) {
      if (tag == kDyns) continue;
      return error(bytes.size(),
                   fmt::format("missing required section '{}'", TagName(tag)));
    }
    Reader r(raw->payload, raw->base, source, TagName(tag));
    if (tag == kMeta) LOOM_RETURN_IF_ERROR(ParseMeta(r, &plan));
    if (tag == kFigs) LOOM_RETURN_IF_ERROR(ParseFigs(r, &plan));
    if (tag == kBufs) LOOM_RETURN_IF_ERROR(ParseBufs(r, plan, &plan));
    if (tag == kDyns) LOOM_RETURN_IF_ERROR(ParseDyns(r, plan, &plan));
  }
  return plan;
}

Status WritePlanFile(const std::string& path, const PlanFile& plan) {
  const std::string bytes = EncodePlanFile(plan);
  errno = 0;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    return NotFoundError("{}: cannot create file: {}", path,
                         OsErrorText(errno));
  }
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return DataLossError("{}: write error", path);
  return OkStatus();
}

StatusOr<PlanFile> ReadPlanFile(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError("{}: cannot open file: {}", path, OsErrorText(errno));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return DataLossError("{}: cannot read the file size", path);
  if (static_cast<uint64_t>(size) > kMaxFileBytes) {
    return OutOfRangeError(
        "{}: {} bytes, above the 16 GiB limit for plan files", path, size);
  }
  in.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), size);
  if (!in) return DataLossError("{}: read error", path);
  return DecodePlanFile(bytes, path);
}

}  // namespace loom::plan
