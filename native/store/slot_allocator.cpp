// Free space of one SSD drive; see slot_allocator.h.
#include "store/slot_allocator.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

namespace saria_store {

void SlotAllocator::reset(uint64_t n_slots) {
  allocated_.assign(n_slots, 0);
  free_runs_.clear();
  free_count_ = 0;
  cursor_ = 0;
}

void SlotAllocator::rebuild(uint32_t cursor) {
  free_runs_.clear();
  free_count_ = 0;
  const uint64_t n = allocated_.size();
  cursor_ = n ? static_cast<uint32_t>(cursor % n) : 0;
  uint64_t s = 0;
  while (s < n) {
    if (allocated_[s]) {
      ++s;
      continue;
    }
    uint64_t e = s;
    while (e < n && !allocated_[e]) ++e;
    free_runs_[static_cast<uint32_t>(s)] = static_cast<uint32_t>(e - s);
    free_count_ += e - s;
    s = e;
  }
}

uint32_t SlotAllocator::take(uint32_t want, std::vector<std::pair<uint32_t, uint32_t>>* runs) {
  uint32_t got = 0;
  const uint64_t n = allocated_.size();
  while (want > 0 && free_count_ > 0) {
    // The free run holding the cursor, else the next one, else the first.
    auto it = free_runs_.upper_bound(cursor_);
    if (it != free_runs_.begin()) {
      auto pv = std::prev(it);
      if (pv->first + pv->second > cursor_) it = pv;
    }
    if (it == free_runs_.end()) it = free_runs_.begin();
    uint32_t s = it->first, len = it->second;
    uint32_t from = (cursor_ > s && cursor_ < s + len) ? cursor_ : s;
    uint32_t take = std::min(want, s + len - from);
    free_runs_.erase(it);
    if (from > s) free_runs_[s] = from - s;
    if (from + take < s + len) free_runs_[from + take] = s + len - (from + take);
    if (!runs->empty() && runs->back().first + runs->back().second == from)
      runs->back().second += take;
    else
      runs->emplace_back(from, take);
    std::memset(&allocated_[from], 1, take);
    free_count_ -= take;
    want -= take;
    got += take;
    cursor_ = from + take;
    if (cursor_ >= n) cursor_ = 0;
  }
  return got;
}

void SlotAllocator::give_back(uint32_t start, uint32_t len) {
  if (len == 0) return;
  std::memset(&allocated_[start], 0, len);
  free_count_ += len;
  auto next = free_runs_.lower_bound(start);
  if (next != free_runs_.end() && next->first == start + len) {
    len += next->second;
    next = free_runs_.erase(next);
  }
  if (next != free_runs_.begin()) {
    auto pv = std::prev(next);
    if (pv->first + pv->second == start) {
      pv->second += len;
      return;
    }
  }
  free_runs_[start] = len;
}

void SlotAllocator::check() const {
  auto fail = [](const std::string& what) { throw std::logic_error("SlotAllocator: " + what); };
  const uint64_t n = allocated_.size();
  std::vector<uint8_t> in_run(n, 0);
  uint64_t total = 0;
  uint64_t prev_end = 0;
  bool first = true;
  for (auto& [s, len] : free_runs_) {
    if (len == 0) fail("empty free run at " + std::to_string(s));
    if (uint64_t{s} + len > n) fail("free run at " + std::to_string(s) + " ends past the drive");
    if (!first && s < prev_end) fail("free runs overlap at " + std::to_string(s));
    if (!first && s == prev_end) fail("free runs at " + std::to_string(s) + " not coalesced");
    for (uint64_t i = s; i < uint64_t{s} + len; ++i) in_run[i] = 1;
    total += len;
    prev_end = uint64_t{s} + len;
    first = false;
  }
  if (total != free_count_) fail("free_count " + std::to_string(free_count_) + " != runs " +
                                 std::to_string(total));
  for (uint64_t i = 0; i < n; ++i)
    if (in_run[i] == allocated_[i]) fail("slot " + std::to_string(i) + " flag disagrees with the runs");
}

}  // namespace saria_store
