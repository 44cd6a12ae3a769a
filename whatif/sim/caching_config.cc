#include "whatif/sim/caching_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <vector>

#include "base/check.h"

namespace loom::whatif {
namespace {

bool IsPowerOfTwo(uint64_t value) { return std::has_single_bit(value); }

int FloorLog2(uint64_t value) { return 63 - std::countl_zero(value); }

// ConfigTokenizer: splits on , : [ ] (each a token) and drops spaces.
std::vector<std::string> Tokenize(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
      tokens.emplace_back(1, c);
    } else if (c != ' ') {
      current += c;
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

class Parser {
 public:
  Parser(std::string_view text, CachingConfig* config)
      : text_(text), tokens_(Tokenize(text)), config_(config) {}

  Status Run() {
    // PyTorch resets these three on every parse unless re-specified.
    config_->max_split_size = kNoMaxSplitSize;
    config_->roundup_power2_divisions.fill(0);
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const std::string& key = tokens_[i];
      LOOM_RETURN_IF_ERROR(Expect(++i, ":"));
      ++i;
      if (key == "expandable_segments") {
        LOOM_ASSIGN_OR_RETURN(config_->expandable_segments, Bool(i));
      } else if (key == "max_split_size_mb") {
        LOOM_ASSIGN_OR_RETURN(uint64_t mb, Number(i));
        if (mb < kLargeBuffer / kMiB) {
          return Error("max_split_size_mb too small, must be >= {}",
                       kLargeBuffer / kMiB);
        }
        config_->max_split_size = std::min(mb, kNoMaxSplitSize / kMiB) * kMiB;
      } else if (key == "max_non_split_rounding_mb") {
        LOOM_ASSIGN_OR_RETURN(uint64_t mb, Number(i));
        if (mb < kLargeBuffer / kMiB) {
          return Error("max_non_split_rounding_mb too small, must be >= {}",
                       kLargeBuffer / kMiB);
        }
        config_->max_non_split_rounding_size =
            std::min(mb, kNoMaxSplitSize / kMiB) * kMiB;
      } else if (key == "large_segment_size_mb") {
        LOOM_ASSIGN_OR_RETURN(uint64_t mb, Number(i));
        if (mb == 0 || mb % 2 != 0 || mb > (uint64_t{1} << 30)) {
          return Error(
              "large_segment_size_mb must be a positive multiple of 2");
        }
        config_->large_segment_size = mb * kMiB;
      } else if (key == "roundup_power2_divisions") {
        LOOM_ASSIGN_OR_RETURN(i, Divisions(i));
      } else if (key == "garbage_collection_threshold") {
        return UnimplementedError(
            "allocator settings '{}': garbage_collection_threshold needs a "
            "memory fraction, which the simulator does not model",
            text_);
      } else if (key == "backend") {
        if (i >= tokens_.size()) return Error("expected a backend");
        if (tokens_[i] == "cudaMallocAsync") {
          return UnimplementedError(
              "allocator settings '{}': backend:cudaMallocAsync is not "
              "simulated",
              text_);
        }
        if (tokens_[i] != "native") {
          return Error("unknown backend '{}' (native or cudaMallocAsync)",
                       tokens_[i]);
        }
      } else if (key == "release_lock_on_cudamalloc" ||
                 key == "pinned_use_cuda_host_register" ||
                 key == "pinned_use_background_threads") {
        LOOM_ASSIGN_OR_RETURN(bool ignored, Bool(i));
        (void)ignored;
      } else if (key == "pinned_num_register_threads") {
        LOOM_ASSIGN_OR_RETURN(uint64_t ignored, Number(i));
        (void)ignored;
      } else {
        return Error("unrecognized key '{}'", key);
      }
      if (i + 1 < tokens_.size()) LOOM_RETURN_IF_ERROR(Expect(++i, ","));
    }
    return OkStatus();
  }

 private:
  template <typename... Args>
  Status Error(fmt::format_string<Args...> format, Args&&... args) {
    return InvalidArgumentError(
        "allocator settings '{}': {}", text_,
        fmt::format(format, std::forward<Args>(args)...));
  }

  Status Expect(size_t i, std::string_view token) {
    if (i >= tokens_.size()) return Error("expected '{}' at the end", token);
    if (tokens_[i] != token) {
      return Error("expected '{}', found '{}'", token, tokens_[i]);
    }
    return OkStatus();
  }

  StatusOr<bool> Bool(size_t i) {
    if (i < tokens_.size() && tokens_[i] == "True") return true;
    if (i < tokens_.size() && tokens_[i] == "False") return false;
    return Error("expected True or False, found '{}'",
                 i < tokens_.size() ? tokens_[i] : "");
  }

  StatusOr<uint64_t> Number(size_t i) {
    if (i >= tokens_.size()) return Error("expected a number at the end");
    const std::string& token = tokens_[i];
    uint64_t value = 0;
    auto [end, error] =
        std::from_chars(token.data(), token.data() + token.size(), value);
    if (error != std::errc() || end != token.data() + token.size()) {
      return Error("'{}' is not a non-negative integer", token);
    }
    return value;
  }

  // roundup_power2_divisions: N, or [key:N, ..., >:N]. Returns the index of
  // the last token consumed.
  StatusOr<size_t> Divisions(size_t i) {
    auto& buckets = config_->roundup_power2_divisions;
    if (i < tokens_.size() && tokens_[i] != "[") {
      LOOM_ASSIGN_OR_RETURN(uint64_t value, Number(i));
      if (!IsPowerOfTwo(value)) {
        return Error("roundup_power2_divisions {} is not a power of 2", value);
      }
      buckets.fill(value);
      return i;
    }
    if (i >= tokens_.size()) return Error("expected roundup_power2_divisions");
    bool first = true;
    size_t last_index = 0;
    while (++i < tokens_.size() && tokens_[i] != "]") {
      size_t key_at = i;
      LOOM_RETURN_IF_ERROR(Expect(++i, ":"));
      LOOM_ASSIGN_OR_RETURN(uint64_t value, Number(++i));
      if (value != 0 && !IsPowerOfTwo(value)) {
        return Error("divisions {} must be a power of 2 or 0", value);
      }
      if (tokens_[key_at] == ">") {
        std::fill(
            buckets.begin() + std::min<size_t>(last_index + 1, buckets.size()),
            buckets.end(), value);
      } else {
        LOOM_ASSIGN_OR_RETURN(uint64_t boundary_mb, Number(key_at));
        if (!IsPowerOfTwo(boundary_mb)) {
          return Error("interval {} must be a power of 2 (in MB)", boundary_mb);
        }
        size_t index =
            std::min<size_t>(FloorLog2(boundary_mb), buckets.size() - 1);
        if (first) {
          std::fill(buckets.begin(), buckets.begin() + index, value);
          first = false;
        }
        buckets[index] = value;
        last_index = index;
      }
      if (i + 1 < tokens_.size() && tokens_[i + 1] != "]") {
        LOOM_RETURN_IF_ERROR(Expect(++i, ","));
      }
    }
    if (i >= tokens_.size()) return Error("missing ']'");
    return i;
  }

  std::string_view text_;
  std::vector<std::string> tokens_;
  CachingConfig* config_;
};

}  // namespace

StatusOr<CachingConfig> ConfigForTorchVersion(std::string_view version) {
  int major = 0;
  int minor = 0;
  const char* begin = version.data();
  const char* end = begin + version.size();
  auto [dot, error] = std::from_chars(begin, end, major);
  if (error != std::errc() || dot == end || *dot != '.') {
    return InvalidArgumentError("'{}' is not a PyTorch version like 2.6",
                                version);
  }
  auto [rest, error2] = std::from_chars(dot + 1, end, minor);
  if (error2 != std::errc() || (rest != end && *rest != '.')) {
    return InvalidArgumentError("'{}' is not a PyTorch version like 2.6",
                                version);
  }
  CachingConfig config;
  if (major < 2 || (major == 2 && minor <= 4)) {
    config.roundup_rule = RoundupRule::kDivisionsAboveZero;
  }
  if (major < 2 || (major == 2 && minor <= 5)) {
    config.non_split_rule = NonSplitRule::kLargeBuffer;
  }
  return config;
}

StatusOr<CachingConfig> ParseAllocConf(std::string_view text,
                                       const CachingConfig& base) {
  CachingConfig config = base;
  Parser parser(text, &config);
  LOOM_RETURN_IF_ERROR(parser.Run());
  return config;
}

uint64_t RoundupPower2Divisions(const CachingConfig& config, uint64_t size) {
  int log_size = size == 0 ? 0 : FloorLog2(size);
  int index = std::clamp(log_size - 20, 0, kRoundUpPowerOfTwoIntervals - 1);
  return config.roundup_power2_divisions[index];
}

uint64_t RoundupPower2NextDivision(uint64_t size, uint64_t divisions) {
  LOOM_CHECK(divisions >= 1 && IsPowerOfTwo(divisions), "divisions {}",
             divisions);
  if (IsPowerOfTwo(size)) return size;
  uint64_t floor2 = std::bit_floor(size);
  uint64_t step = floor2 >> FloorLog2(divisions);
  if (step == 0) return floor2 << 1;
  uint64_t rounded_floor = size & ~(step - 1);
  return rounded_floor == size ? size : rounded_floor + step;
}

uint64_t RoundSize(const CachingConfig& config, uint64_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  uint64_t divisions = RoundupPower2Divisions(config, size);
  uint64_t threshold =
      config.roundup_rule == RoundupRule::kDivisionsAboveOne ? 1 : 0;
  if (divisions > threshold && size > kMinBlockSize * divisions) {
    return RoundupPower2NextDivision(size, divisions);
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

uint64_t GetAllocationSize(const CachingConfig& config, uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return config.large_segment_size;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

std::string FormatAllocConf(const CachingConfig& config) {
  std::vector<std::string> parts;
  if (config.expandable_segments) parts.push_back("expandable_segments:True");
  if (config.max_split_size != kNoMaxSplitSize) {
    parts.push_back(
        fmt::format("max_split_size_mb:{}", config.max_split_size / kMiB));
  }
  if (config.max_non_split_rounding_size != kLargeBuffer) {
    parts.push_back(fmt::format("max_non_split_rounding_mb:{}",
                                config.max_non_split_rounding_size / kMiB));
  }
  if (config.large_segment_size != kLargeBuffer) {
    parts.push_back(fmt::format("large_segment_size_mb:{}",
                                config.large_segment_size / kMiB));
  }
  const auto& buckets = config.roundup_power2_divisions;
  bool any = std::any_of(buckets.begin(), buckets.end(),
                         [](uint64_t v) { return v != 0; });
  if (any) {
    std::string list;
    for (int i = 0; i < kRoundUpPowerOfTwoIntervals; ++i) {
      if (!list.empty()) list += ',';
      list += fmt::format("{}:{}", uint64_t{1} << i, buckets[i]);
    }
    parts.push_back("roundup_power2_divisions:[" + list + "]");
  }
  std::string out;
  for (const std::string& part : parts) {
    if (!out.empty()) out += ',';
    out += part;
  }
  return out;
}

}  // namespace loom::whatif
