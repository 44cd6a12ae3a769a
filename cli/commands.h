// The subcommands of loom_tool, the C++ half of the `loom` command line.
//
// Each subcommand lives in its own cmd_<name>.cc, parses its own flags with
// FlagParser (flags.h) and returns the process exit code: 0 success, 1 the
// work failed (bad input file, no driver, ...), 2 usage error. Errors go to
// stderr as one readable line; results go to stdout (a table, or JSON with
// --json). The Python front end (`./loom`, `python3 -m loom`) forwards these
// subcommands here after turning PyTorch snapshots into loom traces.
#ifndef LOOM_CLI_COMMANDS_H_
#define LOOM_CLI_COMMANDS_H_

#include <string>
#include <string_view>
#include <vector>

namespace loom::cli {

using Args = std::vector<std::string>;

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(const Args& args);
};

int RunInfo(const Args& args);
int RunReplay(const Args& args);
int RunAnalyze(const Args& args);
int RunCompare(const Args& args);
int RunPlan(const Args& args);
int RunVerify(const Args& args);
int RunStress(const Args& args);

// The table main() dispatches on, in the order `loom_tool --help` lists them.
inline constexpr Command kCommands[] = {
    {"info", "backend, devices, granularity, total and free memory", RunInfo},
    {"replay", "run a trace through loom's run-time allocator", RunReplay},
    {"analyze", "lifetime classes, peaks and iterations of a trace or CSV",
     RunAnalyze},
    {"compare", "compare simulated allocators on a workload", RunCompare},
    {"plan", "plan an instance (offsets per buffer) and write a plan file",
     RunPlan},
    {"stress", "random multi-stream programs against the run-time allocator",
     RunStress},
    {"verify", "check a plan or offsets against an instance", RunVerify},
};

}  // namespace loom::cli

#endif  // LOOM_CLI_COMMANDS_H_
