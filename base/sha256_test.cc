#include "base/sha256.h"

#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

// FIPS 180-4 examples and NIST's one-million-'a' vector.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Feeding the same bytes in any split gives the same digest (block
// boundaries at 55, 56, 63, 64 and 65 bytes included).
TEST(Sha256Test, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>(i * 7 + 3));
  for (size_t length : {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 300}) {
    const std::string_view whole(data.data(), length);
    const std::string expected = Sha256Hex(whole);
    for (size_t split = 0; split <= length; split += 13) {
      Sha256 hash;
      hash.Update(whole.substr(0, split));
      hash.Update(whole.substr(split));
      EXPECT_EQ(hash.HexDigest(), expected) << length << " " << split;
    }
  }
}

TEST(Sha256Test, DifferentInputsDiffer) {
  EXPECT_NE(Sha256Hex("a1,0;"), Sha256Hex("a1,1;"));
}

}  // namespace
}  // namespace loom
