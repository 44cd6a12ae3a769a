// Byte sources, sinks and encoding helpers for loom's file readers and
// writers (pure C++).
//
// A ByteSource yields the bytes of a file or a memory buffer; ByteReader puts
// a fixed-size buffer in front of it so that readers can take lines or exact
// byte counts while knowing the byte offset they are at. A ByteSink receives
// bytes (a file, or a string in tests). Nothing here allocates memory in
// proportion to a length read from the input: ReadLine takes a maximum line
// length, ReadExact reads into a caller-sized buffer.
//
// Also here: CRC-32C (Castagnoli) and LEB128 varints with zigzag for signed
// values, as used by the binary trace form (docs/formats.md).
#ifndef LOOM_BASE_BYTE_STREAM_H_
#define LOOM_BASE_BYTE_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/crc32c.h"
#include "base/status.h"

namespace loom::plan {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `n` bytes into `buffer`; returns how many, 0 at the end.
  virtual StatusOr<size_t> Read(char* buffer, size_t n) = 0;
  // Names the input in error messages (the path, or "<memory>").
  virtual const std::string& name() const = 0;
};

// Opens `path` for reading. NotFound names the path and the system error.
StatusOr<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path);

// Reads `data`, which must outlive the source.
std::unique_ptr<ByteSource> NewMemorySource(std::string_view data,
                                            std::string name);

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status Write(std::string_view bytes) = 0;
  // Flushes and closes; later writes fail.
  virtual Status Close() = 0;
  virtual const std::string& name() const = 0;
};

// Creates (truncates) `path`.
StatusOr<std::unique_ptr<ByteSink>> OpenFileSink(const std::string& path);

// Appends to `*out`, which must outlive the sink.
std::unique_ptr<ByteSink> NewStringSink(std::string* out, std::string name);

// A buffered reader over a ByteSource that tracks the byte offset.
class ByteReader {
 public:
  explicit ByteReader(std::unique_ptr<ByteSource> source);

  const std::string& name() const { return source_->name(); }
  // Offset of the next byte to be returned.
  uint64_t offset() const { return offset_; }

  // Returns up to `n` (<= buffer size, 64 KiB) bytes without consuming them;
  // fewer only at the end of the input.
  StatusOr<std::string_view> Peek(size_t n);

  // Reads up to `n` bytes into `out`; returns the count, < n only at the end.
  StatusOr<size_t> Read(char* out, size_t n);

  // Reads one line without its '\n' into `*line`; false at the end of input.
  // A last line without '\n' is still returned. Fails if the line is longer
  // than `max_bytes` (the reader is then unusable).
  StatusOr<bool> ReadLine(std::string* line, size_t max_bytes);

 private:
  Status Fill();  // refills when the buffer is empty; sets eof_

  std::unique_ptr<ByteSource> source_;
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0;  // unread bytes are buffer_[begin_, end_)
  size_t end_ = 0;
  uint64_t offset_ = 0;
  bool eof_ = false;
};

// Appends the LEB128 encoding of `value` (1..10 bytes).
void AppendVarint(std::string* out, uint64_t value);
inline uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t UnZigZag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// Decodes a varint at data[*pos, end). On success advances *pos. Errors:
// runs past `end`, or more than 64 bits.
Status ReadVarint(std::string_view data, size_t* pos, uint64_t* value);

void AppendU32(std::string* out, uint32_t value);  // little-endian
uint32_t LoadU32(const char* p);                   // little-endian

}  // namespace loom::plan

#endif  // LOOM_BASE_BYTE_STREAM_H_
