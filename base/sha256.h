// SHA-256 (FIPS 180-4), for fingerprints that must not collide by accident:
// the request fingerprint that decides whether one rank may replay another
// rank's plan (plan/trace/fingerprint.h). Not for secrets: no constant-time
// guarantees.
#ifndef LOOM_BASE_SHA256_H_
#define LOOM_BASE_SHA256_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// Incremental hasher: Update() any number of times, then HexDigest() once.
class Sha256 {
 public:
  Sha256();

  // REQUIRES: HexDigest()/Digest() not yet called.
  void Update(std::string_view data);

  // The 32-byte digest. REQUIRES: called at most once.
  std::array<uint8_t, 32> Digest();
  // The digest as 64 lower-case hex digits. REQUIRES: called at most once.
  std::string HexDigest();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed so far
  bool finished_ = false;
};

// SHA-256 of `data` as 64 lower-case hex digits.
std::string Sha256Hex(std::string_view data);

}  // namespace loom

#endif  // LOOM_BASE_SHA256_H_
