#include "whatif/compare/driver_costs.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <utility>

namespace loom::whatif {
namespace {

// --- A small JSON reader: enough for the driver-cost files. ---------------

struct JsonValue {
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  bool integer = false;  // a number written without sign, '.' or exponent
  uint64_t unsigned_value = 0;
  std::string text;
  std::vector<JsonValue> items;                            // kArray
  std::vector<std::pair<std::string, JsonValue>> members;  // kObject

  const JsonValue* Find(std::string_view key) const {
    for (const auto& [name, value] : members) {
      if (name == key) return &value;
    }
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  StatusOr<JsonValue> Document() {
    JsonValue value;
    LOOM_RETURN_IF_ERROR(Value(value, 0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the JSON value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  Status Error(std::string_view what) const {
    return InvalidArgumentError("byte {}: {}", pos_, what);
  }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Status Value(JsonValue& out, int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end of the text");
    const char c = text_[pos_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out.type = JsonValue::Type::kString;
      return String(out.text);
    }
    if (Consume("true")) {
      out.type = JsonValue::Type::kBool;
      out.boolean = true;
      return OkStatus();
    }
    if (Consume("false")) {
      out.type = JsonValue::Type::kBool;
      return OkStatus();
    }
    if (Consume("null")) return OkStatus();
    if (c == '-' || (c >= '0' && c <= '9')) return Number(out);
    return Error(fmt::format("unexpected character '{}'", c));
  }

  Status Object(JsonValue& out, int depth) {
    out.type = JsonValue::Type::kObject;
    ++pos_;  // {
    SkipSpace();
    if (Consume("}")) return OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a key in quotes");
      }
      std::string key;
      LOOM_RETURN_IF_ERROR(String(key));
      SkipSpace();
      if (!Consume(":")) return Error("expected ':' after a key");
      JsonValue value;
      LOOM_RETURN_IF_ERROR(Value(value, depth + 1));
      out.members.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume("}")) return OkStatus();
      if (!Consume(",")) return Error("expected ',' or '}' in an object");
    }
  }

  Status Array(JsonValue& out, int depth) {
    out.type = JsonValue::Type::kArray;
    ++pos_;  // [
    SkipSpace();
    if (Consume("]")) return OkStatus();
    while (true) {
      JsonValue value;
      LOOM_RETURN_IF_ERROR(Value(value, depth + 1));
      out.items.push_back(std::move(value));
      SkipSpace();
      if (Consume("]")) return OkStatus();
      if (!Consume(",")) return Error("expected ',' or ']' in an array");
    }
  }

  // Escapes are kept as written except \" and \\ (keys and names here are
  // plain ASCII).
  Status String(std::string& out) {
    ++pos_;  // "
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) {
        return Error("control character in a string");
      }
      if (c == '\\') {
        if (pos_ >= text_.size()) break;
        c = text_[pos_++];
        if (c != '"' && c != '\\') out += '\\';
      }
      out += c;
    }
    if (pos_ >= text_.size()) return Error("unterminated string");
    ++pos_;  // "
    return OkStatus();
  }

  Status Number(JsonValue& out) {
    const size_t begin = pos_;
    while (pos_ < text_.size() &&
           std::string_view("+-0123456789.eE").find(text_[pos_]) !=
               std::string_view::npos) {
      ++pos_;
    }
    const std::string_view digits = text_.substr(begin, pos_ - begin);
    out.type = JsonValue::Type::kNumber;
    auto [end, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(),
                        out.number, std::chars_format::general);
    if (error != std::errc() || end != digits.data() + digits.size()) {
      pos_ = begin;
      return Error(fmt::format("malformed number '{}'", digits));
    }
    if (digits.find_first_of("+-.eE") == std::string_view::npos) {
      auto [int_end, int_error] = std::from_chars(
          digits.data(), digits.data() + digits.size(), out.unsigned_value);
      out.integer =
          int_error == std::errc() && int_end == digits.data() + digits.size();
    }
    return OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::optional<DriverCallKind> KindByName(std::string_view name) {
  for (DriverCallKind kind : kAllDriverCallKinds) {
    if (DriverCallName(kind) == name) return kind;
  }
  return std::nullopt;
}

DriverCostTable::Row EmptyRow(uint64_t bytes) {
  DriverCostTable::Row row;
  row.bytes = bytes;
  row.median_us.fill(-1);
  return row;
}

DriverCostTable MakeH200Table() {
  DriverCostTable table;
  table.source =
      "NVIDIA H200, driver 580.159.04 (CUDA 13.0), 2026-11-26: "
      "bench/gpu/driver_costs --rounds 50 medians "
      "(../shared/gpu_runs/2026-11-26/tests_summary.md)";
  // bytes, then reserve, create, map, set-access, unmap, release, free (us).
  struct Measured {
    uint64_t bytes;
    double reserve, create, map, access, unmap, release, address_free;
  };
  constexpr Measured kMeasured[] = {
      {uint64_t{2} << 20, 0.8, 8.3, 1.1, 21.1, 14.9, 10.5, 0.8},
      {uint64_t{20} << 20, 0.9, 8.4, 1.1, 21.6, 14.9, 19.1, 0.9},
      {uint64_t{1} << 30, 6.1, 38.8, 2.8, 85.3, 40.0, 484.3, 6.8},
  };
  for (const Measured& m : kMeasured) {
    DriverCostTable::Row row = EmptyRow(m.bytes);
    auto set = [&row](DriverCallKind kind, double us) {
      row.median_us[static_cast<size_t>(kind)] = us;
    };
    set(DriverCallKind::kAddressReserve, m.reserve);
    set(DriverCallKind::kMemCreate, m.create);
    set(DriverCallKind::kMemMap, m.map);
    set(DriverCallKind::kSetAccess, m.access);
    set(DriverCallKind::kMemUnmap, m.unmap);
    set(DriverCallKind::kMemRelease, m.release);
    set(DriverCallKind::kAddressFree, m.address_free);
    table.rows.push_back(row);
  }
  return table;
}

}  // namespace

std::optional<double> DriverCostTable::CostUs(DriverCallKind kind,
                                              uint64_t bytes) const {
  const size_t k = static_cast<size_t>(kind);
  const Row* below = nullptr;  // the largest measured size <= bytes
  const Row* above = nullptr;  // the smallest measured size >= bytes
  const Row* first = nullptr;
  for (const Row& row : rows) {
    if (row.median_us[k] < 0) continue;
    if (first == nullptr) first = &row;
    if (row.bytes <= bytes) below = &row;
    if (row.bytes >= bytes && above == nullptr) above = &row;
  }
  if (first == nullptr) return std::nullopt;
  if (bytes == 0 || below == nullptr) return first->median_us[k];
  if (above == nullptr || above == below) return below->median_us[k];
  const double t = static_cast<double>(bytes - below->bytes) /
                   static_cast<double>(above->bytes - below->bytes);
  return below->median_us[k] + t * (above->median_us[k] - below->median_us[k]);
}

const DriverCostTable& H200DriverCosts() {
  static const DriverCostTable* table = new DriverCostTable(MakeH200Table());
  return *table;
}

StatusOr<DriverCostTable> ParseDriverCosts(std::string_view json,
                                           std::string_view source) {
  auto fail = [&](std::string_view what) {
    return InvalidArgumentError("driver costs {}: {}", source, what);
  };
  StatusOr<JsonValue> document = JsonReader(json).Document();
  if (!document.ok()) return fail(document.status().message());
  if (document->type != JsonValue::Type::kObject) {
    return fail("not a JSON object");
  }
  const JsonValue* sizes = document->Find("sizes");
  if (sizes == nullptr || sizes->type != JsonValue::Type::kArray ||
      sizes->items.empty()) {
    return fail(
        "no \"sizes\" list (the format of bench/gpu/driver_costs "
        "--json)");
  }
  DriverCostTable table;
  table.source = std::string(source);
  if (const JsonValue* device = document->Find("device");
      device != nullptr && device->type == JsonValue::Type::kString) {
    table.source = fmt::format("{} ({})", source, device->text);
  }
  size_t known = 0;
  for (size_t i = 0; i < sizes->items.size(); ++i) {
    const JsonValue& item = sizes->items[i];
    const JsonValue* bytes =
        item.type == JsonValue::Type::kObject ? item.Find("bytes") : nullptr;
    if (bytes == nullptr || !bytes->integer || bytes->unsigned_value == 0) {
      return fail(
          fmt::format("sizes[{}]: \"bytes\" is not a positive integer", i));
    }
    DriverCostTable::Row row = EmptyRow(bytes->unsigned_value);
    for (const auto& [name, value] : item.members) {
      std::optional<DriverCallKind> kind = KindByName(name);
      if (!kind) continue;
      const JsonValue* median = value.type == JsonValue::Type::kObject
                                    ? value.Find("median_us")
                                    : nullptr;
      if (median == nullptr || median->type != JsonValue::Type::kNumber ||
          !(median->number >= 0) || median->number > 1e9) {
        return fail(fmt::format(
            "sizes[{}].{}: \"median_us\" is not a non-negative number of "
            "microseconds",
            i, name));
      }
      row.median_us[static_cast<size_t>(*kind)] = median->number;
      ++known;
    }
    table.rows.push_back(row);
  }
  if (known == 0) {
    return fail("no call this tool prices (cuMemCreate, cuMemMap, ...)");
  }
  std::sort(table.rows.begin(), table.rows.end(),
            [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  for (size_t i = 1; i < table.rows.size(); ++i) {
    if (table.rows[i].bytes == table.rows[i - 1].bytes) {
      return fail(fmt::format("two rows of {} bytes", table.rows[i].bytes));
    }
  }
  return table;
}

StatusOr<DriverCostTable> ReadDriverCosts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("driver costs {}: cannot read it", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > (size_t{16} << 20)) {
    return InvalidArgumentError("driver costs {}: larger than 16 MiB", path);
  }
  return ParseDriverCosts(text.str(), path);
}

DriverTime PriceDriverCalls(const DriverCalls& calls,
                            const DriverCostTable& table) {
  DriverTime time;
  std::vector<bool> unpriced(kDriverCallKinds, false);
  // Calls counted without a size (count fields set directly) are unsized.
  std::vector<std::pair<std::pair<DriverCallKind, uint64_t>, uint64_t>> all(
      calls.sized.begin(), calls.sized.end());
  for (DriverCallKind kind : kAllDriverCallKinds) {
    uint64_t sized = 0;
    for (const auto& [key, count] : calls.sized) {
      if (key.first == kind) sized += count;
    }
    if (calls.count(kind) > sized) {
      all.push_back({{kind, 0}, calls.count(kind) - sized});
    }
  }
  for (const auto& [key, count] : all) {
    const auto& [kind, bytes] = key;
    std::optional<double> cost = table.CostUs(kind, bytes);
    if (!cost) {
      time.unpriced_calls += count;
      unpriced[static_cast<size_t>(kind)] = true;
      continue;
    }
    time.us += *cost * static_cast<double>(count);
    time.priced_calls += count;
    if (bytes == 0) time.unsized_calls += count;
  }
  for (DriverCallKind kind : kAllDriverCallKinds) {
    if (unpriced[static_cast<size_t>(kind)]) {
      time.unpriced_kinds.emplace_back(DriverCallName(kind));
    }
  }
  return time;
}

std::string FormatMicros(double us) {
  if (us < 1000) return fmt::format("{:.0f} us", us);
  if (us < 1e6) return fmt::format("{:.1f} ms", us / 1e3);
  return fmt::format("{:.2f} s", us / 1e6);
}

}  // namespace loom::whatif
