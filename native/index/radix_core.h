// The unified radix-tree index core: one node per cached prefix block.
//
// Block keys are chained hashes (a key names the whole prefix up to its
// block), so the tree over block keys is a trie whose edges are blocks: a
// node's parent is the node of the previous block of the same prefix. Nodes
// are addressed by their 32-byte key through an open-addressing hash table and
// hold, per block: residency in each tier (GPU, DRAM, SSD, REMOTE: the
// cluster's store, as far as this node knows) with a slot handle per tier
// (REMOTE copies are addressed by key; their slot is the caller's), the block's history (reuse count, hit count, DRAM evictions, last
// access time, creating session) and links into intrusive recency lists.
//
// Invariants (checked by tests against a brute-force Python model):
//  * every node except the root sentinel is in the hash table exactly once;
//    node.parent is the node of the previous block (kRoot for block 0);
//  * tier_children[t] == number of children resident in tier t;
//    n_children == number of children;
//  * a copy in tier t is either *ready* (its bytes are in place: readers may
//    use it) or *filling* (a slot is taken, the bytes are on their way):
//    filling is a subset of tiers, ckpt_filling of ckpt. Every query that
//    answers a reader (match, history, path_slots, slot_of / ckpt_slot_of
//    with ready) reports ready copies only; the residency masks that say
//    which slots are taken (match's fill masks, dump) include filling ones;
//  * a node is linked in tier list t iff it is resident and ready in t,
//    unlocked and not parked in t -- a filling copy is never an eviction
//    victim; it is linked in the ghost list iff it holds nothing in any
//    tier (no KV, no checkpoint, ready or filling), is unlocked and not
//    parked there; a checkpoint is in its tier's LRU iff it is ready there;
//  * every list is sorted by its seq (ascending from head), and within a tier
//    list tier_time is non-decreasing too (the clock never goes backwards:
//    now = max(now, last_now));
//  * a node is "parked" in a list when a scan found it at the head but it was
//    not a leaf for that list (it had a child resident in the tier, or any
//    child for the ghost list); it is put back, in seq order, as soon as its
//    last such child leaves, or at the tail when touched.
//
// Eviction order, stated without lists (this is what the reference model
// implements): in tier t, among nodes resident in t, unlocked, with no child
// resident in t and with tier_time[t] <= cutoff, evict the one with the
// smallest seq[t]. seq[t] is assigned from a global counter when a node is
// touched, gains residency in t, or is unlocked; a path is touched deepest
// block first, so blocks touched together are evicted leaf-first (the vLLM
// "free in reverse order" rule, which the tree makes structural).
//
// Walks and the path handle. Every verb that takes a request's keys as a
// path (match, history, path_slots, touch, add, place, lock, unlock) finds its nodes
// through walk(), which keeps the last path walked: its keys and their
// matched nodes. A walk of keys that share a prefix with that path reuses the
// nodes of the shared prefix (the keys are compared byte for byte, and the
// handle is dropped whenever a node leaves the tree: epoch_) and probes the
// key table only past it. The verbs of one request all walk prefixes of its
// keys, so together they cost one walk; every answer is a fresh walk's by
// construction (a live node's key and parent never change). A few earlier
// handles are saved too (saved_): a request of a session whose earlier turn
// was walked a few requests ago walks only past that turn's path. Because queries
// update the handle, no call -- not even a query -- may run concurrently
// with another on one core (the Python facade holds a lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace saria {

constexpr int kNumTiers = 4;          // 0 = GPU, 1 = DRAM, 2 = SSD, 3 = REMOTE (the cluster)
constexpr int kGhost = kNumTiers;     // list index of the metadata-only LRU
constexpr int kNumLists = kNumTiers + 1;
constexpr uint32_t kNil = 0xFFFFFFFFu;
constexpr uint32_t kRoot = 0;         // sentinel node: the empty prefix
constexpr int kDram = 1;
constexpr size_t kKeyBytes = 32;
// The node array reserves room for the budget up to this many nodes (4 GiB
// of address space; see the constructor).
constexpr uint64_t kReserveNodes = uint64_t{1} << 24;

struct Key {
  uint64_t w[4];
  bool operator==(const Key& o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3];
  }
};

inline Key load_key(const uint8_t* p) {
  Key k;
  std::memcpy(k.w, p, kKeyBytes);
  return k;
}

// The key table's hash of a block key (also the replay's KeySet's).
uint64_t key_hash(const Key& k);

// One node per block, 256 B in four cache lines (192 B before the fourth
// tier, REMOTE). The first line holds what a walk, a match and a lock read
// (key, parent, slots, lock, masks), so a lookup touches one line per block;
// history and the recency links follow.
struct alignas(64) Node {
  Key key;
  uint32_t parent;
  uint32_t slot[kNumTiers];
  uint32_t lock;
  uint8_t tiers;     // KV residency mask (bit t): a slot is taken in tier t
  uint8_t ckpt;      // checkpoint residency mask (bit t)
  uint8_t filling;   // bit t: the copy in tier t is filling, not ready (subset of tiers)
  uint8_t ckpt_filling;  // the same for the checkpoint (subset of ckpt)
  uint8_t linked;    // bit l: linked in list l
  uint8_t parked;    // bit l: parked out of list l
  uint8_t live;      // slot in use
  mutable uint8_t seen;  // listed in the call running now (its duplicate check); 0 between calls
  uint32_t n_children;
  // --- second line (from n_children)
  uint32_t tier_children[kNumTiers];
  uint32_t prev[kNumLists];
  uint32_t next[kNumLists];
  uint32_t reuse;           // requests after the first that referenced it
  uint32_t hits;            // requests served this block from a tier
  uint32_t dram_evictions;  // times evicted from DRAM
  uint32_t session;         // creating session
  uint32_t depth;           // block index in its prefix (0 = first block)
  // --- third and fourth lines
  double last_access;       // last real access (history)
  double tier_time[kNumTiers];  // last touch or entry per tier (recency)
  uint64_t seq[kNumLists];
};
static_assert(sizeof(Node) == 256, "Node is four cache lines");
static_assert(offsetof(Node, n_children) == 64, "what a walk reads fits the first line");

// Memory for the node array and the key table: 2 MiB-aligned and advised as
// transparent huge pages when large, so the random accesses of a walk cost a
// cache miss and not a page-table walk too (machines here run THP in
// madvise mode: without the advice every access to a 700 MB node array is
// a TLB miss).
void* huge_alloc(size_t bytes, size_t align);
void huge_free(void* p) noexcept;

template <class T>
struct HugeAlloc {
  using value_type = T;
  HugeAlloc() = default;
  template <class U>
  HugeAlloc(const HugeAlloc<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(huge_alloc(n * sizeof(T), alignof(T))); }
  void deallocate(T* p, size_t) noexcept { huge_free(p); }
  template <class U>
  bool operator==(const HugeAlloc<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugeAlloc<U>&) const { return false; }
};

// A hybrid model's recurrent-state checkpoint at the boundary after a block.
// Checkpoints are sparse (one per request, not per block), so they live in a
// side table, keyed by node; they share the block's history.
struct Checkpoint {
  uint32_t slot[kNumTiers];
  double tier_time[kNumTiers];
  uint64_t seq[kNumTiers];
};

struct MatchResult {
  uint32_t n_known;         // leading blocks present in the tree (any state)
  uint32_t n_avail;         // leading blocks available in some tier
  uint32_t n_tier_by_tier;  // baseline: run of the first tier holding block 0
  int32_t first_tier;       // that tier, or -1
  uint32_t n_usable;        // hybrid: deepest checkpointed boundary <= n_avail
  int32_t ckpt_tier;        // tier of the checkpoint at n_usable, or -1
  uint32_t ckpt_slot;
};

// Where touch() writes the history of the blocks it touched, as it stands
// after the touch (what early persistence reads), plus each block's last
// access before it (how long it sat idle). Null pointers are skipped.
struct TouchHistory {
  uint32_t* reuse = nullptr;
  uint32_t* hits = nullptr;
  uint32_t* dram_evictions = nullptr;
  double* last_access = nullptr;      // after the touch (= now)
  double* previous_access = nullptr;  // before the touch
  uint8_t* tiers = nullptr;           // ready KV copies
  uint8_t* ckpt = nullptr;            // ready checkpoints
  uint8_t* filling = nullptr;         // filling KV copies
};

struct EvictedBlock {
  Key key;
  uint32_t slot;
  uint32_t reuse, hits, dram_evictions, session, depth;
  uint8_t tiers_after;
  uint8_t child_tiers;  // bit t: some child is resident in tier t
  uint8_t ckpt;         // checkpoint residency mask of the block (after the call)
  double last_access;
};

class RadixCore {
 public:
  explicit RadixCore(uint64_t max_nodes, bool hybrid);

  // --- queries -----------------------------------------------------------
  // Walks keys[0..n) from the root. masks/slots/ckpt_masks are filled for the
  // first n_known blocks with *ready* copies only (slots: the slot of the
  // preferred tier, kNil if none; preferred = lowest tier index holding a
  // ready copy); fill (may be null) gets the filling masks, KV in the low
  // nibble and the checkpoint's in the high one. Availability, the tier-by-
  // tier baseline and usable checkpoints count ready copies only.
  MatchResult match(const uint8_t* keys, size_t n, uint8_t* masks,
                    uint32_t* slots, uint8_t* ckpt_masks, uint8_t* fill = nullptr) const;
  // History of the known prefix of keys[0..n): per block reuse, hits, DRAM
  // evictions, last access, and the masks of its ready KV and checkpoint
  // copies (and of its filling KV copies, when `filling` is given); returns
  // how many blocks are known.
  uint32_t history(const uint8_t* keys, size_t n, uint32_t* reuse, uint32_t* hits,
                   uint32_t* dram_evictions, double* last_access, uint8_t* tiers,
                   uint8_t* ckpt, uint8_t* filling = nullptr) const;
  // Which tiers hold a slot (ready or filling) for each block of the known
  // prefix of keys[0..n): KV masks and checkpoint masks; returns how many
  // blocks are known.
  uint32_t residency(const uint8_t* keys, size_t n, uint8_t* masks, uint8_t* ckpt) const;
  // Slot of one block in one tier, or kNil (with ready, kNil for a filling copy).
  uint32_t slot_of(const uint8_t* key, int tier, bool ready) const;
  // For each block of the known prefix of keys[0..n): the slot in the
  // fastest tier of `tier_mask` holding a ready copy and that tier, or kNil
  // and -1 when no tier of the mask does. Returns how many blocks are known.
  uint32_t path_slots(const uint8_t* keys, size_t n, uint8_t tier_mask, uint32_t* slots,
                      int8_t* tiers) const;
  // The keys of the path from the root to block `key` (block 0 first),
  // appended to `out` (32 bytes each); false if the block is unknown.
  bool path_to(const uint8_t* key, std::vector<uint8_t>* out) const;
  // Slot of the checkpoint after block `key` in `tier`, or kNil (with ready,
  // kNil for a filling one).
  uint32_t ckpt_slot_of(const uint8_t* key, int tier, bool ready) const;

  // --- mutations (all validate first and change nothing on error) -------
  // Records an access by a new request to the known prefix of keys[0..n):
  // reuse += 1 for each, hits += 1 for the first n_hit, last_access = now,
  // recency refreshed in every list (deepest first). If ckpt_at > 0 the
  // checkpoint at that boundary is refreshed too. Returns blocks touched.
  // With `out`, the touched blocks' history is written there (see
  // TouchHistory): one walk for a touch and the history that follows it.
  uint32_t touch(const uint8_t* keys, size_t n, uint32_t n_hit, uint32_t ckpt_at,
                 double now, const TouchHistory* out = nullptr);
  // match() that also locks the usable prefix it answers (n_usable blocks),
  // as lock() on those keys would: a lookup that pins what it found.
  MatchResult match_lock(const uint8_t* keys, size_t n, uint8_t* masks, uint32_t* slots,
                         uint8_t* ckpt_masks, uint8_t* fill);
  // Gives the blocks at `where` (ascending positions in [0, n)) residency in
  // `tier` with the given slots. Missing nodes on the path keys[0..max+1) are
  // created (as metadata-only ghosts when not in `where`), with `session` as
  // creator. Error if a block already holds `tier` or a key sits under a
  // different parent. With `filling` the new copies are filling (see
  // set_ready). With `lock` the path keys[0..max+1) is then locked, as
  // lock() would (a store that pins what it placed). Returns the number of
  // nodes created.
  uint32_t add(const uint8_t* keys, size_t n, int tier, const int64_t* where,
               const uint32_t* slots, size_t k, uint32_t session, double now,
               bool filling = false, bool lock = false);
  // The filling copies in `tier` of the listed blocks (any order, no
  // repeats) become ready: readers see them and they join the tier's LRU
  // (tier_time = now). Error if a block is unknown or its copy there is not
  // filling.
  void set_ready(const uint8_t* keys, size_t k, int tier, double now);
  // Gives already-indexed blocks (any order, no repeats) residency in `tier`
  // with the given slots, e.g. DRAM victims admitted to the SSD. Error if a
  // block is unknown or already holds `tier`.
  void add_existing(const uint8_t* keys, size_t k, int tier, const uint32_t* slots, double now);
  // Drops `tier` residency of the listed blocks (any order); returns slots.
  void remove(const uint8_t* keys, size_t k, int tier, uint32_t* out_slots,
              double now);
  // Pops up to `count` eviction victims of `tier` (see the header comment);
  // a DRAM victim's dram_evictions is incremented before it is reported.
  // Victims that became metadata-only are not dropped by this call (the
  // budget is enforced by the next add/remove/unlock), so the caller can
  // still give them residency elsewhere (add_existing).
  std::vector<EvictedBlock> evict(int tier, size_t count, double cutoff, double now);
  // Pinned eviction: lock(pin) (every block of it must be indexed), then
  // evict(), then with `unpin` unlock(pin, now) -- exactly those three calls
  // in one (without `unpin` the caller unlocks the pin later).
  std::vector<EvictedBlock> evict_pinned(int tier, size_t count, double cutoff, double now,
                                         const uint8_t* pin, size_t n_pin, bool unpin);
  // A slotless tier's placement in one call (the replay's GPU prefix cache;
  // not for hybrid indexes, whose victims' checkpoints the caller frees):
  // every block of keys[0..n) holding no slot in `tier` becomes resident
  // there with slot 0, the shallowest first, as far as `free` units plus
  // the victims this call evicts allow. Exactly: with `want` such blocks
  // and free < want, evict_pinned(tier, want - free, no cutoff, now, the
  // known prefix, unpin) (plain evict when nothing is known), then add() of
  // the first min(want, free + victims) of those positions. Returns (blocks
  // added, victims).
  std::pair<uint32_t, uint32_t> place(const uint8_t* keys, size_t n, int tier, int64_t free,
                                      uint32_t session, double now);
  // Counts eviction candidates in `tier` with tier_time <= cutoff, up to
  // `limit`, without changing anything (leaf status not checked: an upper
  // bound used to size promotion).
  size_t count_evictable(int tier, double cutoff, size_t limit) const;
  void lock(const uint8_t* keys, size_t n);
  void unlock(const uint8_t* keys, size_t n, double now);
  // Locks of independent blocks (any order, no repeats; all indexed), e.g.
  // blocks an SSD write reads from DRAM: hold takes one lock on each,
  // release drops one and sets unlocked[j] when block j has none left
  // (release counts as a use, as unlock does).
  void hold(const uint8_t* keys, size_t k);
  void release(const uint8_t* keys, size_t k, double now, uint8_t* unlocked);

  // --- checkpoints (hybrid models) --------------------------------------
  void ckpt_add(const uint8_t* key, int tier, uint32_t slot, double now, bool filling = false);
  void ckpt_set_ready(const uint8_t* key, int tier, double now);
  uint32_t ckpt_remove(const uint8_t* key, int tier, double now);
  std::vector<EvictedBlock> ckpt_evict(int tier, size_t count, double cutoff, double now);

  // --- introspection ------------------------------------------------------
  size_t num_nodes() const { return num_nodes_; }
  size_t num_resident(int tier) const { return resident_[tier]; }
  size_t num_ghosts() const { return ghosts_; }
  size_t num_checkpoints() const { return ckpts_.size(); }
  uint64_t max_nodes() const { return max_nodes_; }
  uint64_t ghosts_dropped() const { return ghosts_dropped_; }
  size_t memory_bytes() const;
  static constexpr size_t node_bytes() { return sizeof(Node); }
  double last_now() const { return last_now_; }
  // All live nodes in index order (for tests, dumps and notebooks).
  std::vector<uint32_t> live_nodes() const;
  const Node& node(uint32_t i) const { return nodes_[i]; }
  const Checkpoint* checkpoint(uint32_t i) const {
    auto it = ckpts_.find(i);
    return it == ckpts_.end() ? nullptr : &it->second;
  }
  uint32_t find(const uint8_t* key) const { return find_key(load_key(key)); }
  // Verifies every invariant above; throws std::logic_error naming the first
  // broken one. O(nodes); for tests.
  void check_invariants() const;

 private:
  // hash table
  static uint64_t hash_key(const Key& k);
  uint32_t find_key(const Key& k) const;
  uint32_t find_hashed(const Key& k, uint64_t hash) const;
  void table_insert(uint32_t idx);
  void table_erase(uint32_t idx);
  void table_grow();
  // nodes
  uint32_t new_node(const Key& k, uint32_t parent, uint32_t session, double now);
  void drop_node(uint32_t idx);
  // lists
  bool wants_list(const Node& nd, int l) const;
  void link_tail(uint32_t idx, int l);
  void link_sorted(uint32_t idx, int l);
  void unlink(uint32_t idx, int l);
  void refresh(uint32_t idx, int l, double now);  // new seq, to tail
  void set_tier(uint32_t idx, int tier, uint32_t slot, double now, bool filling);
  void clear_tier(uint32_t idx, int tier, double now);
  void child_left_tier(uint32_t parent, int tier);
  void enforce_budget();
  void lock_node(uint32_t idx);
  bool unlock_node(uint32_t idx, double now);  // true when no lock is left
  std::vector<uint32_t> find_all(const uint8_t* keys, size_t k, const char* what) const;
  static uint8_t ready(const Node& nd) { return static_cast<uint8_t>(nd.tiers & ~nd.filling); }
  static uint8_t ready_ckpt(const Node& nd) {
    return static_cast<uint8_t>(nd.ckpt & ~nd.ckpt_filling);
  }
  // The known prefix of keys[0..n): returns its length m; its nodes are
  // path_[0..m) (valid until the next walk or the next node drop).
  uint32_t walk(const uint8_t* keys, size_t n) const;
  size_t handles_bytes() const;  // the current and the saved handles' memory
  void prefetch_node(uint32_t idx) const;
  double advance(double now) {
    if (now > last_now_) last_now_ = now;
    return last_now_;
  }
  void check_tier(int tier) const;

  std::vector<Node, HugeAlloc<Node>> nodes_;
  std::vector<uint32_t> free_;
  std::vector<uint64_t, HugeAlloc<uint64_t>> table_;
  uint64_t epoch_ = 0;  // nodes dropped so far: a path handle of another epoch is void
  // The path handle (see the header comment): the keys of the last walk,
  // the nodes of a verified prefix of them, and the epoch they belong to.
  mutable std::vector<uint8_t> path_keys_;
  mutable std::vector<uint32_t> path_;
  mutable uint64_t path_epoch_ = 0;
  // Earlier handles, so that a request whose prefix a recent other request
  // walked (a session's earlier turn, with other sessions' requests in
  // between) walks only past it: a walk that leaves the current handle
  // swaps in the saved one sharing the longest prefix with its keys (the
  // current one is saved in its place, or in the least recently used one's).
  // Each keeps its epoch: the same rule voids it.
  struct SavedHandle {
    std::vector<uint8_t> keys;
    std::vector<uint32_t> nodes;
    uint64_t epoch = 0;
    uint64_t used = 0;
  };
  static constexpr int kSavedHandles = 8;
  mutable SavedHandle saved_[kSavedHandles];
  mutable uint64_t departures_ = 0;  // walks that left the current handle
  uint64_t mask_ = 0;
  size_t num_nodes_ = 0;  // live nodes, excluding the root
  size_t resident_[kNumTiers] = {};
  size_t ghosts_ = 0;
  uint32_t head_[kNumLists];
  uint32_t tail_[kNumLists];
  uint64_t seq_counter_ = 0;
  uint64_t max_nodes_;
  uint64_t ghosts_dropped_ = 0;
  bool hybrid_;
  double last_now_ = -1e300;
  std::unordered_map<uint32_t, Checkpoint> ckpts_;
  std::map<uint64_t, uint32_t> ckpt_lru_[kNumTiers];  // seq -> node
};

}  // namespace saria
