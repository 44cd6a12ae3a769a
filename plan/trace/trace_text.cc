#include "plan/trace/trace_text.h"

#include <charconv>
#include <vector>

#include "base/text.h"

namespace loom::plan {
namespace {

constexpr size_t kWriterFlushBytes = size_t{1} << 16;

// A token of a line: bare (a view into the line) or quoted (unescaped).
struct Token {
  std::string_view bare;
  bool quoted = false;
  std::string value;  // quoted tokens only
  std::string_view text() const {
    return quoted ? std::string_view(value) : bare;
  }
};

// Shows user text in a message: escaped, at most 40 bytes.
std::string Shown(std::string_view text) { return QuotedForMessage(text, 40); }

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsControl(unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; }

// Splits `line` into tokens; stops at a `#` that starts a token.
Status Tokenize(std::string_view line, std::vector<Token>* tokens) {
  tokens->clear();
  size_t pos = 0;
  const size_t end = line.size();
  while (true) {
    while (pos < end && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
    if (pos == end || line[pos] == '#') return OkStatus();
    Token& token = tokens->emplace_back();
    if (line[pos] == '"') {
      token.quoted = true;
      ++pos;
      while (true) {
        if (pos == end)
          return InvalidArgumentError("unterminated quoted string");
        unsigned char c = line[pos];
        if (c == '"') {
          ++pos;
          break;
        }
        if (c == '\\') {
          if (pos + 1 == end)
            return InvalidArgumentError("unterminated quoted string");
          char e = line[pos + 1];
          pos += 2;
          switch (e) {
            case '\\':
              token.value += '\\';
              break;
            case '"':
              token.value += '"';
              break;
            case 'n':
              token.value += '\n';
              break;
            case 't':
              token.value += '\t';
              break;
            case 'x': {
              int hi = pos < end ? HexDigit(line[pos]) : -1;
              int lo = pos + 1 < end ? HexDigit(line[pos + 1]) : -1;
              if (hi < 0 || lo < 0) {
                return InvalidArgumentError("escape \\x needs two hex digits");
              }
              token.value += static_cast<char>(hi * 16 + lo);
              pos += 2;
              break;
            }
            default:
              return InvalidArgumentError(
                  "unknown escape {} in a quoted string",
                  Shown(std::string("\\") + e));
          }
          continue;
        }
        if (IsControl(c)) {
          return InvalidArgumentError(
              "control byte 0x{:02x} in a quoted string (write it as "
              "\\x{:02x})",
              c, c);
        }
        token.value += static_cast<char>(c);
        ++pos;
      }
      if (pos < end && line[pos] != ' ' && line[pos] != '\t') {
        return InvalidArgumentError("no space after a quoted string");
      }
      continue;
    }
    size_t begin = pos;
    while (pos < end && line[pos] != ' ' && line[pos] != '\t') {
      unsigned char c = line[pos];
      if (c == '"' || c == '\\' || IsControl(c)) {
        return InvalidArgumentError(
            "byte {} not allowed in a bare token (quote it)",
            Shown(std::string_view(line.data() + pos, 1)));
      }
      ++pos;
    }
    token.bare = line.substr(begin, pos - begin);
  }
}

StatusOr<uint64_t> ParseNumber(const Token& token, std::string_view what) {
  std::string_view text = token.text();
  uint64_t value = 0;
  if (token.quoted || text.empty() || text[0] < '0' || text[0] > '9') {
    return InvalidArgumentError("{} {} is not an unsigned decimal number", what,
                                Shown(text));
  }
  auto [ptr, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) {
    return OutOfRangeError("{} {} is out of range", what, Shown(text));
  }
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgumentError("{} {} is not an unsigned decimal number", what,
                                Shown(text));
  }
  return value;
}

class TextTraceReader : public TraceReader {
 public:
  explicit TextTraceReader(std::unique_ptr<ByteReader> in)
      : TraceReader(in->name()), in_(std::move(in)) {}

  TraceFormat format() const override { return TraceFormat::kText; }

  Status ReadHeader();

 protected:
  StatusOr<bool> ReadNext(Event* event) override;

 private:
  // Prefixes `status` with the file name and the current line.
  Status AtLine(const Status& status) const {
    return Status(status.code(), fmt::format("{}:{}: {}", source_, line_number_,
                                             status.message()));
  }
  // Reads the next line that is not blank or a comment into tokens_.
  StatusOr<bool> NextLine();
  // Requires tokens_ to hold the keyword plus `count` more.
  Status Expect(size_t count, std::string_view usage) const;
  Status ExpectHeaderLine(std::string_view keyword);
  StatusOr<uint32_t> NameIndex(const Token& token);
  Status ParseEvent(Event* event);

  std::unique_ptr<ByteReader> in_;
  uint64_t line_number_ = 0;
  std::string line_;
  std::vector<Token> tokens_;
};

StatusOr<bool> TextTraceReader::NextLine() {
  while (true) {
    StatusOr<bool> got = in_->ReadLine(&line_, kMaxTextLineBytes);
    ++line_number_;
    if (!got.ok()) return AtLine(got.status());
    if (!*got) {
      --line_number_;
      return false;
    }
    std::string_view line = line_;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    Status status = Tokenize(line, &tokens_);
    if (!status.ok()) return AtLine(status);
    if (!tokens_.empty()) return true;
  }
}

Status TextTraceReader::Expect(size_t count, std::string_view usage) const {
  if (tokens_.size() < count + 1) {
    return InvalidArgumentError(
        "'{}' needs {} (usage: {})", tokens_[0].text(),
        count == 1 ? "1 argument" : fmt::format("{} arguments", count), usage);
  }
  return OkStatus();
}

Status TextTraceReader::ExpectHeaderLine(std::string_view keyword) {
  LOOM_ASSIGN_OR_RETURN(bool got, NextLine());
  if (!got) {
    return Status(StatusCode::kDataLoss,
                  fmt::format("{}:{}: truncated: missing the '{}' header line",
                              source_, line_number_ + 1, keyword));
  }
  if (tokens_[0].quoted || tokens_[0].text() != keyword) {
    return AtLine(
        InvalidArgumentError("expected the '{}' header line, found {}", keyword,
                             Shown(tokens_[0].text())));
  }
  size_t want = keyword == "events" ? 1 : 2;
  if (tokens_.size() != want) {
    return AtLine(
        InvalidArgumentError("'{}' takes {} argument", keyword, want - 1));
  }
  return OkStatus();
}

Status TextTraceReader::ReadHeader() {
  LOOM_ASSIGN_OR_RETURN(bool got, NextLine());
  if (!got) {
    return DataLossError("{}: empty file: not a loom trace (no '{} {}' line)",
                         source_, kTextTraceMagic, kTextTraceVersion);
  }
  if (tokens_[0].quoted || tokens_[0].text() != kTextTraceMagic) {
    return AtLine(InvalidArgumentError(
        "not a loom trace: expected '{} {}' as the first line, found {}",
        kTextTraceMagic, kTextTraceVersion, Shown(line_)));
  }
  if (tokens_.size() != 2) {
    return AtLine(InvalidArgumentError("the magic line is '{} <version>'",
                                       kTextTraceMagic));
  }
  StatusOr<uint64_t> version = ParseNumber(tokens_[1], "version");
  if (!version.ok()) return AtLine(version.status());
  if (*version != kTextTraceVersion) {
    return AtLine(InvalidArgumentError(
        "unsupported text trace version {} (this reader knows {})", *version,
        kTextTraceVersion));
  }

  LOOM_RETURN_IF_ERROR(ExpectHeaderLine("device"));
  {
    std::string_view text = tokens_[1].text();
    if (text == "-1" && !tokens_[1].quoted) {
      header_.device = -1;
    } else {
      StatusOr<uint64_t> device = ParseNumber(tokens_[1], "device");
      if (!device.ok()) return AtLine(device.status());
      if (*device > static_cast<uint64_t>(kMaxDevice)) {
        return AtLine(OutOfRangeError("header device {} outside -1..{}",
                                      *device, kMaxDevice));
      }
      header_.device = static_cast<int32_t>(*device);
    }
  }
  LOOM_RETURN_IF_ERROR(ExpectHeaderLine("granularity"));
  StatusOr<uint64_t> granularity = ParseNumber(tokens_[1], "granularity");
  if (!granularity.ok()) return AtLine(granularity.status());
  header_.granularity = *granularity;
  Status status = TraceChecker::CheckHeader(header_);
  if (!status.ok()) return AtLine(status);
  LOOM_RETURN_IF_ERROR(ExpectHeaderLine("provenance"));
  if (!tokens_[1].quoted) {
    return AtLine(
        InvalidArgumentError("the provenance must be a quoted string"));
  }
  header_.provenance = tokens_[1].value;
  status = TraceChecker::CheckHeader(header_);
  if (!status.ok()) return AtLine(status);
  return ExpectHeaderLine("events");
}

StatusOr<uint32_t> TextTraceReader::NameIndex(const Token& token) {
  std::string_view name = token.text();
  if (std::optional<uint32_t> index = checker_.FindName(name)) return *index;
  LOOM_RETURN_IF_ERROR(checker_.AddName(name));
  return static_cast<uint32_t>(checker_.names().size() - 1);
}

Status TextTraceReader::ParseEvent(Event* event) {
  const Token& keyword = tokens_[0];
  std::string_view kw = keyword.quoted ? std::string_view() : keyword.text();
  *event = Event();
  size_t used = 0;  // tokens consumed, keyword included
  if (kw == "a" || kw == "f") {
    bool alloc = kw == "a";
    LOOM_RETURN_IF_ERROR(
        Expect(alloc ? 2 : 1, alloc ? "a <id> <size> [s=<stream>] [d=<device>]"
                                    : "f <id> [s=<stream>] [d=<device>]"));
    event->kind = alloc ? EventKind::kAlloc : EventKind::kFree;
    LOOM_ASSIGN_OR_RETURN(event->id, ParseNumber(tokens_[1], "request id"));
    used = 2;
    if (alloc) {
      LOOM_ASSIGN_OR_RETURN(event->size, ParseNumber(tokens_[2], "size"));
      if (event->size > kMaxRequestSize) {
        return OutOfRangeError("size {} above the limit 2^50", event->size);
      }
      used = 3;
    }
    bool has_stream = false, has_device = false;
    for (; used < tokens_.size(); ++used) {
      const Token& token = tokens_[used];
      std::string_view text = token.text();
      if (!token.quoted && text.starts_with("s=") && !has_stream) {
        Token value;
        value.bare = text.substr(2);
        LOOM_ASSIGN_OR_RETURN(event->stream, ParseNumber(value, "stream"));
        has_stream = true;
      } else if (!token.quoted && text.starts_with("d=") && !has_device) {
        Token value;
        value.bare = text.substr(2);
        LOOM_ASSIGN_OR_RETURN(uint64_t device, ParseNumber(value, "device"));
        if (device > static_cast<uint64_t>(kMaxDevice)) {
          return OutOfRangeError("device {} outside 0..{}", device, kMaxDevice);
        }
        event->device = static_cast<int16_t>(device);
        has_device = true;
      } else {
        return InvalidArgumentError(
            "unexpected {} (expected s=<stream> or "
            "d=<device>, each at most once)",
            Shown(text));
      }
    }
  } else if (kw == "ib" || kw == "ie") {
    LOOM_RETURN_IF_ERROR(Expect(1, fmt::format("{} <iteration>", kw)));
    event->kind =
        kw == "ib" ? EventKind::kIterationBegin : EventKind::kIterationEnd;
    LOOM_ASSIGN_OR_RETURN(event->id, ParseNumber(tokens_[1], "iteration"));
    used = 2;
  } else if (kw == "ph" || kw == "me" || kw == "mx") {
    LOOM_RETURN_IF_ERROR(Expect(1, fmt::format("{} <name>", kw)));
    event->kind = kw == "ph"   ? EventKind::kPhase
                  : kw == "me" ? EventKind::kModuleEnter
                               : EventKind::kModuleExit;
    LOOM_ASSIGN_OR_RETURN(event->name, NameIndex(tokens_[1]));
    used = 2;
    if (kw == "me" && tokens_.size() > 2) {
      if (tokens_[2].quoted || tokens_[2].text() != "dynamic") {
        return InvalidArgumentError(
            "expected 'dynamic' after the module name, found {}",
            Shown(tokens_[2].text()));
      }
      event->flags = kDynamicModule;
      used = 3;
    }
  } else {
    return InvalidArgumentError("unknown keyword {}", Shown(keyword.text()));
  }
  if (used < tokens_.size()) {
    return InvalidArgumentError("unexpected {} after the event",
                                Shown(tokens_[used].text()));
  }
  return OkStatus();
}

StatusOr<bool> TextTraceReader::ReadNext(Event* event) {
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool got, NextLine());
    if (!got) {
      return Status(StatusCode::kDataLoss,
                    fmt::format("{}:{}: truncated: no 'end' trailer after {} "
                                "events",
                                source_, line_number_ + 1, checker_.events()));
    }
    const Token& keyword = tokens_[0];
    if (!keyword.quoted && keyword.text() == "name") {
      if (tokens_.size() != 2) {
        return AtLine(InvalidArgumentError("usage: name <name>"));
      }
      Status status = checker_.AddName(tokens_[1].text());
      if (!status.ok()) return AtLine(status);
      continue;
    }
    if (!keyword.quoted && keyword.text() == "end") {
      if (tokens_.size() != 2)
        return AtLine(InvalidArgumentError("usage: end <events>"));
      StatusOr<uint64_t> count = ParseNumber(tokens_[1], "event count");
      if (!count.ok()) return AtLine(count.status());
      if (*count != checker_.events()) {
        return AtLine(
            DataLossError("trailer says {} events but the file has {}", *count,
                          checker_.events()));
      }
      LOOM_ASSIGN_OR_RETURN(bool more, NextLine());
      if (more) {
        return AtLine(InvalidArgumentError(
            "unexpected {} after the 'end' trailer", Shown(tokens_[0].text())));
      }
      return false;
    }
    Status status = ParseEvent(event);
    if (status.ok()) status = checker_.CheckEvent(*event);
    if (!status.ok()) return AtLine(status);
    return true;
  }
}

bool NeedsQuotes(std::string_view name) {
  if (name.empty() || name[0] == '#') return true;
  for (unsigned char c : name) {
    if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\') return true;
  }
  return false;
}

void AppendQuoted(std::string* out, std::string_view text) {
  *out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '\\':
        *out += "\\\\";
        break;
      case '"':
        *out += "\\\"";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          constexpr char kHex[] = "0123456789abcdef";
          *out += "\\x";
          *out += kHex[c >> 4];
          *out += kHex[c & 15];
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

void AppendNumber(std::string* out, uint64_t value) {
  fmt::format_int text(value);
  out->append(text.data(), text.size());
}

class TextTraceWriter : public TraceWriter {
 public:
  explicit TextTraceWriter(std::unique_ptr<ByteSink> sink)
      : TraceWriter(std::move(sink)) {}

  TraceFormat format() const override { return TraceFormat::kText; }

  Status Begin(const TraceHeader& header) {
    out_ = fmt::format("{} {}\ndevice {}\ngranularity {}\nprovenance ",
                       kTextTraceMagic, kTextTraceVersion, header.device,
                       header.granularity);
    AppendQuoted(&out_, header.provenance);
    out_ += "\nevents\n";
    return OkStatus();
  }

 protected:
  Status EmitName(uint32_t index) override {
    out_ += "name ";
    AppendName(index);
    out_ += '\n';
    return MaybeFlush();
  }

  Status EmitEvent(const Event& e, bool /*defines_name*/) override {
    switch (e.kind) {
      case EventKind::kAlloc:
      case EventKind::kFree:
        out_ += e.kind == EventKind::kAlloc ? "a " : "f ";
        AppendNumber(&out_, e.id);
        if (e.kind == EventKind::kAlloc) {
          out_ += ' ';
          AppendNumber(&out_, e.size);
        }
        if (e.stream != 0) {
          out_ += " s=";
          AppendNumber(&out_, e.stream);
        }
        if (e.device != 0) {
          out_ += " d=";
          AppendNumber(&out_, static_cast<uint64_t>(e.device));
        }
        break;
      case EventKind::kIterationBegin:
      case EventKind::kIterationEnd:
        out_ += e.kind == EventKind::kIterationBegin ? "ib " : "ie ";
        AppendNumber(&out_, e.id);
        break;
      case EventKind::kPhase:
        out_ += "ph ";
        AppendName(e.name);
        break;
      case EventKind::kModuleEnter:
        out_ += "me ";
        AppendName(e.name);
        if (e.flags & kDynamicModule) out_ += " dynamic";
        break;
      case EventKind::kModuleExit:
        out_ += "mx ";
        AppendName(e.name);
        break;
    }
    out_ += '\n';
    return MaybeFlush();
  }

  Status EmitEnd() override {
    out_ += "end ";
    AppendNumber(&out_, events_written());
    out_ += '\n';
    return Flush();
  }

 private:
  void AppendName(uint32_t index) {
    const std::string& name = names()[index];
    if (NeedsQuotes(name)) {
      AppendQuoted(&out_, name);
    } else {
      out_ += name;
    }
  }
  Status MaybeFlush() {
    return out_.size() >= kWriterFlushBytes ? Flush() : OkStatus();
  }
  Status Flush() {
    Status status = sink().Write(out_);
    out_.clear();
    return status;
  }

  std::string out_;
};

}  // namespace

std::string FormatTextName(std::string_view name) {
  if (!NeedsQuotes(name)) return std::string(name);
  std::string out;
  AppendQuoted(&out, name);
  return out;
}

StatusOr<std::unique_ptr<TraceReader>> OpenTextTraceReader(
    std::unique_ptr<ByteReader> in) {
  auto reader = std::make_unique<TextTraceReader>(std::move(in));
  LOOM_RETURN_IF_ERROR(reader->ReadHeader());
  return std::unique_ptr<TraceReader>(std::move(reader));
}

StatusOr<std::unique_ptr<TraceWriter>> NewTextTraceWriter(
    std::unique_ptr<ByteSink> sink, const TraceHeader& header) {
  auto writer = std::make_unique<TextTraceWriter>(std::move(sink));
  LOOM_RETURN_IF_ERROR(writer->Begin(header));
  return std::unique_ptr<TraceWriter>(std::move(writer));
}

}  // namespace loom::plan
