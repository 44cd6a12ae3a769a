// FlagParser: command-line flags for loom_tool subcommands.
//
// Each subcommand declares its flags and positional arguments, then parses:
//   FlagParser flags("plan", "<input> [options]", "Plans an instance.");
//   flags.AddPositional("input", &input, "trace, snapshot or CSV");
//   flags.AddSize("capacity", &capacity, "fit in this many bytes");
//   flags.AddBool("json", &json, "print JSON");
//   if (auto exit = flags.Parse(args)) return *exit;
// Accepted forms: --name=value, --name value, --flag, --no-flag, and
// positionals in order; `--help`/`-h` prints the help and exits 0; anything
// unknown or malformed prints an error plus usage to stderr and exits 2.
#ifndef LOOM_BASE_FLAGS_H_
#define LOOM_BASE_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace loom {

// Parses a byte count: "4096", "2MiB", "1.5GiB", "80GB", "512K". Binary
// suffixes (KiB, MiB, GiB, TiB, and K, M, G, T) are powers of 1024; decimal
// ones (KB, MB, GB, TB) powers of 1000.
StatusOr<uint64_t> ParseSize(std::string_view text);

class FlagParser {
 public:
  FlagParser(std::string command, std::string usage, std::string description);

  void AddString(std::string name, std::string* value, std::string help);
  void AddInt(std::string name, int64_t* value, std::string help);
  void AddDouble(std::string name, double* value, std::string help);
  void AddSize(std::string name, uint64_t* value, std::string help);
  void AddBool(std::string name, bool* value, std::string help);
  // Positionals are matched in the order added; optional ones must come last.
  void AddPositional(std::string name, std::string* value, std::string help,
                     bool required = true);
  // Collects any remaining positionals (e.g. several input files).
  void AddRest(std::string name, std::vector<std::string>* values,
               std::string help);

  // Returns nullopt to continue, or the exit code to return right away
  // (0 after --help, 2 after a usage error, both already printed).
  std::optional<int> Parse(const std::vector<std::string>& args);

  std::string Help() const;

 private:
  enum class Type { kString, kInt, kDouble, kSize, kBool };
  struct Flag {
    std::string name;
    Type type;
    void* value;
    std::string help;
  };
  struct Positional {
    std::string name;
    std::string* value;
    std::string help;
    bool required;
  };
  Status SetFlag(const Flag& flag, std::string_view text);
  const Flag* Find(std::string_view name) const;

  std::string command_;
  std::string usage_;
  std::string description_;
  std::vector<Flag> flags_;
  std::vector<Positional> positionals_;
  std::string rest_name_;
  std::vector<std::string>* rest_ = nullptr;
  std::string rest_help_;
};

}  // namespace loom

#endif  // LOOM_BASE_FLAGS_H_
