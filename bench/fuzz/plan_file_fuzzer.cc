// libFuzzer target for the plan-file reader (plan/planfile/plan_file.h).
//
// Built and run by bench/fuzz/plan_file_fuzz.sh with clang's
// -fsanitize=fuzzer,address,undefined. A custom mutator repairs the section
// checksums of half the mutants, so the fuzzer gets past the CRCs to the
// value checks. Built with -DLOOM_FUZZ_SEEDS it is instead a small program
// that writes seed plans into the directory given as its argument.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "plan/planfile/plan_file.h"
#include "plan/testing/plan_corpus.h"

namespace {

using loom::plan::PlanFile;

void RepairChecksums(uint8_t* data, size_t size) {
  size_t pos = 16;
  while (pos + 16 <= size) {
    uint64_t length = 0;
    for (int k = 7; k >= 0; --k) length = (length << 8) | data[pos + 8 + k];
    if (length > size || pos + 16 + length + 4 > size) return;
    const uint32_t crc = loom::Crc32c(std::string_view(
        reinterpret_cast<const char*>(data) + pos, 16 + length));
    for (int k = 0; k < 4; ++k)
      data[pos + 16 + length + k] = (crc >> (8 * k)) & 0xff;
    pos += 16 + length + 4;
  }
}

}  // namespace

#ifdef LOOM_FUZZ_SEEDS
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::vector<PlanFile> seeds = loom::plan::testing::PlanSeeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path =
        std::string(argv[1]) + "/seed" + std::to_string(i) + ".plan";
    if (!loom::plan::WritePlanFile(path, seeds[i]).ok()) return 1;
  }
  return 0;
}
#else
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size,
                                          size_t max_size, unsigned int seed) {
  size = LLVMFuzzerMutate(data, size, max_size);
  if (seed % 2 == 0) RepairChecksums(data, size);
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  loom::StatusOr<PlanFile> plan = loom::plan::DecodePlanFile(bytes, "fuzz");
  if (!plan.ok()) return 0;
  // Accepted plans round-trip and respect the format's guarantees.
  for (const loom::plan::PlannedBuffer& b : plan->buffers) {
    if (b.size == 0 || b.start >= b.end ||
        b.offset + b.size > plan->region_size)
      abort();
  }
  loom::StatusOr<PlanFile> again =
      loom::plan::DecodePlanFile(loom::plan::EncodePlanFile(*plan), "again");
  if (!again.ok() || !(*again == *plan)) abort();
  (void)loom::plan::FormatPlanText(*plan, 8);
  return 0;
}
#endif
