// The binary form of trace files (`.ltb`, version 1; docs/formats.md): compact
// varint records in CRC-32C-checked chunks, for large traces (pure C++).
// Use trace_io.h's OpenTraceReader / NewTraceWriter, which pick the form;
// these are their binary halves.
//
// Layout: 8-byte magic, u32 version, then chunks `tag u8 | length u32 |
// payload | crc32c u32` (little-endian; the CRC covers tag, length and
// payload): one header chunk 'H', event chunks 'E' (a record count, then
// records: name definitions and events, ids delta-coded within the chunk),
// and a trailer chunk 'T' (event, name and chunk counts), then end of file.
// The reader holds one chunk (at most kMaxBinaryChunkBytes) at a time.
#ifndef LOOM_PLAN_TRACE_TRACE_BINARY_H_
#define LOOM_PLAN_TRACE_TRACE_BINARY_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "base/status.h"
#include "base/byte_stream.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {

inline constexpr std::string_view kBinaryTraceMagic("\x89LTRC\r\n\x1a", 8);
inline constexpr uint32_t kBinaryTraceVersion = 1;
// Writers close an event chunk once its payload reaches this size.
inline constexpr size_t kBinaryChunkTargetBytes = size_t{1} << 16;
// Readers reject chunks whose payload is larger.
inline constexpr size_t kMaxBinaryChunkBytes = size_t{1} << 20;

// Chunk tags.
inline constexpr char kChunkHeader = 'H';
inline constexpr char kChunkEvents = 'E';
inline constexpr char kChunkTrailer = 'T';

// Record opcodes: the low 3 bits; the high bits are per-kind flags.
inline constexpr uint8_t kRecordName = 0;          // EventKind values are 1..7
inline constexpr uint8_t kRecordHasStream = 0x08;  // alloc/free
inline constexpr uint8_t kRecordHasDevice = 0x10;  // alloc/free
inline constexpr uint8_t kRecordDynamic = 0x08;    // module_enter

// Reads the magic, version and header chunk from `in` (at the file start).
StatusOr<std::unique_ptr<TraceReader>> OpenBinaryTraceReader(
    std::unique_ptr<ByteReader> in);

// Writes the magic, version and `header` to `sink`.
// REQUIRES: TraceChecker::CheckHeader(header).
StatusOr<std::unique_ptr<TraceWriter>> NewBinaryTraceWriter(
    std::unique_ptr<ByteSink> sink, const TraceHeader& header);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_TRACE_BINARY_H_
