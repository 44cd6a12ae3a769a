#include "plan/instance_input.h"

#include <fstream>
#include <sstream>

#include "plan/minimalloc_csv.h"

namespace loom::plan {

StatusOr<InstanceInput> ReadInstanceInput(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("{}: cannot open file", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLossError("{}: read error", path);
  const std::string bytes = text.str();
  if (bytes.starts_with("LOOMPLAN")) {
    return InvalidArgumentError(
        "{}: is a loom plan file, not an instance (MiniMalloc CSV)", path);
  }
  if (bytes.starts_with("loom-trace")) {
    return UnimplementedError(
        "{}: loom traces are not planned directly yet; give a MiniMalloc CSV",
        path);
  }
  LOOM_ASSIGN_OR_RETURN(CsvInstance csv, ParseMinimallocCsv(bytes, path));
  InstanceInput input;
  input.instance = std::move(csv.instance);
  input.offsets = std::move(csv.offsets);
  return input;
}

}  // namespace loom::plan
