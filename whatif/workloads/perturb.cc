#include "whatif/workloads/perturb.h"

#include <fmt/format.h>

#include <charconv>
#include <random>
#include <unordered_set>
#include <vector>

#include "base/check.h"
#include "base/flags.h"
#include "base/text.h"

namespace loom::whatif {
namespace {

StatusOr<double> ParseShare(std::string_view key, std::string_view value) {
  bool percent = false;
  if (!value.empty() && value.back() == '%') {
    percent = true;
    value.remove_suffix(1);
  }
  double parsed = 0;
  auto [ptr, ec] =
      std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (ec != std::errc() || ptr != value.data() + value.size() ||
      value.empty()) {
    return InvalidArgumentError("--perturb {}: {} is not a number", key,
                                QuotedForMessage(value, 32));
  }
  if (percent) parsed /= 100;
  if (!(parsed >= 0 && parsed <= 1)) {
    return InvalidArgumentError(
        "--perturb {}: {} is not within 0..1 (0%..100%)", key,
        QuotedForMessage(value, 32));
  }
  return parsed;
}

}  // namespace

StatusOr<PerturbOptions> ParsePerturbOptions(std::string_view text) {
  PerturbOptions options;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = TrimBlanks(text.substr(begin, end - begin));
    begin = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError("--perturb: {} is not key=value",
                                  QuotedForMessage(item, 32));
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    if (key == "drop") {
      LOOM_ASSIGN_OR_RETURN(options.drop, ParseShare(key, value));
    } else if (key == "add") {
      LOOM_ASSIGN_OR_RETURN(options.add, ParseShare(key, value));
    } else if (key == "resize") {
      LOOM_ASSIGN_OR_RETURN(options.resize, ParseShare(key, value));
    } else if (key == "seed") {
      auto [ptr, ec] = std::from_chars(
          value.data(), value.data() + value.size(), options.seed);
      if (ec != std::errc() || ptr != value.data() + value.size() ||
          value.empty()) {
        return InvalidArgumentError("--perturb seed: {} is not a number",
                                    QuotedForMessage(value, 32));
      }
    } else if (key == "max_add") {
      StatusOr<uint64_t> bytes = ParseSize(value);
      if (!bytes.ok() || *bytes == 0) {
        return InvalidArgumentError(
            "--perturb max_add: {} is not a size of at least 1 byte",
            QuotedForMessage(value, 32));
      }
      options.max_add_bytes = *bytes;
    } else {
      return InvalidArgumentError(
          "--perturb: unknown key {} (drop, add, resize, seed, max_add)",
          QuotedForMessage(key, 32));
    }
  }
  return options;
}

std::string FormatPerturbOptions(const PerturbOptions& o) {
  std::string out =
      fmt::format("drop={:g}%,add={:g}%,resize={:g}%,seed={}", o.drop * 100,
                  o.add * 100, o.resize * 100, o.seed);
  if (o.max_add_bytes != PerturbOptions().max_add_bytes)
    out += fmt::format(",max_add={}", o.max_add_bytes);
  return out;
}

plan::Trace Perturb(const plan::Trace& trace, const PerturbOptions& options) {
  LOOM_CHECK(options.max_add_bytes >= 1, "perturbing with max_add_bytes 0");
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> unit(0, 1);
  auto chance = [&](double p) { return p > 0 && unit(rng) < p; };
  plan::Trace out;
  out.header = trace.header;
  out.names = trace.names;
  out.events.reserve(trace.events.size() + trace.events.size() / 8);
  std::unordered_set<uint64_t> dropped;
  uint64_t max_id = 0;
  for (const plan::Event& e : trace.events) {
    if (e.kind == plan::EventKind::kAlloc) max_id = std::max(max_id, e.id);
  }
  uint64_t next_extra = max_id + 1;
  std::vector<uint64_t> extras_live;
  for (const plan::Event& e : trace.events) {
    if (e.kind == plan::EventKind::kAlloc) {
      if (chance(options.drop)) {
        dropped.insert(e.id);
        continue;
      }
      plan::Event copy = e;
      if (chance(options.resize)) {
        const uint64_t delta = 512 * (1 + rng() % 64);
        if (rng() % 2 == 0 || copy.size <= delta + 512) {
          copy.size += delta;
        } else {
          copy.size -= delta;
        }
      }
      out.events.push_back(copy);
      if (chance(options.add)) {
        out.events.push_back(plan::Event::Alloc(
            next_extra, 1 + rng() % options.max_add_bytes, 0, e.device));
        extras_live.push_back(next_extra++);
      }
    } else if (e.kind == plan::EventKind::kFree) {
      if (dropped.erase(e.id) > 0) continue;
      out.events.push_back(e);
      // Added requests live a random while: each free may end one.
      if (!extras_live.empty() && chance(0.3)) {
        const size_t k = rng() % extras_live.size();
        out.events.push_back(plan::Event::Free(extras_live[k], 0, e.device));
        extras_live[k] = extras_live.back();
        extras_live.pop_back();
      }
    } else {
      out.events.push_back(e);
    }
  }
  for (uint64_t id : extras_live) out.events.push_back(plan::Event::Free(id));
  return out;
}

}  // namespace loom::whatif
