// Implementation of KeySet (key_set.h): open addressing over the keys'
// table hash, entries tagged with the hash's high half as in the index.
#include "index/key_set.h"

#include <algorithm>

namespace saria {

namespace {
constexpr uint64_t kEmpty = ~uint64_t{0};
}

KeySet::KeySet() : table_(1024, kEmpty), mask_(1023) {}

bool KeySet::has(const Key& key, uint64_t h) const {
  const uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (uint64_t pos = h & mask_;; pos = (pos + 1) & mask_) {
    const uint64_t e = table_[pos];
    if (e == kEmpty) return false;
    if (static_cast<uint32_t>(e >> 32) == tag && keys_[static_cast<uint32_t>(e)] == key) return true;
  }
}

size_t KeySet::add(const uint8_t* keys, size_t k) {
  // The table is far larger than the caches (millions of keys): hash a batch
  // first and fetch its slots ahead, then probe each slot once -- the probe
  // that finds the key also finds the empty slot it goes to.
  constexpr size_t kBatch = 16;
  size_t added = 0;
  uint64_t hs[kBatch];
  for (size_t lo = 0; lo < k; lo += kBatch) {
    const size_t hi = std::min(k, lo + kBatch);
    if ((keys_.size() + (hi - lo)) * 2 > table_.size()) grow();  // no growth inside a batch
    for (size_t j = lo; j < hi; ++j) {
      hs[j - lo] = key_hash(load_key(keys + j * kKeyBytes));
      __builtin_prefetch(&table_[hs[j - lo] & mask_]);
    }
    for (size_t j = lo; j < hi; ++j) {
      const Key key = load_key(keys + j * kKeyBytes);
      const uint64_t h = hs[j - lo];
      const uint32_t tag = static_cast<uint32_t>(h >> 32);
      uint64_t pos = h & mask_;
      for (;; pos = (pos + 1) & mask_) {
        const uint64_t e = table_[pos];
        if (e == kEmpty) break;
        if (static_cast<uint32_t>(e >> 32) == tag && keys_[static_cast<uint32_t>(e)] == key) break;
      }
      if (table_[pos] != kEmpty) continue;  // held already
      table_[pos] = (h >> 32 << 32) | keys_.size();
      keys_.push_back(key);
      ++added;
    }
  }
  return added;
}

void KeySet::contains(const uint8_t* keys, size_t k, uint8_t* out) const {
  for (size_t j = 0; j < k; ++j) {
    const Key key = load_key(keys + j * kKeyBytes);
    out[j] = has(key, key_hash(key)) ? 1 : 0;
  }
}

size_t KeySet::count_absent_from(const KeySet& other) const {
  size_t n = 0;
  for (const Key& key : keys_)
    if (!other.has(key, key_hash(key))) ++n;
  return n;
}

void KeySet::grow() {
  std::vector<uint64_t> old(table_.size() * 2, kEmpty);
  old.swap(table_);
  mask_ = table_.size() - 1;
  for (uint64_t e : old) {
    if (e == kEmpty) continue;
    uint64_t pos = key_hash(keys_[static_cast<uint32_t>(e)]) & mask_;
    while (table_[pos] != kEmpty) pos = (pos + 1) & mask_;
    table_[pos] = e;
  }
}

}  // namespace saria
