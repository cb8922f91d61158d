// Implementation of the radix-tree index core; see radix_core.h for the
// invariants. Public operations first, helpers after.
#include "index/radix_core.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <new>

namespace saria {

namespace {

inline int lowest_tier(uint8_t mask) {
  for (int t = 0; t < kNumTiers; ++t)
    if (mask & (1u << t)) return t;
  return -1;
}

inline uint8_t bit(int l) { return static_cast<uint8_t>(1u << l); }

inline uint8_t child_mask(const Node& nd) {
  uint8_t m = 0;
  for (int t = 0; t < kNumTiers; ++t)
    if (nd.tier_children[t]) m |= bit(t);
  return m;
}

// What an eviction reports about a block: its key, slot and history.
EvictedBlock history_of(const Node& nd, uint32_t slot) {
  EvictedBlock e;
  e.key = nd.key;
  e.slot = slot;
  e.reuse = nd.reuse;
  e.hits = nd.hits;
  e.dram_evictions = nd.dram_evictions;
  e.session = nd.session;
  e.depth = nd.depth;
  e.tiers_after = nd.tiers;
  e.child_tiers = child_mask(nd);
  e.ckpt = nd.ckpt;
  e.last_access = nd.last_access;
  return e;
}

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

// The duplicate check of a list of keys without a set: each node found is
// flagged (Node::seen) and its index stored in idxs; the flags are cleared
// when the check goes out of scope, however the call ends.
template <class Nodes>
struct SeenMarks {
  const Nodes& nodes;
  std::vector<uint32_t>& idxs;
  size_t n = 0;
  // False when idx was listed earlier in this call.
  bool first(uint32_t idx) {
    if (nodes[idx].seen) return false;
    nodes[idx].seen = 1;
    idxs[n++] = idx;
    return true;
  }
  ~SeenMarks() {
    for (size_t i = 0; i < n; ++i) nodes[idxs[i]].seen = 0;
  }
};

// Position (after `from`) of the first key of keys[from..to) that repeats an
// earlier one of them, or `to`: an open-addressing table of positions.
size_t first_repeat(const uint8_t* keys, size_t from, size_t to) {
  size_t cap = 16;
  while (cap < 2 * (to - from)) cap *= 2;
  std::vector<uint32_t> table(cap, kNil);
  for (size_t i = from; i < to; ++i) {
    const Key key = load_key(keys + i * kKeyBytes);
    for (uint64_t pos = key_hash(key) & (cap - 1);; pos = (pos + 1) & (cap - 1)) {
      if (table[pos] == kNil) {
        table[pos] = static_cast<uint32_t>(i);
        break;
      }
      if (load_key(keys + table[pos] * kKeyBytes) == key) return i;
    }
  }
  return to;
}

}  // namespace

void* huge_alloc(size_t bytes, size_t align) {
  constexpr size_t kHuge = size_t{1} << 21;
  if (bytes >= kHuge) align = kHuge;
  if (align < alignof(std::max_align_t)) align = alignof(std::max_align_t);
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (bytes >= kHuge) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return p;
}

void huge_free(void* p) noexcept { std::free(p); }

RadixCore::RadixCore(uint64_t max_nodes, bool hybrid) : max_nodes_(max_nodes), hybrid_(hybrid) {
  for (int l = 0; l < kNumLists; ++l) head_[l] = tail_[l] = kNil;
  // Room for the whole budget up front: address space only (a page is backed
  // when a node is first written there), and the array never grows by
  // copying into fresh pages the kernel must zero first -- growth cost 8% of
  // a replay, nearly all of it zeroing the pages the copy landed on. Past the
  // budget (resident blocks keep it soft) the vector grows as usual.
  // Where the address space is refused (strict overcommit), it grows as before.
  try {
    nodes_.reserve(static_cast<size_t>(std::clamp<uint64_t>(max_nodes + 1, 1024, kReserveNodes)));
  } catch (const std::bad_alloc&) {
    nodes_.reserve(1024);
  }
  nodes_.push_back(Node{});
  Node& root = nodes_[kRoot];
  std::memset(&root, 0, sizeof(Node));
  root.parent = kNil;
  root.live = 1;
  table_.assign(1024, ~uint64_t{0});
  mask_ = table_.size() - 1;
}

// ---------------------------------------------------------------- queries

MatchResult RadixCore::match(const uint8_t* keys, size_t n, uint8_t* masks, uint32_t* slots,
                             uint8_t* ckpt_masks, uint8_t* fill) const {
  MatchResult r{0, 0, 0, -1, 0, -1, kNil};
  bool avail = true;
  bool baseline_run = true;
  const uint32_t m = walk(keys, n);
  for (size_t i = 0; i < m; ++i) {
    const Node& nd = nodes_[path_[i]];
    const uint8_t here = ready(nd);  // a filling copy is no copy for a reader
    masks[i] = here;
    int t = lowest_tier(here);
    slots[i] = t < 0 ? kNil : nd.slot[t];
    ckpt_masks[i] = ready_ckpt(nd);
    if (fill) fill[i] = static_cast<uint8_t>(nd.filling | (nd.ckpt_filling << 4));
    r.n_known = static_cast<uint32_t>(i + 1);
    if (avail && here) {
      r.n_avail = r.n_known;
    } else {
      avail = false;
    }
    if (i == 0) {
      r.first_tier = t;
      baseline_run = t >= 0;
    }
    if (baseline_run && r.first_tier >= 0 && (here & bit(r.first_tier))) {
      r.n_tier_by_tier = r.n_known;
    } else {
      baseline_run = false;
    }
  }
  if (!hybrid_) {
    r.n_usable = r.n_avail;
    return r;
  }
  for (uint32_t b = r.n_avail; b > 0; --b) {
    if (ckpt_masks[b - 1]) {
      r.n_usable = b;
      r.ckpt_tier = lowest_tier(ckpt_masks[b - 1]);
      r.ckpt_slot = ckpts_.at(path_[b - 1]).slot[r.ckpt_tier];
      break;
    }
  }
  return r;
}

uint32_t RadixCore::history(const uint8_t* keys, size_t n, uint32_t* reuse, uint32_t* hits,
                            uint32_t* dram_evictions, double* last_access, uint8_t* tiers,
                            uint8_t* ckpt, uint8_t* filling) const {
  uint32_t m = walk(keys, n);
  for (uint32_t i = 0; i < m; ++i) {
    const Node& nd = nodes_[path_[i]];
    reuse[i] = nd.reuse;
    hits[i] = nd.hits;
    dram_evictions[i] = nd.dram_evictions;
    last_access[i] = nd.last_access;
    tiers[i] = ready(nd);
    ckpt[i] = ready_ckpt(nd);
    if (filling) filling[i] = nd.filling;
  }
  return m;
}

uint32_t RadixCore::residency(const uint8_t* keys, size_t n, uint8_t* masks,
                              uint8_t* ckpt) const {
  uint32_t m = walk(keys, n);
  for (uint32_t i = 0; i < m; ++i) {
    const Node& nd = nodes_[path_[i]];
    masks[i] = nd.tiers;  // ready or filling: a slot is taken
    ckpt[i] = nd.ckpt;
  }
  return m;
}

MatchResult RadixCore::match_lock(const uint8_t* keys, size_t n, uint8_t* masks,
                                  uint32_t* slots, uint8_t* ckpt_masks, uint8_t* fill) {
  MatchResult r = match(keys, n, masks, slots, ckpt_masks, fill);
  // path_[0..n_known) are the matched nodes; n_usable <= n_known.
  for (uint32_t i = 0; i < r.n_usable; ++i)
    if (nodes_[path_[i]].lock == 0xFFFFFFFFu) bad("match: lock count overflow");
  for (uint32_t i = 0; i < r.n_usable; ++i) {
    if (i + 8 < r.n_usable) prefetch_node(path_[i + 8]);
    lock_node(path_[i]);
  }
  return r;
}

uint32_t RadixCore::slot_of(const uint8_t* key, int tier, bool ready_only) const {
  check_tier(tier);
  uint32_t idx = find_key(load_key(key));
  if (idx == kNil) return kNil;
  const Node& nd = nodes_[idx];
  if (!((ready_only ? ready(nd) : nd.tiers) & bit(tier))) return kNil;
  return nodes_[idx].slot[tier];
}

// -------------------------------------------------------------- mutations

uint32_t RadixCore::path_slots(const uint8_t* keys, size_t n, uint8_t tier_mask,
                               uint32_t* slots, int8_t* tiers) const {
  uint32_t m = walk(keys, n);
  for (uint32_t i = 0; i < m; ++i) {
    const Node& nd = nodes_[path_[i]];
    int t = lowest_tier(static_cast<uint8_t>(ready(nd) & tier_mask));
    tiers[i] = static_cast<int8_t>(t);
    slots[i] = t < 0 ? kNil : nd.slot[t];
  }
  return m;
}

bool RadixCore::path_to(const uint8_t* key, std::vector<uint8_t>* out) const {
  uint32_t idx = find_key(load_key(key));
  if (idx == kNil) return false;
  std::vector<uint32_t> chain;
  for (uint32_t i = idx; i != kRoot; i = nodes_[i].parent) chain.push_back(i);
  out->resize(chain.size() * kKeyBytes);
  for (size_t j = 0; j < chain.size(); ++j)
    std::memcpy(out->data() + j * kKeyBytes, nodes_[chain[chain.size() - 1 - j]].key.w, kKeyBytes);
  return true;
}

uint32_t RadixCore::ckpt_slot_of(const uint8_t* key, int tier, bool ready_only) const {
  check_tier(tier);
  uint32_t idx = find_key(load_key(key));
  if (idx == kNil) return kNil;
  const Node& nd = nodes_[idx];
  if (!((ready_only ? ready_ckpt(nd) : nd.ckpt) & bit(tier))) return kNil;
  return ckpts_.at(idx).slot[tier];
}

uint32_t RadixCore::touch(const uint8_t* keys, size_t n, uint32_t n_hit, uint32_t ckpt_at,
                          double now, const TouchHistory* out) {
  uint32_t m = walk(keys, n);
  const std::vector<uint32_t>& path = path_;
  if (n_hit > m) bad("touch: n_hit=" + std::to_string(n_hit) + " exceeds the " +
                     std::to_string(m) + " known blocks");
  if (ckpt_at > m) bad("touch: ckpt_at=" + std::to_string(ckpt_at) + " is past the known prefix");
  if (ckpt_at > 0 && nodes_[path[ckpt_at - 1]].ckpt == 0)
    bad("touch: no checkpoint at boundary " + std::to_string(ckpt_at));
  now = advance(now);
  // Deepest first, so that blocks touched together leave leaf-first.
  for (uint32_t i = m; i-- > 0;) {
    uint32_t idx = path[i];
    if (i >= 8) prefetch_node(path[i - 8]);
    Node& nd = nodes_[idx];
    if (out && out->previous_access) out->previous_access[i] = nd.last_access;
    nd.reuse += 1;
    if (i < n_hit) nd.hits += 1;
    nd.last_access = now;
    for (int t = 0; t < kNumTiers; ++t)
      if (ready(nd) & bit(t)) {
        nd.tier_time[t] = now;
        if (nd.lock == 0) refresh(idx, t, now);
      }
    if (nd.tiers == 0 && nd.ckpt == 0 && nd.lock == 0) refresh(idx, kGhost, now);
    if (out) {  // the history as it stands after this touch
      if (out->reuse) out->reuse[i] = nd.reuse;
      if (out->hits) out->hits[i] = nd.hits;
      if (out->dram_evictions) out->dram_evictions[i] = nd.dram_evictions;
      if (out->last_access) out->last_access[i] = nd.last_access;
      if (out->tiers) out->tiers[i] = ready(nd);
      if (out->ckpt) out->ckpt[i] = ready_ckpt(nd);
      if (out->filling) out->filling[i] = nd.filling;
    }
  }
  if (ckpt_at > 0) {
    uint32_t idx = path[ckpt_at - 1];
    Checkpoint& c = ckpts_.at(idx);
    for (int t = 0; t < kNumTiers; ++t)
      if (ready_ckpt(nodes_[idx]) & bit(t)) {
        ckpt_lru_[t].erase(c.seq[t]);
        c.seq[t] = ++seq_counter_;
        c.tier_time[t] = now;
        ckpt_lru_[t].emplace(c.seq[t], idx);
      }
  }
  return m;
}

uint32_t RadixCore::add(const uint8_t* keys, size_t n, int tier, const int64_t* where,
                        const uint32_t* slots, size_t k, uint32_t session, double now,
                        bool filling, bool lock_path) {
  check_tier(tier);
  if (k == 0) return 0;
  for (size_t j = 0; j < k; ++j) {
    if (where[j] < 0 || static_cast<size_t>(where[j]) >= n)
      bad("add: position " + std::to_string(where[j]) + " is outside the " + std::to_string(n) +
          " keys given");
    if (j > 0 && where[j] <= where[j - 1]) bad("add: positions must be strictly ascending");
    if (slots[j] == kNil) bad("add: slot handle 0xFFFFFFFF is reserved");
  }
  const size_t last = static_cast<size_t>(where[k - 1]) + 1;  // path length needed
  // The handle's nodes: walk() leaves exactly m of them for these keys when
  // m < last, so the created ones extend it in place.
  uint32_t m = walk(keys, last);
  std::vector<uint32_t>& path = path_;
  // Validate the part to be created: no key may already exist elsewhere
  // (a chained key names one prefix) and none may repeat.
  if (m < last) {
    const size_t repeat = first_repeat(keys, m, last);
    for (size_t i = m; i < last; ++i) {
      if (find_key(load_key(keys + i * kKeyBytes)) != kNil)
        bad("add: key at position " + std::to_string(i) +
            " is already indexed under a different prefix");
      if (i == repeat)
        bad("add: key at position " + std::to_string(i) + " repeats an earlier key of the path");
    }
  }
  for (size_t j = 0; j < k; ++j) {
    size_t p = static_cast<size_t>(where[j]);
    if (p < m && (nodes_[path[p]].tiers & bit(tier)))
      bad("add: block at position " + std::to_string(p) + " is already resident in tier " +
          std::to_string(tier));
  }
  now = advance(now);
  // Create missing nodes top-down (not yet linked anywhere).
  uint32_t created = 0;
  path.resize(m);
  for (size_t i = m; i < last; ++i) {
    uint32_t parent = i == 0 ? kRoot : path[i - 1];
    uint32_t idx = new_node(load_key(keys + i * kKeyBytes), parent, session, now);
    path.push_back(idx);
    nodes_[idx].depth = static_cast<uint32_t>(i);
    ++created;
  }
  // Residency and list order deepest first; created nodes that get no
  // residency become metadata-only ghosts.
  size_t j = k;
  for (size_t i = last; i-- > 0;) {
    if (i >= 8 && (j > 0 || i - 8 >= m)) prefetch_node(path[i - 8]);
    bool in_where = j > 0 && static_cast<size_t>(where[j - 1]) == i;
    if (in_where) {
      --j;
      set_tier(path[i], tier, slots[j], now, filling);
    } else if (i >= m) {
      refresh(path[i], kGhost, now);
    } else if (j == 0) {
      break;
    }
  }
  enforce_budget();
  if (lock_path) lock(keys, last);  // a path's interior has children: the budget kept it
  return created;
}

void RadixCore::add_existing(const uint8_t* keys, size_t k, int tier, const uint32_t* slots,
                             double now) {
  check_tier(tier);
  std::vector<uint32_t> idxs(k);
  {
    SeenMarks<decltype(nodes_)> marks{nodes_, idxs};
    for (size_t j = 0; j < k; ++j) {
      uint32_t idx = find_key(load_key(keys + j * kKeyBytes));
      if (idx == kNil) bad("add_existing: key " + std::to_string(j) + " is not in the index");
      if (nodes_[idx].tiers & bit(tier))
        bad("add_existing: key " + std::to_string(j) + " is already resident in tier " +
            std::to_string(tier));
      if (slots[j] == kNil) bad("add_existing: slot handle 0xFFFFFFFF is reserved");
      if (!marks.first(idx)) bad("add_existing: key " + std::to_string(j) + " is listed twice");
    }
  }
  now = advance(now);
  for (size_t j = 0; j < k; ++j) set_tier(idxs[j], tier, slots[j], now, false);
}

void RadixCore::set_ready(const uint8_t* keys, size_t k, int tier, double now) {
  check_tier(tier);
  std::vector<uint32_t> idxs = find_all(keys, k, "set_ready");
  for (size_t j = 0; j < k; ++j)
    if (!(nodes_[idxs[j]].filling & bit(tier)))
      bad("set_ready: key " + std::to_string(j) + " has no filling copy in tier " +
          std::to_string(tier));
  now = advance(now);
  for (size_t j = 0; j < k; ++j) {
    if (j + 8 < k) prefetch_node(idxs[j + 8]);
    uint32_t idx = idxs[j];
    Node& nd = nodes_[idx];
    nd.filling &= static_cast<uint8_t>(~bit(tier));
    nd.tier_time[tier] = now;
    if (nd.lock == 0) refresh(idx, tier, now);
  }
}

void RadixCore::remove(const uint8_t* keys, size_t k, int tier, uint32_t* out_slots, double now) {
  check_tier(tier);
  std::vector<uint32_t> idxs(k);
  {
    SeenMarks<decltype(nodes_)> marks{nodes_, idxs};
    for (size_t j = 0; j < k; ++j) {
      uint32_t idx = find_key(load_key(keys + j * kKeyBytes));
      if (idx == kNil) bad("remove: key " + std::to_string(j) + " is not in the index");
      if (!(nodes_[idx].tiers & bit(tier)))
        bad("remove: key " + std::to_string(j) + " is not resident in tier " + std::to_string(tier));
      if (!marks.first(idx)) bad("remove: key " + std::to_string(j) + " is listed twice");
    }
  }
  now = advance(now);
  for (size_t j = 0; j < k; ++j) {
    out_slots[j] = nodes_[idxs[j]].slot[tier];
    clear_tier(idxs[j], tier, now);
  }
  enforce_budget();
}

std::vector<EvictedBlock> RadixCore::evict(int tier, size_t count, double cutoff, double now) {
  check_tier(tier);
  now = advance(now);
  std::vector<EvictedBlock> out;
  out.reserve(std::min<size_t>(count, 4096));
  while (out.size() < count) {
    uint32_t h = head_[tier];
    if (h == kNil) break;
    Node& nd = nodes_[h];
    // The next candidate was fetched one victim ago: fetch the one after it
    // and the next one's parent (clear_tier updates it) now.
    if (uint32_t nx = nd.next[tier]; nx != kNil) {
      const Node& nn = nodes_[nx];
      if (nn.next[tier] != kNil) prefetch_node(nn.next[tier]);
      __builtin_prefetch(&nodes_[nn.parent].tier_children[0], 1);
    }
    if (nd.tier_time[tier] > cutoff) break;  // the list is time-ordered
    if (nd.tier_children[tier] > 0) {         // not a leaf in this tier: park
      unlink(h, tier);
      nd.parked |= bit(tier);
      continue;
    }
    if (tier == kDram) nd.dram_evictions += 1;
    uint32_t slot = nd.slot[tier];
    clear_tier(h, tier, now);
    out.push_back(history_of(nd, slot));
  }
  // No budget enforcement here: victims stay indexed until the next call that
  // creates or frees nodes, so the caller can still admit them elsewhere.
  return out;
}

std::vector<EvictedBlock> RadixCore::evict_pinned(int tier, size_t count, double cutoff,
                                                  double now, const uint8_t* pin, size_t n_pin,
                                                  bool unpin) {
  check_tier(tier);
  lock(pin, n_pin);  // validates before anything changes
  std::vector<EvictedBlock> out = evict(tier, count, cutoff, now);
  if (unpin) unlock(pin, n_pin, now);
  return out;
}

std::pair<uint32_t, uint32_t> RadixCore::place(const uint8_t* keys, size_t n, int tier,
                                                int64_t free, uint32_t session, double now) {
  check_tier(tier);
  if (hybrid_) bad("place: a hybrid index reports its victims' checkpoints: use evict and add");
  const uint32_t m = walk(keys, n);
  std::vector<int64_t> pos;
  pos.reserve(n);
  for (uint32_t i = 0; i < m; ++i)
    if (!(nodes_[path_[i]].tiers & bit(tier))) pos.push_back(i);
  for (size_t i = m; i < n; ++i) pos.push_back(static_cast<int64_t>(i));
  const int64_t want = static_cast<int64_t>(pos.size());
  if (want == 0) return {0, 0};
  int64_t room = want;
  uint32_t evicted = 0;
  if (free < want) {
    const double inf = std::numeric_limits<double>::infinity();
    const size_t count = static_cast<size_t>(want - std::max<int64_t>(free, 0));
    evicted = static_cast<uint32_t>(
        (m > 0 ? evict_pinned(tier, count, inf, now, keys, m, true) : evict(tier, count, inf, now))
            .size());
    room = std::max<int64_t>(0, std::min<int64_t>(want, free + evicted));
  }
  if (room > 0) {
    std::vector<uint32_t> slots(static_cast<size_t>(room), 0);
    add(keys, static_cast<size_t>(pos[room - 1]) + 1, tier, pos.data(), slots.data(),
        static_cast<size_t>(room), session, now);
  }
  return {static_cast<uint32_t>(room), evicted};
}

void RadixCore::lock(const uint8_t* keys, size_t n) {
  uint32_t m = walk(keys, n);
  if (m < n) bad("lock: block at position " + std::to_string(m) + " is not in the index");
  for (size_t i = 0; i < n; ++i)
    if (nodes_[path_[i]].lock == 0xFFFFFFFFu) bad("lock: lock count overflow");
  for (size_t i = 0; i < n; ++i) {
    if (i + 8 < n) prefetch_node(path_[i + 8]);
    lock_node(path_[i]);
  }
}

void RadixCore::unlock(const uint8_t* keys, size_t n, double now) {
  uint32_t m = walk(keys, n);
  if (m < n) bad("unlock: block at position " + std::to_string(m) + " is not in the index");
  for (size_t i = 0; i < n; ++i)
    if (nodes_[path_[i]].lock == 0)
      bad("unlock: block at position " + std::to_string(i) + " is not locked");
  now = advance(now);
  // Unlocking ends a use: the blocks re-enter their lists at the tail,
  // deepest first.
  for (size_t i = n; i-- > 0;) {
    if (i >= 8) prefetch_node(path_[i - 8]);
    unlock_node(path_[i], now);
  }
  enforce_budget();
}

void RadixCore::hold(const uint8_t* keys, size_t k) {
  std::vector<uint32_t> idxs = find_all(keys, k, "hold");
  for (uint32_t idx : idxs)
    if (nodes_[idx].lock == 0xFFFFFFFFu) bad("hold: lock count overflow");
  for (uint32_t idx : idxs) lock_node(idx);
}

void RadixCore::release(const uint8_t* keys, size_t k, double now, uint8_t* unlocked) {
  std::vector<uint32_t> idxs = find_all(keys, k, "release");
  for (size_t j = 0; j < k; ++j)
    if (nodes_[idxs[j]].lock == 0) bad("release: key " + std::to_string(j) + " is not locked");
  now = advance(now);
  for (size_t j = 0; j < k; ++j) unlocked[j] = unlock_node(idxs[j], now);
  enforce_budget();
}

// ------------------------------------------------------------ checkpoints

void RadixCore::ckpt_add(const uint8_t* key, int tier, uint32_t slot, double now,
                         bool filling) {
  check_tier(tier);
  if (!hybrid_) bad("checkpoints need an index created with hybrid=True");
  uint32_t idx = find_key(load_key(key));
  if (idx == kNil) bad("ckpt_add: block is not in the index");
  Node& nd = nodes_[idx];
  if (nd.ckpt & bit(tier)) bad("ckpt_add: checkpoint already resident in tier " + std::to_string(tier));
  if (slot == kNil) bad("ckpt_add: slot handle 0xFFFFFFFF is reserved");
  now = advance(now);
  if (nd.tiers == 0 && nd.ckpt == 0) {  // leaves the metadata-only state
    if (nd.linked & bit(kGhost)) unlink(idx, kGhost);
    nd.parked &= static_cast<uint8_t>(~bit(kGhost));
    --ghosts_;
  }
  nd.ckpt |= bit(tier);
  Checkpoint& c = ckpts_[idx];
  c.slot[tier] = slot;
  c.tier_time[tier] = now;
  c.seq[tier] = ++seq_counter_;
  if (filling) {
    nd.ckpt_filling |= bit(tier);  // not an eviction candidate until ready
  } else {
    ckpt_lru_[tier].emplace(c.seq[tier], idx);
  }
}

void RadixCore::ckpt_set_ready(const uint8_t* key, int tier, double now) {
  check_tier(tier);
  uint32_t idx = find_key(load_key(key));
  if (idx == kNil || !(nodes_[idx].ckpt_filling & bit(tier)))
    bad("ckpt_set_ready: no filling checkpoint for this block in tier " + std::to_string(tier));
  now = advance(now);
  Node& nd = nodes_[idx];
  nd.ckpt_filling &= static_cast<uint8_t>(~bit(tier));
  Checkpoint& c = ckpts_.at(idx);
  c.seq[tier] = ++seq_counter_;
  c.tier_time[tier] = now;
  ckpt_lru_[tier].emplace(c.seq[tier], idx);
}

uint32_t RadixCore::ckpt_remove(const uint8_t* key, int tier, double now) {
  check_tier(tier);
  uint32_t idx = find_key(load_key(key));
  if (idx == kNil || !(nodes_[idx].ckpt & bit(tier)))
    bad("ckpt_remove: no checkpoint for this block in tier " + std::to_string(tier));
  now = advance(now);
  Checkpoint& c = ckpts_.at(idx);
  uint32_t slot = c.slot[tier];
  Node& nd = nodes_[idx];
  if (!(nd.ckpt_filling & bit(tier))) ckpt_lru_[tier].erase(c.seq[tier]);
  nd.ckpt &= static_cast<uint8_t>(~bit(tier));
  nd.ckpt_filling &= static_cast<uint8_t>(~bit(tier));
  if (nd.ckpt == 0) ckpts_.erase(idx);
  if (nd.tiers == 0 && nd.ckpt == 0) {
    ++ghosts_;
    if (nd.lock == 0) refresh(idx, kGhost, now);
  }
  enforce_budget();
  return slot;
}

std::vector<EvictedBlock> RadixCore::ckpt_evict(int tier, size_t count, double cutoff, double now) {
  check_tier(tier);
  now = advance(now);
  std::vector<EvictedBlock> out;
  auto it = ckpt_lru_[tier].begin();
  while (out.size() < count && it != ckpt_lru_[tier].end()) {
    uint32_t idx = it->second;
    const Checkpoint& c = ckpts_.at(idx);
    if (c.tier_time[tier] > cutoff) break;
    if (nodes_[idx].lock > 0) {  // in use by a transfer
      ++it;
      continue;
    }
    ++it;  // ckpt_remove erases the current entry
    EvictedBlock e = history_of(nodes_[idx], kNil);
    uint8_t kb[kKeyBytes];
    std::memcpy(kb, e.key.w, kKeyBytes);
    e.slot = ckpt_remove(kb, tier, now);  // may drop the node (metadata budget)
    e.tiers_after = nodes_[idx].live ? nodes_[idx].ckpt : 0;
    e.ckpt = e.tiers_after;
    e.child_tiers = nodes_[idx].live ? child_mask(nodes_[idx]) : 0;
    out.push_back(e);
  }
  return out;
}

// ---------------------------------------------------------- introspection

size_t RadixCore::handles_bytes() const {
  size_t bytes = path_keys_.capacity() + path_.capacity() * sizeof(uint32_t);
  for (const SavedHandle& h : saved_) bytes += h.keys.capacity() + h.nodes.capacity() * sizeof(uint32_t);
  return bytes;
}

size_t RadixCore::memory_bytes() const {
  // Node slots ever used (live or on the free list): the reserved rest of the
  // array is address space that no page backs.
  return nodes_.size() * sizeof(Node) + free_.capacity() * sizeof(uint32_t) +
         table_.capacity() * sizeof(uint64_t) + handles_bytes() +
         ckpts_.size() * (sizeof(Checkpoint) + 48) +
         (ckpt_lru_[0].size() + ckpt_lru_[1].size() + ckpt_lru_[2].size()) * 48;
}

std::vector<uint32_t> RadixCore::live_nodes() const {
  std::vector<uint32_t> out;
  out.reserve(num_nodes_);
  for (uint32_t i = 1; i < nodes_.size(); ++i)
    if (nodes_[i].live) out.push_back(i);
  return out;
}

void RadixCore::check_invariants() const {
  auto fail = [](const std::string& m) { throw std::logic_error("index invariant broken: " + m); };
  std::vector<uint32_t> kids(nodes_.size(), 0);
  std::vector<uint32_t> tkids(nodes_.size() * kNumTiers, 0);
  size_t live = 0, res[kNumTiers] = {}, ghosts = 0;
  for (uint32_t i = 1; i < nodes_.size(); ++i) {
    const Node& nd = nodes_[i];
    if (!nd.live) continue;
    ++live;
    if (find_key(nd.key) != i) fail("node not found by its key");
    if (nd.parent >= nodes_.size() || !nodes_[nd.parent].live) fail("dangling parent");
    kids[nd.parent]++;
    for (int t = 0; t < kNumTiers; ++t)
      if (nd.tiers & bit(t)) {
        res[t]++;
        tkids[nd.parent * kNumTiers + t]++;
      }
    if (nd.tiers == 0 && nd.ckpt == 0) ghosts++;
    if ((nd.ckpt != 0) != (ckpts_.count(i) == 1)) fail("checkpoint table out of sync");
    if (nd.seen) fail("a duplicate-check flag left set after a call");
    if (nd.filling & ~nd.tiers) fail("a filling copy in a tier the block is not resident in");
    if (nd.ckpt_filling & ~nd.ckpt) fail("a filling checkpoint in a tier it is not resident in");
    for (int t = 0; t < kNumTiers; ++t)
      if (nd.ckpt & bit(t)) {
        auto it = ckpt_lru_[t].find(ckpts_.at(i).seq[t]);
        bool in_lru = it != ckpt_lru_[t].end() && it->second == i;
        if (in_lru == bool(nd.ckpt_filling & bit(t))) fail("checkpoint LRU membership wrong");
      }
    for (int l = 0; l < kNumLists; ++l) {
      bool want = wants_list(nd, l);
      bool linked = nd.linked & bit(l), parked = nd.parked & bit(l);
      if (linked && parked) fail("node both linked and parked");
      if (want != (linked || parked)) fail("list membership wrong for list " + std::to_string(l));
    }
  }
  if (live != num_nodes_) fail("node count");
  if (ghosts != ghosts_) fail("ghost count");
  for (int t = 0; t < kNumTiers; ++t)
    if (res[t] != resident_[t]) fail("resident count of tier " + std::to_string(t));
  for (uint32_t i = 1; i < nodes_.size(); ++i) {
    const Node& nd = nodes_[i];
    if (!nd.live) continue;
    if (nd.n_children != kids[i]) fail("child count");
    for (int t = 0; t < kNumTiers; ++t) {
      if (nd.tier_children[t] != tkids[i * kNumTiers + t]) fail("tier child count");
      if ((nd.parked & bit(t)) && nd.tier_children[t] == 0) fail("parked leaf in tier");
    }
    if ((nd.parked & bit(kGhost)) && nd.n_children == 0) fail("parked childless ghost");
  }
  for (int l = 0; l < kNumLists; ++l) {
    uint32_t prev = kNil;
    size_t count = 0;
    for (uint32_t c = head_[l]; c != kNil; c = nodes_[c].next[l]) {
      const Node& nd = nodes_[c];
      if (!(nd.linked & bit(l))) fail("unmarked node in list");
      if (nd.prev[l] != prev) fail("broken back link");
      if (prev != kNil) {
        if (nodes_[prev].seq[l] >= nd.seq[l]) fail("list not in seq order");
        if (l < kNumTiers && nodes_[prev].tier_time[l] > nd.tier_time[l]) fail("list not in time order");
      }
      prev = c;
      if (++count > nodes_.size()) fail("cycle in list");
    }
    if (tail_[l] != prev) fail("tail pointer");
  }
}

// ---------------------------------------------------------------- helpers

uint64_t RadixCore::hash_key(const Key& k) { return key_hash(k); }

uint64_t key_hash(const Key& k) {
  uint64_t h = k.w[0] * 0x9E3779B97F4A7C15ull;
  h ^= k.w[1] * 0xC2B2AE3D27D4EB4Full;
  h = (h ^ (h >> 31)) * 0x94D049BB133111EBull;
  h ^= k.w[2] * 0x165667B19E3779F9ull;
  h ^= k.w[3] * 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h;
}

// Table entries pack (hash tag << 32 | node index); ~0 is empty. The tag
// avoids touching a node's key on most probe mismatches.
uint32_t RadixCore::find_key(const Key& k) const { return find_hashed(k, hash_key(k)); }

uint32_t RadixCore::find_hashed(const Key& k, uint64_t h) const {
  uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (uint64_t pos = h & mask_;; pos = (pos + 1) & mask_) {
    uint64_t e = table_[pos];
    if (e == ~uint64_t{0}) return kNil;
    if (static_cast<uint32_t>(e >> 32) == tag) {
      uint32_t idx = static_cast<uint32_t>(e);
      if (nodes_[idx].key == k) return idx;
    }
  }
}

void RadixCore::table_insert(uint32_t idx) {
  if ((num_nodes_ + 1) * 2 > table_.size()) table_grow();
  uint64_t h = hash_key(nodes_[idx].key);
  uint64_t e = (h >> 32 << 32) | idx;
  uint64_t pos = h & mask_;
  while (table_[pos] != ~uint64_t{0}) pos = (pos + 1) & mask_;
  table_[pos] = e;
}

void RadixCore::table_erase(uint32_t idx) {
  uint64_t h = hash_key(nodes_[idx].key);
  uint64_t pos = h & mask_;
  while (static_cast<uint32_t>(table_[pos]) != idx || table_[pos] == ~uint64_t{0})
    pos = (pos + 1) & mask_;
  // Backward-shift deletion keeps probe chains intact without tombstones.
  table_[pos] = ~uint64_t{0};
  uint64_t j = pos;
  for (;;) {
    j = (j + 1) & mask_;
    uint64_t e = table_[j];
    if (e == ~uint64_t{0}) break;
    uint64_t home = hash_key(nodes_[static_cast<uint32_t>(e)].key) & mask_;
    bool between = pos <= j ? (home > pos && home <= j) : (home > pos || home <= j);
    if (!between) {
      table_[pos] = e;
      table_[j] = ~uint64_t{0};
      pos = j;
    }
  }
}

void RadixCore::table_grow() {
  std::vector<uint64_t, HugeAlloc<uint64_t>> old;
  old.swap(table_);
  table_.assign(old.size() * 2, ~uint64_t{0});
  mask_ = table_.size() - 1;
  for (uint64_t e : old) {
    if (e == ~uint64_t{0}) continue;
    uint64_t pos = hash_key(nodes_[static_cast<uint32_t>(e)].key) & mask_;
    while (table_[pos] != ~uint64_t{0}) pos = (pos + 1) & mask_;
    table_[pos] = e;
  }
}

uint32_t RadixCore::new_node(const Key& k, uint32_t parent, uint32_t session, double now) {
  uint32_t idx;
  if (!free_.empty()) {
    idx = free_.back();
    free_.pop_back();
  } else {
    if (nodes_.size() >= kNil - 1) throw std::length_error("index is full (2^32 nodes)");
    idx = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& nd = nodes_[idx];
  std::memset(&nd, 0, sizeof(Node));
  nd.key = k;
  nd.parent = parent;
  nd.session = session;
  nd.last_access = now;
  for (int t = 0; t < kNumTiers; ++t) nd.slot[t] = kNil;
  for (int l = 0; l < kNumLists; ++l) nd.prev[l] = nd.next[l] = kNil;
  nd.live = 1;
  nodes_[parent].n_children++;
  table_insert(idx);
  ++num_nodes_;
  ++ghosts_;  // holds nothing until set_tier
  return idx;
}

void RadixCore::drop_node(uint32_t idx) {
  Node& nd = nodes_[idx];
  if (nd.linked & bit(kGhost)) unlink(idx, kGhost);
  table_erase(idx);
  ++epoch_;  // the path handle may name this node: it is void now
  uint32_t p = nd.parent;
  nd.live = 0;
  --ghosts_;
  --num_nodes_;
  ++ghosts_dropped_;
  free_.push_back(idx);
  Node& pn = nodes_[p];
  pn.n_children--;
  if (p != kRoot && pn.n_children == 0 && (pn.parked & bit(kGhost))) {
    pn.parked &= static_cast<uint8_t>(~bit(kGhost));
    link_sorted(p, kGhost);
  }
}

bool RadixCore::wants_list(const Node& nd, int l) const {
  if (nd.lock > 0) return false;
  if (l < kNumTiers) return ready(nd) & bit(l);
  return nd.tiers == 0 && nd.ckpt == 0;
}

void RadixCore::link_tail(uint32_t idx, int l) {
  Node& nd = nodes_[idx];
  nd.prev[l] = tail_[l];
  nd.next[l] = kNil;
  if (tail_[l] != kNil) nodes_[tail_[l]].next[l] = idx; else head_[l] = idx;
  tail_[l] = idx;
  nd.linked |= bit(l);
}

// Puts a node back in seq order; only unparked nodes need this, and they are
// older than nearly everything in the list, so the walk from the head is short.
void RadixCore::link_sorted(uint32_t idx, int l) {
  Node& nd = nodes_[idx];
  uint32_t after = kNil;
  uint32_t c = head_[l];
  while (c != kNil && nodes_[c].seq[l] < nd.seq[l]) {
    after = c;
    c = nodes_[c].next[l];
  }
  nd.prev[l] = after;
  nd.next[l] = c;
  if (after != kNil) nodes_[after].next[l] = idx; else head_[l] = idx;
  if (c != kNil) nodes_[c].prev[l] = idx; else tail_[l] = idx;
  nd.linked |= bit(l);
}

void RadixCore::unlink(uint32_t idx, int l) {
  Node& nd = nodes_[idx];
  if (nd.prev[l] != kNil) nodes_[nd.prev[l]].next[l] = nd.next[l]; else head_[l] = nd.next[l];
  if (nd.next[l] != kNil) nodes_[nd.next[l]].prev[l] = nd.prev[l]; else tail_[l] = nd.prev[l];
  nd.prev[l] = nd.next[l] = kNil;
  nd.linked &= static_cast<uint8_t>(~bit(l));
}

void RadixCore::refresh(uint32_t idx, int l, double /*now*/) {
  Node& nd = nodes_[idx];
  if (nd.linked & bit(l)) unlink(idx, l);
  nd.parked &= static_cast<uint8_t>(~bit(l));
  nd.seq[l] = ++seq_counter_;
  link_tail(idx, l);
}

void RadixCore::set_tier(uint32_t idx, int tier, uint32_t slot, double now, bool filling) {
  Node& nd = nodes_[idx];
  if (nd.tiers == 0 && nd.ckpt == 0) {  // leaves the metadata-only state
    if (nd.linked & bit(kGhost)) unlink(idx, kGhost);
    nd.parked &= static_cast<uint8_t>(~bit(kGhost));
    --ghosts_;
  }
  nd.tiers |= bit(tier);
  nd.slot[tier] = slot;
  nd.tier_time[tier] = now;
  ++resident_[tier];
  if (nd.parent != kRoot) nodes_[nd.parent].tier_children[tier]++;
  if (filling) {
    nd.filling |= bit(tier);  // joins the tier's list when set_ready
  } else if (nd.lock == 0) {
    refresh(idx, tier, now);
  }
}

void RadixCore::clear_tier(uint32_t idx, int tier, double now) {
  Node& nd = nodes_[idx];
  if (nd.linked & bit(tier)) unlink(idx, tier);
  nd.parked &= static_cast<uint8_t>(~bit(tier));
  nd.tiers &= static_cast<uint8_t>(~bit(tier));
  nd.filling &= static_cast<uint8_t>(~bit(tier));
  nd.slot[tier] = kNil;
  --resident_[tier];
  child_left_tier(nd.parent, tier);
  if (nd.tiers == 0 && nd.ckpt == 0) {
    ++ghosts_;
    if (nd.lock == 0) refresh(idx, kGhost, now);
  }
}

void RadixCore::child_left_tier(uint32_t parent, int tier) {
  if (parent == kRoot) return;
  Node& pn = nodes_[parent];
  if (--pn.tier_children[tier] == 0 && (pn.parked & bit(tier))) {
    pn.parked &= static_cast<uint8_t>(~bit(tier));
    link_sorted(parent, tier);
  }
}

void RadixCore::enforce_budget() {
  while (num_nodes_ > max_nodes_) {
    uint32_t h = head_[kGhost];
    if (h == kNil) break;  // only resident (or locked) nodes left: soft bound
    Node& nd = nodes_[h];
    if (nd.n_children > 0) {
      unlink(h, kGhost);
      nd.parked |= bit(kGhost);
      continue;
    }
    drop_node(h);
  }
}

void RadixCore::lock_node(uint32_t idx) {
  Node& nd = nodes_[idx];
  if (nd.lock++ == 0) {
    for (int l = 0; l < kNumLists; ++l) {
      if (nd.linked & bit(l)) unlink(idx, l);
      nd.parked &= static_cast<uint8_t>(~bit(l));
    }
  }
}

bool RadixCore::unlock_node(uint32_t idx, double now) {
  Node& nd = nodes_[idx];
  if (--nd.lock > 0) return false;
  for (int t = 0; t < kNumTiers; ++t)
    if (ready(nd) & bit(t)) {
      nd.tier_time[t] = now;
      refresh(idx, t, now);
    }
  if (nd.tiers == 0 && nd.ckpt == 0) refresh(idx, kGhost, now);
  return true;
}

// The nodes of k independent keys, all indexed and none repeated (else an
// error naming `what` and the key's position).
std::vector<uint32_t> RadixCore::find_all(const uint8_t* keys, size_t k, const char* what) const {
  std::vector<uint32_t> idxs(k);
  {
    SeenMarks<decltype(nodes_)> marks{nodes_, idxs};
    for (size_t j = 0; j < k; ++j) {
      uint32_t idx = find_key(load_key(keys + j * kKeyBytes));
      if (idx == kNil) bad(std::string(what) + ": key " + std::to_string(j) + " is not in the index");
      if (!marks.first(idx))
        bad(std::string(what) + ": key " + std::to_string(j) + " is listed twice");
    }
  }
  return idxs;
}

namespace {

// How many leading 32-byte keys of a and b (k keys each) are equal.
size_t common_keys(const uint8_t* a, const uint8_t* b, size_t k) {
  constexpr size_t kChunk = 16;  // keys per memcmp
  size_t i = 0;
  while (i + kChunk <= k && std::memcmp(a + i * kKeyBytes, b + i * kKeyBytes, kChunk * kKeyBytes) == 0)
    i += kChunk;
  while (i < k && std::memcmp(a + i * kKeyBytes, b + i * kKeyBytes, kKeyBytes) == 0) ++i;
  return i;
}

}  // namespace

uint32_t RadixCore::walk(const uint8_t* keys, size_t n) const {
  const size_t held = path_keys_.size() / kKeyBytes;
  size_t same = common_keys(keys, path_keys_.data(), std::min(n, held));
  if (same < n && same < held) {  // leaves the current handle: a saved one may share more
    ++departures_;
    int best = -1, lru = 0;
    for (int s = 0; s < kSavedHandles; ++s) {
      const SavedHandle& h = saved_[s];
      if (h.used < saved_[lru].used) lru = s;
      const size_t lim = std::min(n, h.keys.size() / kKeyBytes);
      // Sharing more than `same` keys needs key `same` to be equal first.
      if (lim <= same || std::memcmp(keys + same * kKeyBytes, h.keys.data() + same * kKeyBytes,
                                     kKeyBytes) != 0)
        continue;
      const size_t c = common_keys(keys, h.keys.data(), lim);
      if (c > same) {
        best = s;
        same = c;
      }
    }
    SavedHandle& h = saved_[best >= 0 ? best : lru];
    std::swap(h.keys, path_keys_);
    std::swap(h.nodes, path_);
    std::swap(h.epoch, path_epoch_);
    h.used = departures_;
    if (best < 0) {  // no saved one shares more: the current one's shared prefix goes on
      path_keys_.assign(h.keys.begin(), h.keys.begin() + same * kKeyBytes);
      path_.assign(h.nodes.begin(), h.nodes.begin() + std::min(same, h.nodes.size()));
      path_epoch_ = h.epoch;
    }
  }
  if (path_epoch_ != epoch_) {  // a node left the tree since: nothing of the handle holds
    path_.clear();
    path_epoch_ = epoch_;
  }
  if (same < n) {  // the handle follows these keys from here on
    path_keys_.resize(n * kKeyBytes);
    std::memcpy(path_keys_.data() + same * kKeyBytes, keys + same * kKeyBytes,
                (n - same) * kKeyBytes);
    if (path_.size() > same) path_.resize(same);
  }
  size_t i = path_.size();
  if (i >= n) return static_cast<uint32_t>(n);
  // Probe past the verified prefix, the table slot of key i + kAhead and the
  // node named at key i + kAhead / 2 fetched ahead (the keys are known, only
  // the stop is sequential).
  constexpr size_t kAhead = 8, kRing = 16;
  uint64_t hashes[kRing];
  for (size_t j = i; j < std::min(n, i + kAhead); ++j) {
    hashes[j % kRing] = hash_key(load_key(keys + j * kKeyBytes));
    __builtin_prefetch(&table_[hashes[j % kRing] & mask_]);
  }
  uint32_t prev = i == 0 ? kRoot : path_[i - 1];
  for (; i < n; ++i) {
    if (i + kAhead < n) {
      uint64_t h = hash_key(load_key(keys + (i + kAhead) * kKeyBytes));
      hashes[(i + kAhead) % kRing] = h;
      __builtin_prefetch(&table_[h & mask_]);
    }
    if (i + kAhead / 2 < n) {
      uint64_t e = table_[hashes[(i + kAhead / 2) % kRing] & mask_];
      if (e != ~uint64_t{0}) __builtin_prefetch(&nodes_[static_cast<uint32_t>(e)]);
    }
    uint32_t idx = find_hashed(load_key(keys + i * kKeyBytes), hashes[i % kRing]);
    if (idx == kNil || nodes_[idx].parent != prev) break;
    path_.push_back(idx);
    prev = idx;
  }
  return static_cast<uint32_t>(i);
}

void RadixCore::prefetch_node(uint32_t idx) const {
  const char* p = reinterpret_cast<const char*>(&nodes_[idx]);
  __builtin_prefetch(p, 1);
  __builtin_prefetch(p + 64, 1);
  __builtin_prefetch(p + 128, 1);
}

void RadixCore::check_tier(int tier) const {
  if (tier < 0 || tier >= kNumTiers)
    bad("unknown tier " + std::to_string(tier) + " (valid: 0=GPU, 1=DRAM, 2=SSD)");
}

}  // namespace saria
