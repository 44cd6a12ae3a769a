#include "plan/solver/minimalloc_csv.h"

#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>

#include "base/text.h"

namespace loom::plan {
namespace {

enum class Column {
  kId,
  kLower,
  kUpper,
  kEndInclusive,
  kSize,
  kAlignment,
  kOffset
};

std::vector<std::string_view> SplitCommas(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t begin = 0;
  while (true) {
    size_t comma = line.find(',', begin);
    if (comma == std::string_view::npos) {
      fields.push_back(TrimBlanks(line.substr(begin)));
      return fields;
    }
    fields.push_back(TrimBlanks(line.substr(begin, comma - begin)));
    begin = comma + 1;
  }
}

StatusOr<Column> ColumnFromName(std::string_view name) {
  if (name == "id" || name == "buffer" || name == "buffer_id")
    return Column::kId;
  if (name == "lower" || name == "begin" || name == "start")
    return Column::kLower;
  if (name == "upper") return Column::kUpper;
  if (name == "end") return Column::kEndInclusive;
  if (name == "size") return Column::kSize;
  if (name == "alignment") return Column::kAlignment;
  if (name == "offset") return Column::kOffset;
  return InvalidArgumentError("unknown column '{}'", name);
}

StatusOr<uint64_t> ParseValue(std::string_view field, std::string_view what) {
  if (field.empty()) return InvalidArgumentError("empty {}", what);
  uint64_t value = 0;
  auto [ptr, ec] =
      std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec == std::errc::result_out_of_range) {
    return OutOfRangeError("{} '{}' is too large", what, field);
  }
  if (ec != std::errc() || ptr != field.data() + field.size()) {
    return InvalidArgumentError("{} '{}' is not a non-negative integer", what,
                                field);
  }
  if (value > kMaxCsvValue) {
    return OutOfRangeError("{} {} exceeds the limit 2^50", what, value);
  }
  return value;
}

}  // namespace

StatusOr<CsvInstance> ParseMinimallocCsv(std::string_view text,
                                         std::string_view source) {
  CsvInstance out;
  std::vector<Column> columns;
  bool has_id = false, has_lower = false, has_end = false, has_size = false;
  bool has_offset = false;
  bool numeric_ids = true;
  std::vector<std::string> labels;
  size_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t newline = text.find('\n', pos);
    std::string_view line = text.substr(pos, newline == std::string_view::npos
                                                 ? std::string_view::npos
                                                 : newline - pos);
    pos = newline == std::string_view::npos ? text.size() : newline + 1;
    ++line_number;
    auto where = [&](const Status& s) {
      return Status(s.code(),
                    fmt::format("{}:{}: {}", source, line_number, s.message()));
    };
    if (TrimBlanks(line).empty()) continue;
    std::vector<std::string_view> fields = SplitCommas(line);
    if (columns.empty()) {
      for (std::string_view name : fields) {
        StatusOr<Column> column = ColumnFromName(name);
        if (!column.ok()) return where(column.status());
        for (Column seen : columns) {
          if (seen == *column) {
            return where(InvalidArgumentError("column '{}' given twice", name));
          }
        }
        columns.push_back(*column);
        has_id |= *column == Column::kId;
        has_lower |= *column == Column::kLower;
        has_end |=
            *column == Column::kUpper || *column == Column::kEndInclusive;
        has_size |= *column == Column::kSize;
        has_offset |= *column == Column::kOffset;
      }
      if (!has_id || !has_lower || !has_end || !has_size) {
        return where(InvalidArgumentError(
            "header must name id, lower, upper (or end) and size columns"));
      }
      continue;
    }
    if (fields.size() != columns.size()) {
      return where(InvalidArgumentError("{} fields, the header has {}",
                                        fields.size(), columns.size()));
    }
    Buffer buffer;
    uint64_t offset = 0;
    std::string label;
    for (size_t c = 0; c < columns.size(); ++c) {
      std::string_view field = fields[c];
      if (columns[c] == Column::kId) {
        if (field.empty()) return where(InvalidArgumentError("empty id"));
        label = std::string(field);
        uint64_t id = 0;
        auto [ptr, ec] =
            std::from_chars(field.data(), field.data() + field.size(), id);
        if (ec != std::errc() || ptr != field.data() + field.size()) {
          numeric_ids = false;
        }
        buffer.id = numeric_ids ? id : out.instance.buffers.size();
        continue;
      }
      StatusOr<uint64_t> value = ParseValue(field, "value");
      switch (columns[c]) {
        case Column::kLower:
          value = ParseValue(field, "lower");
          if (value.ok()) buffer.start = static_cast<int64_t>(*value);
          break;
        case Column::kUpper:
          value = ParseValue(field, "upper");
          if (value.ok()) buffer.end = static_cast<int64_t>(*value);
          break;
        case Column::kEndInclusive:
          value = ParseValue(field, "end");
          if (value.ok()) buffer.end = static_cast<int64_t>(*value) + 1;
          break;
        case Column::kSize:
          value = ParseValue(field, "size");
          if (value.ok()) buffer.size = *value;
          break;
        case Column::kAlignment:
          value = ParseValue(field, "alignment");
          if (value.ok()) buffer.alignment = *value;
          break;
        case Column::kOffset:
          value = ParseValue(field, "offset");
          if (value.ok()) offset = *value;
          break;
        case Column::kId:
          break;
      }
      if (!value.ok()) return where(value.status());
    }
    if (buffer.start >= buffer.end) {
      return where(InvalidArgumentError("empty lifetime [{}, {})", buffer.start,
                                        buffer.end));
    }
    if (buffer.size == 0) return where(InvalidArgumentError("size is 0"));
    if (buffer.alignment == 0 ||
        (buffer.alignment & (buffer.alignment - 1)) != 0) {
      return where(InvalidArgumentError("alignment {} is not a power of two",
                                        buffer.alignment));
    }
    out.instance.buffers.push_back(buffer);
    labels.push_back(std::move(label));
    if (has_offset) out.offsets.push_back(offset);
  }
  if (columns.empty()) {
    return InvalidArgumentError("{}: empty file (no header line)", source);
  }
  if (!numeric_ids) {
    // Some ids are text: number buffers by position and keep the text.
    for (size_t i = 0; i < out.instance.buffers.size(); ++i) {
      out.instance.buffers[i].id = i;
    }
    out.instance.labels = std::move(labels);
  }
  return out;
}

StatusOr<CsvInstance> ReadMinimallocCsv(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError("{}: cannot open file: {}", path, OsErrorText(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLossError("{}: read error", path);
  return ParseMinimallocCsv(text.str(), path);
}

std::string FormatMinimallocCsv(const Instance& instance,
                                const std::vector<uint64_t>& offsets) {
  LOOM_CHECK(offsets.empty() || offsets.size() == instance.buffers.size());
  std::string out = offsets.empty() ? "id,lower,upper,size\n"
                                    : "id,lower,upper,size,offset\n";
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    const Buffer& b = instance.buffers[i];
    if (instance.labels.empty()) {
      fmt::format_to(std::back_inserter(out), "{},{},{},{}", b.id, b.start,
                     b.end, b.size);
    } else {
      fmt::format_to(std::back_inserter(out), "{},{},{},{}", instance.labels[i],
                     b.start, b.end, b.size);
    }
    if (!offsets.empty())
      fmt::format_to(std::back_inserter(out), ",{}", offsets[i]);
    out += '\n';
  }
  return out;
}

Status WriteMinimallocCsv(const std::string& path, const Instance& instance,
                          const std::vector<uint64_t>& offsets) {
  errno = 0;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    return NotFoundError("{}: cannot create file: {}", path,
                         OsErrorText(errno));
  }
  file << FormatMinimallocCsv(instance, offsets);
  file.close();
  if (!file) return DataLossError("{}: write error", path);
  return OkStatus();
}

}  // namespace loom::plan
