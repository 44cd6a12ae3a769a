#include "plan/trace/trace_binary.h"

#include <string>

namespace loom::plan {
namespace {

constexpr size_t kChunkHeaderBytes = 5;  // tag + length

class BinaryTraceReader : public TraceReader {
 public:
  explicit BinaryTraceReader(std::unique_ptr<ByteReader> in)
      : TraceReader(in->name()), in_(std::move(in)) {}

  TraceFormat format() const override { return TraceFormat::kBinary; }

  Status ReadStart();

 protected:
  StatusOr<bool> ReadNext(Event* event) override;

 private:
  Status At(uint64_t offset, const Status& status) const {
    return Status(status.code(), fmt::format("{}: offset {}: {}", source_,
                                             offset, status.message()));
  }
  // Reads one whole chunk into payload_ and checks its CRC.
  Status ReadChunk(char* tag);
  Status ParseHeaderChunk();
  Status StartEventChunk();
  StatusOr<bool> FinishAtTrailer();
  // Decodes one record at payload_[pos_]; *is_event false for a name.
  Status DecodeRecord(Event* event, bool* is_event);

  std::unique_ptr<ByteReader> in_;
  std::string payload_;
  uint64_t chunk_offset_ = 0;    // file offset of the current chunk's tag
  uint64_t payload_offset_ = 0;  // file offset of payload_[0]
  size_t pos_ = 0;
  uint64_t records_left_ = 0;
  uint64_t prev_id_ = 0;
  uint64_t chunks_ = 0;  // event chunks read
};

Status BinaryTraceReader::ReadChunk(char* tag) {
  chunk_offset_ = in_->offset();
  char head[kChunkHeaderBytes];
  LOOM_ASSIGN_OR_RETURN(size_t got, in_->Read(head, kChunkHeaderBytes));
  if (got == 0) {
    return At(
        chunk_offset_,
        DataLossError("truncated: the file ends without a trailer chunk"));
  }
  *tag = head[0];
  if (*tag != kChunkHeader && *tag != kChunkEvents && *tag != kChunkTrailer) {
    return At(chunk_offset_, DataLossError("unknown chunk tag 0x{:02x}",
                                           static_cast<uint8_t>(*tag)));
  }
  if (got < kChunkHeaderBytes) {
    return At(chunk_offset_,
              DataLossError("truncated: chunk header has {} of {} bytes", got,
                            kChunkHeaderBytes));
  }
  uint32_t length = LoadU32(head + 1);
  if (length > kMaxBinaryChunkBytes) {
    return At(chunk_offset_, DataLossError("chunk length {} above the limit {}",
                                           length, kMaxBinaryChunkBytes));
  }
  payload_offset_ = in_->offset();
  payload_.resize(length);
  LOOM_ASSIGN_OR_RETURN(got, in_->Read(payload_.data(), length));
  if (got < length) {
    return At(chunk_offset_,
              DataLossError("truncated: chunk has {} of its {} payload bytes",
                            got, length));
  }
  char crc_bytes[4];
  LOOM_ASSIGN_OR_RETURN(got, in_->Read(crc_bytes, 4));
  if (got < 4) {
    return At(
        chunk_offset_,
        DataLossError("truncated: chunk checksum has {} of 4 bytes", got));
  }
  uint32_t stored = LoadU32(crc_bytes);
  uint32_t computed = Crc32c(payload_, Crc32c(std::string_view(head, 5)));
  if (stored != computed) {
    return At(chunk_offset_,
              DataLossError("checksum mismatch in chunk '{}' (stored 0x{:08x}, "
                            "computed 0x{:08x})",
                            *tag, stored, computed));
  }
  pos_ = 0;
  return OkStatus();
}

Status BinaryTraceReader::ReadStart() {
  char start[12];
  LOOM_ASSIGN_OR_RETURN(size_t got, in_->Read(start, 12));
  if (got < kBinaryTraceMagic.size() ||
      std::string_view(start, kBinaryTraceMagic.size()) != kBinaryTraceMagic) {
    return At(0, InvalidArgumentError("not a binary loom trace (bad magic)"));
  }
  if (got < 12) {
    return At(got, DataLossError("truncated: the version has {} of 4 bytes",
                                 got - kBinaryTraceMagic.size()));
  }
  uint32_t version = LoadU32(start + 8);
  if (version != kBinaryTraceVersion) {
    return At(8, InvalidArgumentError(
                     "unsupported binary trace version {} (this reader knows "
                     "{})",
                     version, kBinaryTraceVersion));
  }
  char tag;
  LOOM_RETURN_IF_ERROR(ReadChunk(&tag));
  if (tag != kChunkHeader) {
    return At(chunk_offset_, DataLossError("expected the header chunk 'H', "
                                           "found '{}'",
                                           tag));
  }
  return ParseHeaderChunk();
}

Status BinaryTraceReader::ParseHeaderChunk() {
  uint64_t device = 0, length = 0;
  Status status = ReadVarint(payload_, &pos_, &device);
  if (status.ok()) status = ReadVarint(payload_, &pos_, &header_.granularity);
  size_t length_pos = pos_;
  if (status.ok()) status = ReadVarint(payload_, &pos_, &length);
  if (!status.ok()) return At(payload_offset_ + pos_, status);
  int64_t signed_device = UnZigZag(device);
  if (signed_device < -1 || signed_device > kMaxDevice) {
    return At(payload_offset_,
              OutOfRangeError("header device {} outside -1..{}", signed_device,
                              kMaxDevice));
  }
  header_.device = static_cast<int32_t>(signed_device);
  if (length > kMaxProvenanceBytes) {
    return At(payload_offset_ + length_pos,
              OutOfRangeError("provenance of {} bytes above the limit {}",
                              length, kMaxProvenanceBytes));
  }
  if (length > payload_.size() - pos_) {
    return At(payload_offset_ + length_pos,
              DataLossError("provenance of {} bytes runs past the header chunk",
                            length));
  }
  header_.provenance.assign(payload_, pos_, length);
  pos_ += length;
  if (pos_ != payload_.size()) {
    return At(
        payload_offset_ + pos_,
        DataLossError("{} unexpected bytes at the end of the header chunk",
                      payload_.size() - pos_));
  }
  status = TraceChecker::CheckHeader(header_);
  if (!status.ok()) return At(payload_offset_, status);
  return OkStatus();
}

Status BinaryTraceReader::StartEventChunk() {
  Status status = ReadVarint(payload_, &pos_, &records_left_);
  if (!status.ok()) return At(payload_offset_, status);
  if (records_left_ == 0) {
    return At(chunk_offset_, DataLossError("event chunk with no records"));
  }
  if (records_left_ > payload_.size() - pos_) {
    return At(chunk_offset_,
              DataLossError("event chunk claims {} records in {} bytes",
                            records_left_, payload_.size() - pos_));
  }
  prev_id_ = 0;
  ++chunks_;
  return OkStatus();
}

StatusOr<bool> BinaryTraceReader::FinishAtTrailer() {
  uint64_t events = 0, names = 0, chunks = 0;
  Status status = ReadVarint(payload_, &pos_, &events);
  if (status.ok()) status = ReadVarint(payload_, &pos_, &names);
  if (status.ok()) status = ReadVarint(payload_, &pos_, &chunks);
  if (!status.ok()) return At(payload_offset_ + pos_, status);
  if (pos_ != payload_.size()) {
    return At(payload_offset_ + pos_,
              DataLossError("{} unexpected bytes at the end of the trailer",
                            payload_.size() - pos_));
  }
  if (events != checker_.events()) {
    return At(chunk_offset_,
              DataLossError("trailer says {} events but the file has {}",
                            events, checker_.events()));
  }
  if (names != checker_.names().size()) {
    return At(chunk_offset_,
              DataLossError("trailer says {} names but the file has {}", names,
                            checker_.names().size()));
  }
  if (chunks != chunks_) {
    return At(chunk_offset_,
              DataLossError("trailer says {} event chunks but the file has {}",
                            chunks, chunks_));
  }
  uint64_t end = in_->offset();
  char extra;
  LOOM_ASSIGN_OR_RETURN(size_t got, in_->Read(&extra, 1));
  if (got != 0) {
    return At(end, DataLossError("trailing garbage after the trailer chunk"));
  }
  return false;
}

Status BinaryTraceReader::DecodeRecord(Event* event, bool* is_event) {
  uint8_t op = static_cast<uint8_t>(payload_[pos_++]);
  uint8_t kind = op & 7;
  uint8_t bits = op & ~7;
  *event = Event();
  *is_event = kind != kRecordName;
  auto varint = [&](uint64_t* value) {
    return ReadVarint(payload_, &pos_, value);
  };
  auto bad_bits = [&]() {
    return DataLossError("record opcode 0x{:02x} has unknown flag bits", op);
  };
  uint64_t value = 0;
  switch (kind) {
    case kRecordName: {
      if (bits != 0) return bad_bits();
      LOOM_RETURN_IF_ERROR(varint(&value));
      if (value > kMaxNameBytes) {
        return OutOfRangeError("name of {} bytes above the limit {}", value,
                               kMaxNameBytes);
      }
      if (value > payload_.size() - pos_) {
        return DataLossError("name of {} bytes runs past the end of its chunk",
                             value);
      }
      std::string_view name(payload_.data() + pos_, value);
      pos_ += value;
      return checker_.AddName(name);
    }
    case static_cast<uint8_t>(EventKind::kAlloc):
    case static_cast<uint8_t>(EventKind::kFree): {
      if ((bits & ~(kRecordHasStream | kRecordHasDevice)) != 0)
        return bad_bits();
      event->kind = static_cast<EventKind>(kind);
      LOOM_RETURN_IF_ERROR(varint(&value));
      event->id = prev_id_ + static_cast<uint64_t>(UnZigZag(value));
      prev_id_ = event->id;
      if (event->kind == EventKind::kAlloc) {
        LOOM_RETURN_IF_ERROR(varint(&event->size));
        if (event->size > kMaxRequestSize) {
          return OutOfRangeError("alloc of request {} has size {} above 2^50",
                                 event->id, event->size);
        }
      }
      if (bits & kRecordHasStream) LOOM_RETURN_IF_ERROR(varint(&event->stream));
      if (bits & kRecordHasDevice) {
        LOOM_RETURN_IF_ERROR(varint(&value));
        if (value > static_cast<uint64_t>(kMaxDevice)) {
          return OutOfRangeError("device {} outside 0..{}", value, kMaxDevice);
        }
        event->device = static_cast<int16_t>(value);
      }
      return OkStatus();
    }
    case static_cast<uint8_t>(EventKind::kIterationBegin):
    case static_cast<uint8_t>(EventKind::kIterationEnd):
      if (bits != 0) return bad_bits();
      event->kind = static_cast<EventKind>(kind);
      return varint(&event->id);
    case static_cast<uint8_t>(EventKind::kPhase):
    case static_cast<uint8_t>(EventKind::kModuleEnter):
    case static_cast<uint8_t>(EventKind::kModuleExit): {
      uint8_t allowed = kind == static_cast<uint8_t>(EventKind::kModuleEnter)
                            ? kRecordDynamic
                            : 0;
      if ((bits & ~allowed) != 0) return bad_bits();
      event->kind = static_cast<EventKind>(kind);
      if (bits & kRecordDynamic) event->flags = kDynamicModule;
      LOOM_RETURN_IF_ERROR(varint(&value));
      if (value > UINT32_MAX) {
        return OutOfRangeError("name index {} out of range", value);
      }
      event->name = static_cast<uint32_t>(value);
      return OkStatus();
    }
    default:
      return DataLossError("unknown record kind {} (opcode 0x{:02x})", kind,
                           op);
  }
}

StatusOr<bool> BinaryTraceReader::ReadNext(Event* event) {
  while (true) {
    if (records_left_ > 0) {
      if (pos_ >= payload_.size()) {
        return At(
            payload_offset_ + pos_,
            DataLossError("event chunk ends {} records short", records_left_));
      }
      uint64_t record_offset = payload_offset_ + pos_;
      bool is_event = false;
      Status status = DecodeRecord(event, &is_event);
      if (status.ok() && is_event) status = checker_.CheckEvent(*event);
      if (!status.ok()) return At(record_offset, status);
      --records_left_;
      if (is_event) return true;
      continue;
    }
    if (pos_ < payload_.size()) {
      return At(payload_offset_ + pos_,
                DataLossError("{} bytes after the last record of the chunk",
                              payload_.size() - pos_));
    }
    char tag;
    LOOM_RETURN_IF_ERROR(ReadChunk(&tag));
    if (tag == kChunkTrailer) return FinishAtTrailer();
    if (tag == kChunkHeader) {
      return At(chunk_offset_, DataLossError("a second header chunk"));
    }
    LOOM_RETURN_IF_ERROR(StartEventChunk());
  }
}

class BinaryTraceWriter : public TraceWriter {
 public:
  explicit BinaryTraceWriter(std::unique_ptr<ByteSink> sink)
      : TraceWriter(std::move(sink)) {}

  TraceFormat format() const override { return TraceFormat::kBinary; }

  Status Begin(const TraceHeader& header) {
    std::string start(kBinaryTraceMagic);
    AppendU32(&start, kBinaryTraceVersion);
    std::string payload;
    AppendVarint(&payload, ZigZag(header.device));
    AppendVarint(&payload, header.granularity);
    AppendVarint(&payload, header.provenance.size());
    payload += header.provenance;
    LOOM_RETURN_IF_ERROR(sink().Write(start));
    return WriteChunk(kChunkHeader, "", payload);
  }

 protected:
  Status EmitName(uint32_t index) override {
    AppendName(index);
    return MaybeFlush();
  }

  Status EmitEvent(const Event& e, bool defines_name) override {
    if (defines_name) AppendName(e.name);
    uint8_t kind = static_cast<uint8_t>(e.kind);
    switch (e.kind) {
      case EventKind::kAlloc:
      case EventKind::kFree: {
        uint8_t op = kind;
        if (e.stream != 0) op |= kRecordHasStream;
        if (e.device != 0) op |= kRecordHasDevice;
        records_ += static_cast<char>(op);
        AppendVarint(&records_, ZigZag(static_cast<int64_t>(e.id - prev_id_)));
        prev_id_ = e.id;
        if (e.kind == EventKind::kAlloc) AppendVarint(&records_, e.size);
        if (e.stream != 0) AppendVarint(&records_, e.stream);
        if (e.device != 0) {
          AppendVarint(&records_, static_cast<uint64_t>(e.device));
        }
        break;
      }
      case EventKind::kIterationBegin:
      case EventKind::kIterationEnd:
        records_ += static_cast<char>(kind);
        AppendVarint(&records_, e.id);
        break;
      case EventKind::kPhase:
      case EventKind::kModuleEnter:
      case EventKind::kModuleExit:
        records_ += static_cast<char>(
            kind | ((e.flags & kDynamicModule) ? kRecordDynamic : 0));
        AppendVarint(&records_, e.name);
        break;
    }
    ++count_;
    return MaybeFlush();
  }

  Status EmitEnd() override {
    LOOM_RETURN_IF_ERROR(FlushChunk());
    std::string payload;
    AppendVarint(&payload, events_written());
    AppendVarint(&payload, names().size());
    AppendVarint(&payload, chunks_);
    return WriteChunk(kChunkTrailer, "", payload);
  }

 private:
  void AppendName(uint32_t index) {
    const std::string& name = names()[index];
    records_ += static_cast<char>(kRecordName);
    AppendVarint(&records_, name.size());
    records_ += name;
    ++count_;
  }

  Status MaybeFlush() {
    return records_.size() >= kBinaryChunkTargetBytes ? FlushChunk()
                                                      : OkStatus();
  }

  Status FlushChunk() {
    if (count_ == 0) return OkStatus();
    std::string prefix;
    AppendVarint(&prefix, count_);
    Status status = WriteChunk(kChunkEvents, prefix, records_);
    records_.clear();
    count_ = 0;
    prev_id_ = 0;
    ++chunks_;
    return status;
  }

  // Writes one chunk whose payload is prefix + body.
  Status WriteChunk(char tag, std::string_view prefix, std::string_view body) {
    std::string head(1, tag);
    AppendU32(&head, static_cast<uint32_t>(prefix.size() + body.size()));
    head += prefix;
    uint32_t crc = Crc32c(body, Crc32c(head));
    std::string tail;
    AppendU32(&tail, crc);
    LOOM_RETURN_IF_ERROR(sink().Write(head));
    LOOM_RETURN_IF_ERROR(sink().Write(body));
    return sink().Write(tail);
  }

  std::string records_;
  uint64_t count_ = 0;
  uint64_t prev_id_ = 0;
  uint64_t chunks_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<TraceReader>> OpenBinaryTraceReader(
    std::unique_ptr<ByteReader> in) {
  auto reader = std::make_unique<BinaryTraceReader>(std::move(in));
  LOOM_RETURN_IF_ERROR(reader->ReadStart());
  return std::unique_ptr<TraceReader>(std::move(reader));
}

StatusOr<std::unique_ptr<TraceWriter>> NewBinaryTraceWriter(
    std::unique_ptr<ByteSink> sink, const TraceHeader& header) {
  auto writer = std::make_unique<BinaryTraceWriter>(std::move(sink));
  LOOM_RETURN_IF_ERROR(writer->Begin(header));
  return std::unique_ptr<TraceWriter>(std::move(writer));
}

}  // namespace loom::plan
