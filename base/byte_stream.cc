#include "base/byte_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace loom::plan {
namespace {

constexpr size_t kReaderBufferBytes = size_t{1} << 16;

class FileSource : public ByteSource {
 public:
  FileSource(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  ~FileSource() override { ::close(fd_); }

  StatusOr<size_t> Read(char* buffer, size_t n) override {
    while (true) {
      ssize_t got = ::read(fd_, buffer, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno == EINTR) continue;
      return DataLossError("{}: read failed: {}", name_, std::strerror(errno));
    }
  }
  const std::string& name() const override { return name_; }

 private:
  int fd_;
  std::string name_;
};

class MemorySource : public ByteSource {
 public:
  MemorySource(std::string_view data, std::string name)
      : data_(data), name_(std::move(name)) {}
  StatusOr<size_t> Read(char* buffer, size_t n) override {
    size_t take = std::min(n, data_.size() - pos_);
    if (take > 0) std::memcpy(buffer, data_.data() + pos_, take);
    pos_ += take;
    return take;
  }
  const std::string& name() const override { return name_; }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  std::string name_;
};

class FileSink : public ByteSink {
 public:
  FileSink(FILE* file, std::string name) : file_(file), name_(std::move(name)) {
    std::setvbuf(file_, nullptr, _IOFBF, size_t{1} << 20);
  }
  ~FileSink() override {
    if (file_ != nullptr) std::fclose(file_);
  }
  Status Write(std::string_view bytes) override {
    if (file_ == nullptr) return FailedPreconditionError("{}: closed", name_);
    if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
      return DataLossError("{}: write failed: {}", name_, std::strerror(errno));
    }
    return OkStatus();
  }
  Status Close() override {
    if (file_ == nullptr) return OkStatus();
    bool failed = std::ferror(file_) != 0;
    failed |= std::fclose(file_) != 0;
    file_ = nullptr;
    if (failed) {
      return DataLossError("{}: write failed: {}", name_, std::strerror(errno));
    }
    return OkStatus();
  }
  const std::string& name() const override { return name_; }

 private:
  FILE* file_;
  std::string name_;
};

class StringSink : public ByteSink {
 public:
  StringSink(std::string* out, std::string name)
      : out_(out), name_(std::move(name)) {}
  Status Write(std::string_view bytes) override {
    if (closed_) return FailedPreconditionError("{}: closed", name_);
    out_->append(bytes);
    return OkStatus();
  }
  Status Close() override {
    closed_ = true;
    return OkStatus();
  }
  const std::string& name() const override { return name_; }

 private:
  std::string* out_;
  std::string name_;
  bool closed_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return NotFoundError("{}: cannot open: {}", path, std::strerror(errno));
  }
  return std::unique_ptr<ByteSource>(new FileSource(fd, path));
}

std::unique_ptr<ByteSource> NewMemorySource(std::string_view data,
                                            std::string name) {
  return std::make_unique<MemorySource>(data, std::move(name));
}

StatusOr<std::unique_ptr<ByteSink>> OpenFileSink(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return NotFoundError("{}: cannot create: {}", path, std::strerror(errno));
  }
  return std::unique_ptr<ByteSink>(new FileSink(file, path));
}

std::unique_ptr<ByteSink> NewStringSink(std::string* out, std::string name) {
  return std::make_unique<StringSink>(out, std::move(name));
}

ByteReader::ByteReader(std::unique_ptr<ByteSource> source)
    : source_(std::move(source)), buffer_(new char[kReaderBufferBytes]) {}

Status ByteReader::Fill() {
  // Moves the unread tail to the front, then reads until full or the end.
  if (begin_ > 0) {
    std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  while (!eof_ && end_ < kReaderBufferBytes) {
    LOOM_ASSIGN_OR_RETURN(size_t got, source_->Read(buffer_.get() + end_,
                                                    kReaderBufferBytes - end_));
    if (got == 0) eof_ = true;
    end_ += got;
  }
  return OkStatus();
}

StatusOr<std::string_view> ByteReader::Peek(size_t n) {
  LOOM_CHECK_LE(n, kReaderBufferBytes);
  if (end_ - begin_ < n && !eof_) LOOM_RETURN_IF_ERROR(Fill());
  return std::string_view(buffer_.get() + begin_, std::min(n, end_ - begin_));
}

StatusOr<size_t> ByteReader::Read(char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    if (begin_ == end_) {
      if (eof_) break;
      LOOM_RETURN_IF_ERROR(Fill());
      if (begin_ == end_) break;
    }
    size_t take = std::min(n - done, end_ - begin_);
    std::memcpy(out + done, buffer_.get() + begin_, take);
    begin_ += take;
    offset_ += take;
    done += take;
  }
  return done;
}

StatusOr<bool> ByteReader::ReadLine(std::string* line, size_t max_bytes) {
  line->clear();
  bool any = false;
  while (true) {
    if (begin_ == end_) {
      if (!eof_) LOOM_RETURN_IF_ERROR(Fill());
      if (begin_ == end_) return any;  // a last line without '\n', or none
    }
    any = true;
    const char* start = buffer_.get() + begin_;
    size_t available = end_ - begin_;
    const void* newline = std::memchr(start, '\n', available);
    size_t length =
        newline != nullptr
            ? static_cast<size_t>(static_cast<const char*>(newline) - start)
            : available;
    if (line->size() + length > max_bytes) {
      return InvalidArgumentError("line longer than {} bytes", max_bytes);
    }
    line->append(start, length);
    size_t consumed = length + (newline != nullptr ? 1 : 0);
    begin_ += consumed;
    offset_ += consumed;
    if (newline != nullptr) return true;
  }
}

void AppendVarint(std::string* out, uint64_t value) {
  char bytes[10];
  int n = 0;
  while (value >= 0x80) {
    bytes[n++] = static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  bytes[n++] = static_cast<char>(value);
  out->append(bytes, n);
}

Status ReadVarint(std::string_view data, size_t* pos, uint64_t* value) {
  uint64_t result = 0;
  size_t p = *pos;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p >= data.size()) {
      return DataLossError("varint runs past the end of its chunk");
    }
    uint8_t byte = static_cast<uint8_t>(data[p++]);
    if (shift == 63 && byte > 1) {
      return DataLossError("varint overflows 64 bits");
    }
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *pos = p;
      *value = result;
      return OkStatus();
    }
  }
  return DataLossError("varint overflows 64 bits");
}

void AppendU32(std::string* out, uint32_t value) {
  char bytes[4] = {static_cast<char>(value), static_cast<char>(value >> 8),
                   static_cast<char>(value >> 16),
                   static_cast<char>(value >> 24)};
  out->append(bytes, 4);
}

uint32_t LoadU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} | uint32_t{u[1]} << 8 | uint32_t{u[2]} << 16 |
         uint32_t{u[3]} << 24;
}

}  // namespace loom::plan
