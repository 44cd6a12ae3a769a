// The built-in workloads that existed before the variable-length, eval and
// capacity workloads (issue 16) must keep producing byte-identical traces:
// results in bench/results and the tests elsewhere depend on them. Each
// expected value below is a hash of the whole trace (header, name table,
// every field of every event) recorded before those workloads were added;
// a change to the generator that alters any existing trace fails here.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "whatif/workloads/load.h"

namespace loom::whatif {
namespace {

// FNV-1a over every byte that matters, fields length-prefixed.
class Hasher {
 public:
  void Add(uint64_t value) {
    for (int i = 0; i < 8; ++i) Byte(static_cast<uint8_t>(value >> (8 * i)));
  }
  void Add(const std::string& text) {
    Add(text.size());
    for (char c : text) Byte(static_cast<uint8_t>(c));
  }
  uint64_t value() const { return hash_; }

 private:
  void Byte(uint8_t b) {
    hash_ ^= b;
    hash_ *= 0x100000001b3ULL;
  }
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

uint64_t TraceHash(const plan::Trace& trace) {
  Hasher h;
  h.Add(static_cast<uint64_t>(static_cast<int64_t>(trace.header.device)));
  h.Add(trace.header.granularity);
  h.Add(trace.header.provenance);
  h.Add(trace.names.size());
  for (const std::string& name : trace.names) h.Add(name);
  h.Add(trace.events.size());
  for (const plan::Event& e : trace.events) {
    h.Add(static_cast<uint64_t>(e.kind));
    h.Add(e.flags);
    h.Add(static_cast<uint64_t>(static_cast<int64_t>(e.device)));
    h.Add(e.name);
    h.Add(e.id);
    h.Add(e.size);
    h.Add(e.stream);
  }
  return h.value();
}

struct Expected {
  const char* spec;
  uint64_t events;
  uint64_t hash;
};

// Recorded at commit 1ff30cd (before issue 16's workloads). The specs are
// the three built-ins and the option sets used by tests, benches and docs.
constexpr Expected kExpected[] = {
    {"builtin:moe", 8760, 0xf97c69eda6d0bc15ULL},
    {"builtin:dense", 2648, 0x5db1bc1e4ce3aff2ULL},
    {"builtin:moe_comm", 8760, 0x4f08ff1ce9f4c703ULL},
    {"builtin:moe:layers=4,seed=7", 4488, 0xe78031a8abe52638ULL},
    {"builtin:moe:routing_skew=2", 8760, 0xa16e8be96c350db8ULL},
    {"builtin:moe:seed=2", 8760, 0x8b40122a4f838070ULL},
    {"builtin:moe:layers=2,iterations=2", 1266, 0xfb013b95e1602f32ULL},
    {"builtin:moe:layers=2,iterations=3,seq_len=512,seed=1", 1809,
     0xa9606c32518d6913ULL},
    {"builtin:moe:layers=2,iterations=3,seq_len=512,seed=2", 1809,
     0x5d2840e37031b1beULL},
    {"builtin:moe_comm:experts=4,top_k=1,hidden=512,comm_stream=0", 5688,
     0x5825417e77187850ULL},
    {"builtin:dense:layers=2,iterations=4,seq_len=512", 824,
     0xc2cbd074c946341dULL},
    {"builtin:dense:layers=2,iterations=8,seq_len=256", 1588,
     0xdad7912265bb79deULL},
    {"builtin:dense:layers=2,seed=5", 824, 0x1b77f0b5f9576526ULL},
    {"builtin:dense:micro_batch=3,vocab=50257,ffn_hidden=8192,heads=8,"
     "optimizer_shard=1",
     2648, 0x5f8e702dbc87c314ULL},
};

TEST(BuiltinFingerprintTest, ExistingBuiltinsAreUnchanged) {
  for (const Expected& expected : kExpected) {
    StatusOr<Workload> workload = LoadWorkload(expected.spec);
    ASSERT_TRUE(workload.ok())
        << expected.spec << ": " << workload.status().ToString();
    const plan::Trace& trace = workload->trace;
    uint64_t hash = TraceHash(trace);
    EXPECT_EQ(trace.events.size(), expected.events) << expected.spec;
    EXPECT_EQ(hash, expected.hash)
        << expected.spec << ": {\"" << expected.spec << "\", "
        << trace.events.size() << ", 0x" << std::hex << hash << "ULL}";
  }
}

}  // namespace
}  // namespace loom::whatif
