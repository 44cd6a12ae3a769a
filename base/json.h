// JsonWriter: a small streaming JSON writer (pure C++).
//
// Used for every machine-readable output (`--json`, stats through the C ABI).
// The writer inserts commas itself; callers only describe structure:
//   JsonWriter w;
//   w.BeginObject();
//   w.Key("peak_bytes").Uint(123);
//   w.Key("algorithms").BeginArray().String("best_fit").EndArray();
//   w.EndObject();
//   std::string text = w.str();
// Misuse (a value where a key is expected, unbalanced End*) is a bug and
// aborts through LOOM_CHECK.
#ifndef LOOM_BASE_JSON_H_
#define LOOM_BASE_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class JsonWriter {
 public:
  // `indent` > 0 pretty-prints with that many spaces per level.
  explicit JsonWriter(int indent = 0) : indent_(indent) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // REQUIRES: inside an object, and the previous call completed a value.
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  // Non-finite values are written as null (JSON has no NaN/Inf).
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // Inserts already-formatted JSON text as one value.
  JsonWriter& Raw(std::string_view json);

  // REQUIRES: every Begin* has been closed.
  const std::string& str() const;

  // JSON string literal for `value`, quotes included.
  static std::string Quote(std::string_view value);

 private:
  enum class Scope : uint8_t { kObject, kArray };
  void BeforeValue();
  void NewLine();

  int indent_;
  std::string out_;
  std::vector<Scope> scopes_;
  std::vector<bool> first_;  // per scope: no element written yet
  bool after_key_ = false;
};

}  // namespace loom

#endif  // LOOM_BASE_JSON_H_
