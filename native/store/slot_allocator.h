// Free space of one SSD drive: which slots hold a block and where the next
// write goes.
//
// Invariants (checked by check(), tested in native/tests):
//  * free runs are disjoint, non-empty, coalesced (no two touch) and lie in
//    [0, n_slots); a slot is in a free run iff its allocated flag is 0;
//  * free_count() == the total length of the free runs.
// Allocation is next fit from a cursor: the drive is written as a log, front
// to back, then again from the front into the space freed since, so a batch
// becomes a few long sequential runs. Not thread-safe: the store holds its
// metadata lock around every call.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace saria_store {

class SlotAllocator {
 public:
  // `n_slots` slots, none free until rebuild() (which frees every slot
  // recovery did not mark); a drive that never opens stays like that.
  void reset(uint64_t n_slots);
  // Recovery: marks one slot as holding a record.
  void mark(uint32_t slot) { allocated_[slot] = 1; }
  // After the marks: every unmarked slot becomes free; the log continues at
  // `cursor` (the slot after the newest record).
  void rebuild(uint32_t cursor);
  // Takes up to `want` slots as runs appended to `runs` ((start, length),
  // merged with the last run when adjacent); returns how many it got.
  uint32_t take(uint32_t want, std::vector<std::pair<uint32_t, uint32_t>>* runs);
  // Returns [start, start + len) to the free space (all must be allocated).
  void give_back(uint32_t start, uint32_t len);

  bool allocated(uint32_t slot) const { return allocated_[slot] != 0; }
  uint64_t free_count() const { return free_count_; }
  uint64_t n_slots() const { return allocated_.size(); }
  uint32_t cursor() const { return cursor_; }
  // Throws std::logic_error naming the first broken invariant. O(slots).
  void check() const;

 private:
  std::map<uint32_t, uint32_t> free_runs_;  // start -> length
  uint64_t free_count_ = 0;
  uint32_t cursor_ = 0;
  std::vector<uint8_t> allocated_;          // 1 per slot
};

}  // namespace saria_store
