// loom_tool: dispatches `loom_tool <subcommand> [args]` to cli/cmd_*.cc.
#include <cstdio>
#include <string_view>

#include "cli/commands.h"

namespace {

void PrintUsage(FILE* out) {
  std::fputs("usage: loom_tool <subcommand> [options]\n\nsubcommands:\n", out);
  for (const loom::cli::Command& command : loom::cli::kCommands) {
    std::fprintf(out, "  %-10.*s %.*s\n", static_cast<int>(command.name.size()),
                 command.name.data(), static_cast<int>(command.summary.size()),
                 command.summary.data());
  }
  std::fputs("\n`loom_tool <subcommand> --help` describes each one.\n", out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(stdout);
    return 0;
  }
  for (const loom::cli::Command& command : loom::cli::kCommands) {
    if (command.name == name) {
      return command.run(loom::cli::Args(argv + 2, argv + argc));
    }
  }
  std::fprintf(stderr, "loom_tool: unknown subcommand '%s'\n\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
