// A set of 32-byte block keys: the replay's record of which blocks it wrote
// to and read from the SSD, kept as it goes (one call per batch) so that
// counting the distinct ones at the end is not a sort of every write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "index/radix_core.h"

namespace saria {

class KeySet {
 public:
  KeySet();
  // Adds keys[0..k) (repeats allowed); returns how many were new.
  size_t add(const uint8_t* keys, size_t k);
  // out[j] = 1 when keys[j] is in the set.
  void contains(const uint8_t* keys, size_t k, uint8_t* out) const;
  // How many keys of this set are not in `other`.
  size_t count_absent_from(const KeySet& other) const;
  size_t size() const { return keys_.size(); }
  // The keys in the order they were first added (32 bytes each).
  const std::vector<Key>& keys() const { return keys_; }
  size_t memory_bytes() const { return keys_.capacity() * sizeof(Key) + table_.capacity() * 8; }

 private:
  bool has(const Key& key, uint64_t h) const;
  void grow();

  std::vector<Key> keys_;
  std::vector<uint64_t> table_;  // (hash tag << 32 | index into keys_), ~0 = empty
  uint64_t mask_ = 0;
};

}  // namespace saria
