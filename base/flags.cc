#include "base/flags.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace loom {

StatusOr<uint64_t> ParseSize(std::string_view text) {
  size_t digits = 0;
  while (
      digits < text.size() &&
      ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) {
    ++digits;
  }
  if (digits == 0) return InvalidArgumentError("'{}' is not a size", text);
  std::string number(text.substr(0, digits));
  std::string_view suffix = text.substr(digits);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"M", 1 << 20},
      {"MiB", 1 << 20},
      {"G", 1 << 30},
      {"GiB", 1 << 30},
      {"T", 1099511627776.0},
      {"TiB", 1099511627776.0},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
  };
  for (const Unit& unit : kUnits) {
    if (suffix != unit.name) continue;
    char* end = nullptr;
    double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size() || !std::isfinite(value)) {
      return InvalidArgumentError("'{}' is not a size", text);
    }
    double bytes = value * unit.factor;
    if (bytes > 1.8e19) return OutOfRangeError("size '{}' is too large", text);
    if (bytes != std::floor(bytes)) {
      return InvalidArgumentError("size '{}' is not a whole number of bytes",
                                  text);
    }
    return static_cast<uint64_t>(bytes);
  }
  return InvalidArgumentError("'{}' has an unknown unit '{}'", text, suffix);
}

FlagParser::FlagParser(std::string command, std::string usage,
                       std::string description)
    : command_(std::move(command)),
      usage_(std::move(usage)),
      description_(std::move(description)) {}

void FlagParser::AddString(std::string name, std::string* value,
                           std::string help) {
  flags_.push_back({std::move(name), Type::kString, value, std::move(help)});
}
void FlagParser::AddInt(std::string name, int64_t* value, std::string help) {
  flags_.push_back({std::move(name), Type::kInt, value, std::move(help)});
}
void FlagParser::AddDouble(std::string name, double* value, std::string help) {
  flags_.push_back({std::move(name), Type::kDouble, value, std::move(help)});
}
void FlagParser::AddSize(std::string name, uint64_t* value, std::string help) {
  flags_.push_back({std::move(name), Type::kSize, value, std::move(help)});
}
void FlagParser::AddBool(std::string name, bool* value, std::string help) {
  flags_.push_back({std::move(name), Type::kBool, value, std::move(help)});
}
void FlagParser::AddPositional(std::string name, std::string* value,
                               std::string help, bool required) {
  positionals_.push_back({std::move(name), value, std::move(help), required});
}
void FlagParser::AddRest(std::string name, std::vector<std::string>* values,
                         std::string help) {
  rest_name_ = std::move(name);
  rest_ = values;
  rest_help_ = std::move(help);
}

const FlagParser::Flag* FlagParser::Find(std::string_view name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

Status FlagParser::SetFlag(const Flag& flag, std::string_view text) {
  switch (flag.type) {
    case Type::kString:
      *static_cast<std::string*>(flag.value) = std::string(text);
      return OkStatus();
    case Type::kInt: {
      int64_t v = 0;
      auto [ptr, ec] =
          std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || ptr != text.data() + text.size()) {
        return InvalidArgumentError("--{}: '{}' is not an integer", flag.name,
                                    text);
      }
      *static_cast<int64_t*>(flag.value) = v;
      return OkStatus();
    }
    case Type::kDouble: {
      std::string s(text);
      char* end = nullptr;
      double v = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
        return InvalidArgumentError("--{}: '{}' is not a number", flag.name,
                                    text);
      }
      *static_cast<double*>(flag.value) = v;
      return OkStatus();
    }
    case Type::kSize: {
      StatusOr<uint64_t> v = ParseSize(text);
      if (!v.ok())
        return v.status().WithContext(fmt::format("--{}", flag.name));
      *static_cast<uint64_t*>(flag.value) = *v;
      return OkStatus();
    }
    case Type::kBool:
      if (text == "true" || text == "1" || text == "yes") {
        *static_cast<bool*>(flag.value) = true;
      } else if (text == "false" || text == "0" || text == "no") {
        *static_cast<bool*>(flag.value) = false;
      } else {
        return InvalidArgumentError("--{}: '{}' is not true or false",
                                    flag.name, text);
      }
      return OkStatus();
  }
  return InternalError("unknown flag type");
}

std::optional<int> FlagParser::Parse(const std::vector<std::string>& args) {
  auto fail = [&](const Status& status) -> std::optional<int> {
    std::fprintf(stderr, "loom %s: %s\n\n%s", command_.c_str(),
                 status.message().c_str(), Help().c_str());
    return 2;
  };
  size_t next_positional = 0;
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (!only_positionals && (arg == "--help" || arg == "-h")) {
      std::fputs(Help().c_str(), stdout);
      return 0;
    }
    if (!only_positionals && arg == "--") {
      only_positionals = true;
      continue;
    }
    if (!only_positionals && arg.size() > 2 && arg.substr(0, 2) == "--") {
      std::string_view body = arg.substr(2);
      size_t eq = body.find('=');
      std::string_view name = body.substr(0, eq);
      const Flag* flag = Find(name);
      if (flag == nullptr && eq == std::string_view::npos &&
          name.substr(0, 3) == "no-") {
        const Flag* negated = Find(name.substr(3));
        if (negated != nullptr && negated->type == Type::kBool) {
          *static_cast<bool*>(negated->value) = false;
          continue;
        }
      }
      if (flag == nullptr) {
        return fail(InvalidArgumentError("unknown flag --{}", name));
      }
      std::string_view value;
      if (eq != std::string_view::npos) {
        value = body.substr(eq + 1);
      } else if (flag->type == Type::kBool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return fail(InvalidArgumentError("--{} needs a value", name));
      }
      Status status = SetFlag(*flag, value);
      if (!status.ok()) return fail(status);
      continue;
    }
    if (next_positional < positionals_.size()) {
      *positionals_[next_positional++].value = std::string(arg);
    } else if (rest_ != nullptr) {
      rest_->push_back(std::string(arg));
    } else {
      return fail(InvalidArgumentError("unexpected argument '{}'", arg));
    }
  }
  for (size_t p = next_positional; p < positionals_.size(); ++p) {
    if (positionals_[p].required) {
      return fail(InvalidArgumentError("missing <{}>", positionals_[p].name));
    }
  }
  return std::nullopt;
}

std::string FlagParser::Help() const {
  std::string out =
      fmt::format("usage: loom {} {}\n\n{}\n", command_, usage_, description_);
  if (!positionals_.empty() || rest_ != nullptr) {
    out += "\narguments:\n";
    for (const Positional& p : positionals_) {
      out += fmt::format("  {:<22} {}{}\n", "<" + p.name + ">", p.help,
                         p.required ? "" : " (optional)");
    }
    if (rest_ != nullptr) {
      out +=
          fmt::format("  {:<22} {}\n", "<" + rest_name_ + "...>", rest_help_);
    }
  }
  out += "\noptions:\n";
  for (const Flag& flag : flags_) {
    std::string spelled = "--" + flag.name;
    switch (flag.type) {
      case Type::kString:
        spelled += " S";
        break;
      case Type::kInt:
        spelled += " N";
        break;
      case Type::kDouble:
        spelled += " X";
        break;
      case Type::kSize:
        spelled += " BYTES";
        break;
      case Type::kBool:
        break;
    }
    out += fmt::format("  {:<22} {}\n", spelled, flag.help);
  }
  out += fmt::format("  {:<22} {}\n", "--help", "show this help");
  return out;
}

}  // namespace loom
