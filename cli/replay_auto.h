// `loom replay --auto K`: the part of `loom replay` that replays auto mode
// (whatif/loom/auto_replay.h) and prints it.
#ifndef LOOM_CLI_REPLAY_AUTO_H_
#define LOOM_CLI_REPLAY_AUTO_H_

#include <string>

#include "whatif/compare/compare.h"
#include "whatif/loom/auto_replay.h"

namespace loom::cli {

// Replays `input` as auto mode would serve it and prints the result (JSON
// with `json`); returns the exit code (1 on an error, an OOM or corrupted
// data).
int ReplayAuto(const std::string& input,
               const whatif::AutoReplayOptions& options, bool json,
               const whatif::DriverCostTable& costs);

}  // namespace loom::cli

#endif  // LOOM_CLI_REPLAY_AUTO_H_
