// FlatMap: an open-addressing hash map from non-zero 64-bit keys (device
// addresses) to small values, for the allocator's hot path.
//
// Linear probing in one power-of-two array, backward-shift deletion (no
// tombstones), growth at 50% load. Inserting and erasing never allocate
// except when the table grows, unlike std::unordered_map's node per entry.
// Key 0 marks an empty slot and cannot be stored. Not thread-safe.
#ifndef LOOM_VMM_FLAT_MAP_H_
#define LOOM_VMM_FLAT_MAP_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "base/check.h"

namespace loom::vmm {

template <typename Value>
class FlatMap {
 public:
  FlatMap() : slots_(16) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Returns the value for `key`, or nullptr.
  Value* Find(uint64_t key) {
    for (size_t i = Home(key);; i = Next(i)) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }
  const Value* Find(uint64_t key) const {
    return const_cast<FlatMap*>(this)->Find(key);
  }

  // Inserts `key` (REQUIRES: non-zero and not present).
  [[gnu::always_inline]] void Insert(uint64_t key, Value value) {
    LOOM_CHECK(key != 0);
    if (2 * (size_ + 1) > slots_.size()) Grow();
    size_t i = Home(key);
    while (slots_[i].key != 0) {
      LOOM_DCHECK(slots_[i].key != key);
      i = Next(i);
    }
    slots_[i] = Slot{key, std::move(value)};
    ++size_;
  }

  // Removes `key`; returns false if it was not present.
  bool Erase(uint64_t key) { return Take(key, nullptr); }

  // Removes `key`, moving its value to *value (if not null); returns false
  // if it was not present. One probe, for find-then-erase.
  bool Take(uint64_t key, Value* value) {
    size_t i = Home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return false;
      i = Next(i);
    }
    if (value != nullptr) *value = std::move(slots_[i].value);
    // Backward-shift: move later entries of the probe run into the hole.
    size_t hole = i;
    for (size_t j = Next(i);; j = Next(j)) {
      if (slots_[j].key == 0) break;
      size_t home = Home(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      bool stays =
          hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!stays) {
        slots_[hole] = std::move(slots_[j]);
        hole = j;
      }
    }
    slots_[hole].key = 0;
    --size_;
    return true;
  }

  // Calls f(key, value) for every entry.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.key != 0) f(s.key, s.value);
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Value value{};
  };
  size_t Home(uint64_t key) const {
    // Fibonacci hashing: addresses share low bits, so mix them.
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  size_t Next(size_t i) const { return (i + 1) & (slots_.size() - 1); }
  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    --shift_;
    size_ = 0;
    for (Slot& s : old) {
      if (s.key != 0) Insert(s.key, std::move(s.value));
    }
  }

  std::vector<Slot> slots_;
  int shift_ = 64 - 4;  // log2(16) bits of the hash
  size_t size_ = 0;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_FLAT_MAP_H_
