// Plan files: the planner's output, read by the runtime (pure C++).
//
// A versioned, checksummed, self-describing binary format (all integers
// little-endian; full description in docs/formats.md):
//
//   header   "LOOMPLAN" (8 bytes), u32 version (1), u32 section count
//   section  u32 tag (4 ASCII characters), u32 flags (bit 0: required),
//            u64 payload length, payload, u32 CRC-32C of tag..payload
//
// Sections of version 1: META (required: source, instance fingerprint,
// algorithm, options), FIGS (required: peak, lower bound, granules,
// seconds, period, region size), BUFS (required: per buffer id, offset,
// size, start, end, alignment) and DYNS (optional: dynamic reusable space
// per time window). Later components add their own sections (the runtime's
// request-matching table) through PlanFile::extra: readers skip unknown
// optional sections (keeping them in `extra`) and reject unknown required
// ones, so old readers never misread new plans.
//
// The reader rejects, with the file name, the byte offset and the reason:
// wrong magic, unsupported version, truncation, checksum mismatches,
// unknown flags, duplicate or missing sections, trailing bytes, and values
// out of range (sizes, alignments, lifetimes, a buffer beyond the region,
// figures that disagree with the buffers). It never crashes on any input;
// it is fuzzed (plan_file_fuzz_test, bench/fuzz/).
#ifndef LOOM_PLAN_PLANFILE_PLAN_FILE_H_
#define LOOM_PLAN_PLANFILE_PLAN_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/crc32c.h"
#include "base/status.h"
#include "plan/solver/granules.h"
#include "plan/solver/instance.h"

namespace loom::plan {

inline constexpr std::string_view kPlanMagic = "LOOMPLAN";
inline constexpr uint32_t kPlanVersion = 1;

// Section tags as little-endian u32 of their four characters.
constexpr uint32_t PlanTag(const char (&name)[5]) {
  return static_cast<uint32_t>(static_cast<uint8_t>(name[0])) |
         static_cast<uint32_t>(static_cast<uint8_t>(name[1])) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(name[2])) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(name[3])) << 24;
}

struct PlannedBuffer {
  uint64_t id = 0;
  uint64_t offset = 0;  // bytes from the region base
  uint64_t size = 0;    // reserved bytes (rounded up)
  int64_t start = 0;    // lifetime [start, end), the instance's time units
  int64_t end = 0;
  uint64_t alignment = 1;
  friend bool operator==(const PlannedBuffer&, const PlannedBuffer&) = default;
};

// A section this code does not interpret (or one a later component adds).
struct PlanSection {
  uint32_t tag = 0;
  bool required = false;
  std::string payload;
  friend bool operator==(const PlanSection&, const PlanSection&) = default;
};

struct PlanFile {
  // META: where the plan comes from and how it was made.
  std::string source;        // e.g. the instance's path
  uint64_t fingerprint = 0;  // InstanceFingerprint() of that instance
  std::string algorithm;     // the run that produced the plan
  std::string requested;     // the algorithm asked for ("auto", ...)
  uint64_t size_round = 1;
  uint64_t min_alignment = 1;
  uint64_t granule_bytes = kDefaultGranule;
  uint64_t capacity = 0;  // 0: none was given
  double time_limit_seconds = 0;
  // FIGS: figures and the layout.
  uint64_t peak_bytes = 0;
  uint64_t lower_bound_bytes = 0;
  uint64_t peak_granules = 0;
  double seconds = 0;
  bool optimal = false;
  int64_t period = 0;        // 0: not cyclic
  uint64_t region_size = 0;  // the static region: >= every offset + size
  // BUFS
  std::vector<PlannedBuffer> buffers;
  // DYNS (optional)
  std::vector<ReusableSpace> dynamic_spaces;
  // Unknown optional sections read from a file, or sections to write.
  std::vector<PlanSection> extra;

  friend bool operator==(const PlanFile&, const PlanFile&) = default;
};

// A 64-bit fingerprint (FNV-1a) of the instance's period and buffers (ids,
// lifetimes, sizes, alignments), to tell which instance a plan belongs to.
uint64_t InstanceFingerprint(const Instance& instance);

// The plan's buffers as an Instance (sizes are the reserved sizes), e.g.
// for VerifyPlacement together with PlanOffsets().
Instance PlanAsInstance(const PlanFile& plan);
std::vector<uint64_t> PlanOffsets(const PlanFile& plan);

// Serialises `plan`. REQUIRES: extra sections have tags other than META,
// FIGS, BUFS and DYNS.
std::string EncodePlanFile(const PlanFile& plan);

// Parses and checks bytes; `source` names the input in errors.
StatusOr<PlanFile> DecodePlanFile(std::string_view bytes,
                                  std::string_view source);

Status WritePlanFile(const std::string& path, const PlanFile& plan);
StatusOr<PlanFile> ReadPlanFile(const std::string& path);

// True when `bytes` start with the plan magic (to tell plans from CSVs).
bool LooksLikePlanFile(std::string_view bytes);

// A human-readable dump (`loom_tool plan --dump`, `loom_tool show`).
// `max_buffers` limits the buffer table (0: all).
std::string FormatPlanText(const PlanFile& plan, size_t max_buffers = 0);

}  // namespace loom::plan

#endif  // LOOM_PLAN_PLANFILE_PLAN_FILE_H_
