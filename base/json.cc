#include "base/json.h"

#include <fmt/format.h>

#include <cmath>

#include "base/check.h"

namespace loom {

void JsonWriter::NewLine() {
  if (indent_ <= 0) return;
  out_ += '\n';
  out_.append(scopes_.size() * indent_, ' ');
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (scopes_.empty()) {
    LOOM_CHECK(out_.empty(), "JsonWriter: second top-level value");
    return;
  }
  LOOM_CHECK(scopes_.back() == Scope::kArray,
             "JsonWriter: value inside an object without a key");
  if (!first_.back()) out_ += ',';
  first_.back() = false;
  NewLine();
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  out_ += '{';
  scopes_.push_back(Scope::kObject);
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  LOOM_CHECK(
      !scopes_.empty() && scopes_.back() == Scope::kObject && !after_key_,
      "JsonWriter: unbalanced EndObject");
  bool empty = first_.back();
  scopes_.pop_back();
  first_.pop_back();
  if (!empty) NewLine();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  out_ += '[';
  scopes_.push_back(Scope::kArray);
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  LOOM_CHECK(!scopes_.empty() && scopes_.back() == Scope::kArray,
             "JsonWriter: unbalanced EndArray");
  bool empty = first_.back();
  scopes_.pop_back();
  first_.pop_back();
  if (!empty) NewLine();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  LOOM_CHECK(
      !scopes_.empty() && scopes_.back() == Scope::kObject && !after_key_,
      "JsonWriter: Key outside an object");
  if (!first_.back()) out_ += ',';
  first_.back() = false;
  NewLine();
  out_ += Quote(key);
  out_ += indent_ > 0 ? ": " : ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view value) {
  BeforeValue();
  out_ += Quote(value);
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  fmt::format_to(std::back_inserter(out_), "{}", value);
  return *this;
}

JsonWriter& JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  fmt::format_to(std::back_inserter(out_), "{}", value);
  return *this;
}

JsonWriter& JsonWriter::Double(double value) {
  BeforeValue();
  if (!std::isfinite(value)) {
    out_ += "null";
  } else {
    fmt::format_to(std::back_inserter(out_), "{}", value);
  }
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
  return *this;
}

JsonWriter& JsonWriter::Raw(std::string_view json) {
  BeforeValue();
  out_ += json;
  return *this;
}

const std::string& JsonWriter::str() const {
  LOOM_CHECK(scopes_.empty() && !after_key_, "JsonWriter: unclosed scope");
  return out_;
}

std::string JsonWriter::Quote(std::string_view value) {
  std::string out = "\"";
  for (char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}",
                         static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace loom
