// Unit tests of the SSD store's I/O-free parts, against brute-force models:
// the slot allocator (random take/give-back sequences vs a bitmap), the
// recovery record check (valid, torn, misplaced, foreign, zeroed slots) and
// survivor choice (newest sequence number per key over drives), the thread
// pool (every task runs once, urgent before normal).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "store/journal.h"
#include "store/recovery.h"
#include "store/slot_allocator.h"
#include "store/ssd_store.h"
#include "store/store_internal.h"
#include "store/thread_pool.h"

using namespace saria_store;

static int failures = 0;
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      if (++failures >= 20) std::exit(1);                                   \
    }                                                                       \
  } while (0)

// ------------------------------------------------------------ allocator

// Random takes and give-backs against a bitmap: every slot handed out was
// free, runs are merged and in take order, free counts agree, and the log
// order holds (a take starts at the cursor when the cursor's slot is free).
static void allocator_matches_a_bitmap(uint32_t seed) {
  std::mt19937 rng(seed);
  const uint32_t n = 1 + rng() % 300;
  SlotAllocator a;
  a.reset(n);
  std::vector<uint8_t> model(n, 0);
  for (uint32_t i = 0; i < n; ++i)  // recovery: some slots hold records
    if (rng() % 4 == 0) {
      a.mark(i);
      model[i] = 1;
    }
  uint32_t cursor = rng() % n;
  a.rebuild(cursor);
  a.check();
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < n; ++i) if (model[i]) held.push_back(i);
  for (int step = 0; step < 400; ++step) {
    if (rng() % 2 == 0) {
      uint32_t want = rng() % 20;
      uint64_t free_before = a.free_count();
      uint32_t cur = a.cursor();
      bool cursor_free = !model[cur];
      std::vector<std::pair<uint32_t, uint32_t>> runs;
      uint32_t got = a.take(want, &runs);
      CHECK(got == std::min<uint64_t>(want, free_before));
      uint32_t total = 0;
      for (size_t r = 0; r < runs.size(); ++r) {
        auto [s, len] = runs[r];
        CHECK(len > 0);
        if (r > 0) CHECK(runs[r - 1].first + runs[r - 1].second != s);  // merged
        for (uint32_t i = s; i < s + len; ++i) {
          CHECK(i < n && model[i] == 0);
          model[i] = 1;
          held.push_back(i);
        }
        total += len;
      }
      CHECK(total == got);
      if (got > 0 && cursor_free) CHECK(runs[0].first == cur);
    } else if (!held.empty()) {
      // give back a random held slot and, if free, its right neighbours
      size_t k = rng() % held.size();
      uint32_t s = held[k];
      uint32_t len = 1;
      while (s + len < n && model[s + len] && rng() % 2) ++len;
      for (uint32_t i = s; i < s + len; ++i) model[i] = 0;
      std::vector<uint32_t> keep;
      for (uint32_t h : held) if (h < s || h >= s + len) keep.push_back(h);
      held.swap(keep);
      a.give_back(s, len);
    }
    uint64_t free_model = 0;
    for (uint32_t i = 0; i < n; ++i) {
      CHECK(a.allocated(i) == (model[i] != 0));
      free_model += model[i] == 0;
    }
    CHECK(a.free_count() == free_model);
    a.check();
  }
}

static void allocator_writes_a_log() {
  SlotAllocator a;
  a.reset(10);
  a.rebuild(0);
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  CHECK(a.take(4, &runs) == 4 && runs.size() == 1 && runs[0] == std::make_pair(0u, 4u));
  a.give_back(1, 2);                      // a hole behind the cursor
  runs.clear();
  CHECK(a.take(3, &runs) == 3 && runs[0] == std::make_pair(4u, 3u));  // forward, not the hole
  runs.clear();
  CHECK(a.take(5, &runs) == 5);           // 7..9, then wraps into the hole 1..2
  CHECK(runs.size() == 2 && runs[0] == std::make_pair(7u, 3u) && runs[1] == std::make_pair(1u, 2u));
  CHECK(a.free_count() == 0);
  runs.clear();
  CHECK(a.take(1, &runs) == 0 && runs.empty());
  bool threw = false;
  a.give_back(3, 1);
  try { a.check(); } catch (const std::logic_error&) { threw = true; }
  CHECK(!threw);
}

// -------------------------------------------------------------- recovery

static void write_slot(uint8_t* s, uint64_t slot_bytes, uint32_t slot, uint64_t block_bytes,
                       uint8_t key_byte, uint64_t seq) {
  using namespace detail;
  std::memset(s, 0, slot_bytes);
  std::memcpy(s, kSlotMagic, 8);
  put32(s + 8, kFormatVersion);
  put32(s + 12, static_cast<uint32_t>(block_bytes));
  std::memset(s + 16, key_byte, 32);
  put64(s + 48, seq);
  for (uint64_t i = 0; i < block_bytes; ++i) s[kHeaderBytes + i] = static_cast<uint8_t>(i * 7 + seq);
  put32(s + 56, crc32c(0, s + kHeaderBytes, block_bytes));
  uint8_t loc[4];
  put32(loc, slot);
  put32(s + 60, crc32c(crc32c(0, s, 60), loc, 4));
}

static void recovery_keeps_only_valid_records() {
  const uint64_t block = 100, slot_bytes = 4096;
  const uint32_t first = 40;
  std::vector<uint8_t> buf(6 * slot_bytes, 0);
  for (uint32_t j = 0; j < 6; ++j) write_slot(&buf[j * slot_bytes], slot_bytes, first + j, block, 1 + j, 10 + j);
  buf[1 * slot_bytes + 64 + 5] ^= 0xFF;                 // 1: torn payload
  std::memset(&buf[2 * slot_bytes], 0, slot_bytes);      // 2: never written
  write_slot(&buf[3 * slot_bytes], slot_bytes, first + 9, block, 4, 13);  // 3: written for slot 49
  buf[4 * slot_bytes + 20] ^= 0x01;                      // 4: header (key) corrupt
  std::vector<FoundRecord> full, headers;
  uint64_t bad = find_records(buf.data(), 6, first, slot_bytes, block, true, &full);
  CHECK(bad == 3);  // torn, misplaced, corrupt header (zeros are no record at all)
  CHECK(full.size() == 2 && full[0].slot == first && full[1].slot == first + 5);
  CHECK(full[0].seq == 10 && full[0].key[0] == 1 && full[1].seq == 15 && full[1].key[31] == 6);
  // A header-only scan cannot see the torn payload: the read-time crc will.
  bad = find_records(buf.data(), 6, first, slot_bytes, block, false, &headers);
  CHECK(bad == 2 && headers.size() == 3 && headers[1].slot == first + 1);
}

// Slots of several parts: a record iff every part verifies with one key and
// sequence number; its journal crc is the crc of the part header crcs.
static void recovery_of_multi_part_slots(uint32_t seed) {
  using namespace detail;
  std::mt19937 rng(seed);
  const uint32_t parts = 2 + rng() % 3;
  const uint64_t part = 1 + rng() % 6000, block = part * parts;
  const Geom g = make_geom(block, parts);
  CHECK(g.part_stride % kAlign == 0 && g.slot_bytes == parts * g.part_stride);
  const uint32_t first = rng() % 1000, n = 5;
  std::vector<uint8_t> buf(n * g.slot_bytes, 0), payload(block);
  std::vector<uint32_t> want_hcrc(n, 0);
  for (uint32_t j = 0; j < n; ++j) {
    uint8_t key[32];
    std::memset(key, 1 + j, 32);
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    uint32_t combined = 0;
    for (uint32_t p = 0; p < parts; ++p) {
      uint8_t hc[4];
      put32(hc, encode_part(&buf[j * g.slot_bytes + p * g.part_stride], g, p, first + j, key, 50 + j,
                            &payload[p * part]));
      combined = crc32c(combined, hc, 4);
    }
    want_hcrc[j] = combined;
  }
  const uint32_t victim = rng() % parts;
  // 1: one part's payload torn
  buf[1 * g.slot_bytes + victim * g.part_stride + kHeaderBytes + rng() % part] ^= 0x10;
  // 2: one part from another record of the same slot (another sequence number)
  {
    uint8_t key[32];
    std::memset(key, 3, 32);
    encode_part(&buf[2 * g.slot_bytes + victim * g.part_stride], g, victim, first + 2, key, 99, payload.data());
  }
  // 3: two parts swapped (part index in the header)
  if (parts > 1) {
    std::vector<uint8_t> tmp(&buf[3 * g.slot_bytes], &buf[3 * g.slot_bytes] + g.part_stride);
    std::memcpy(&buf[3 * g.slot_bytes], &buf[3 * g.slot_bytes + g.part_stride], g.part_stride);
    std::memcpy(&buf[3 * g.slot_bytes + g.part_stride], tmp.data(), g.part_stride);
  }
  std::vector<FoundRecord> full, headers;
  uint64_t bad = find_records(buf.data(), n, first, g.slot_bytes, block, true, &full, parts);
  CHECK(bad == 3 && full.size() == 2);
  CHECK(full[0].slot == first && full[0].seq == 50 && full[0].hcrc == want_hcrc[0]);
  CHECK(full[1].slot == first + 4 && full[1].seq == 54 && full[1].hcrc == want_hcrc[4]);
  // headers only (each part's first page): the torn payload passes, the rest does not
  std::vector<uint8_t> pages(n * parts * kAlign);
  for (uint32_t j = 0; j < n; ++j)
    for (uint32_t p = 0; p < parts; ++p)
      std::memcpy(&pages[(j * parts + p) * kAlign], &buf[j * g.slot_bytes + p * g.part_stride],
                  std::min<uint64_t>(kAlign, g.part_stride));
  bad = find_records(pages.data(), n, first, parts * kAlign, block, false, &headers, parts, kAlign);
  CHECK(bad == 2 && headers.size() == 3 && headers[1].slot == first + 1 && headers[1].hcrc == want_hcrc[1]);
  // a part read alone verifies on its own; at another part index or slot it does not
  const uint8_t* p0 = &buf[4 * g.slot_bytes];
  uint8_t key4[32];
  std::memset(key4, 5, 32);
  CHECK(verify_part(p0, first + 4, g, 0, true, key4) == Verdict::kOk);
  CHECK(verify_part(p0 + g.part_stride, first + 4, g, 1, true, key4) == Verdict::kOk);
  CHECK(verify_part(p0, first + 4, g, 1, true, key4) == Verdict::kInvalid);
  CHECK(verify_part(p0, first + 3, g, 0, true, key4) == Verdict::kInvalid);
  key4[0] ^= 1;
  CHECK(verify_part(p0, first + 4, g, 0, true, key4) == Verdict::kKeyMismatch);
}

static void recovery_picks_the_newest_record_per_key() {
  auto rec = [](uint8_t k, uint64_t seq, uint32_t slot) {
    FoundRecord r{seq, slot, {}};
    r.key.fill(k);
    return r;
  };
  std::vector<std::vector<FoundRecord>> found = {
      {rec(1, 5, 0), rec(2, 9, 1), rec(1, 7, 2)},
      {rec(1, 6, 0), rec(3, 2, 4), rec(2, 8, 7)},
      {}};
  uint64_t max_seq = 0;
  auto out = newest_per_key(found, &max_seq);
  CHECK(max_seq == 9 && out.size() == 3);
  std::map<uint8_t, Survivor> by;
  for (auto& s : out) by[s.key[0]] = s;
  CHECK(by[1].seq == 7 && by[1].drive == 0 && by[1].slot == 2);
  CHECK(by[2].seq == 9 && by[2].drive == 0 && by[2].slot == 1);
  CHECK(by[3].seq == 2 && by[3].drive == 1 && by[3].slot == 4);
  std::vector<std::vector<FoundRecord>> none(2);
  CHECK(newest_per_key(none, &max_seq).empty() && max_seq == 0);
}

// ---------------------------------------------------------------- journal

static FoundRecord entry_of(std::mt19937& rng, uint32_t n_slots) {
  FoundRecord r{};
  r.seq = 1 + rng() % 1000;
  r.slot = rng() % n_slots;
  for (auto& b : r.key) b = static_cast<uint8_t>(rng());
  r.hcrc = rng();
  return r;
}

// Encoded headers and entries decode to what was written; any flipped byte,
// another generation or another block size is refused.
static void journal_records_round_trip(uint32_t seed) {
  std::mt19937 rng(seed);
  JournalHeader h;
  h.gen = rng();
  h.block_bytes = 1 + rng() % 100000;
  h.n_slots = 1 + rng() % 5000;
  for (auto& b : h.store_id) b = static_cast<uint8_t>(rng());
  h.count = rng() % 100;
  h.max_seq = rng();
  h.body_crc = rng();
  std::vector<uint8_t> page(4096);
  for (bool ck : {true, false}) {
    encode_header(page.data(), ck, h);
    JournalHeader g;
    CHECK(decode_header(page.data(), ck, &g));
    CHECK(g.gen == h.gen && g.block_bytes == h.block_bytes && g.n_slots == h.n_slots &&
          g.store_id == h.store_id && g.count == h.count && g.max_seq == h.max_seq && g.body_crc == h.body_crc);
    CHECK(!decode_header(page.data(), !ck, &g));  // a checkpoint is no segment
    page[rng() % 80] ^= static_cast<uint8_t>(1 + rng() % 255);
    CHECK(!decode_header(page.data(), ck, &g));
  }
  FoundRecord r = entry_of(rng, static_cast<uint32_t>(h.n_slots));
  uint8_t e[kEntryBytes];
  encode_entry(e, r, static_cast<uint32_t>(h.block_bytes), h.gen);
  FoundRecord back{};
  CHECK(decode_entry(e, static_cast<uint32_t>(h.block_bytes), h.gen, &back));
  CHECK(back.seq == r.seq && back.slot == r.slot && back.key == r.key && back.hcrc == r.hcrc);
  CHECK(!decode_entry(e, static_cast<uint32_t>(h.block_bytes), h.gen + 1, &back));
  CHECK(!decode_entry(e, static_cast<uint32_t>(h.block_bytes) + 1, h.gen, &back));
  e[rng() % kEntryBytes] ^= static_cast<uint8_t>(1 + rng() % 255);
  CHECK(!decode_entry(e, static_cast<uint32_t>(h.block_bytes), h.gen, &back));
}

// A segment cut at a random byte (a torn append) and zero-padded to its
// page: the entries before the cut come back, the torn one is dropped; a
// corrupt entry with good ones after it makes the segment corrupt.
static void journal_segment_torn_tail_and_corruption(uint32_t seed) {
  std::mt19937 rng(seed);
  const uint32_t n_slots = 1 + rng() % 200, block = 4096;
  const uint64_t gen = 7;
  size_t n = 1 + rng() % 150;
  std::vector<FoundRecord> model;
  std::vector<uint8_t> buf((n + 64) * kEntryBytes, 0);
  for (size_t i = 0; i < n; ++i) {
    model.push_back(entry_of(rng, n_slots));
    encode_entry(&buf[i * kEntryBytes], model.back(), block, gen);
  }
  size_t cut = rng() % (n * kEntryBytes + 1);
  std::fill(buf.begin() + static_cast<long>(cut), buf.end(), 0);
  if (cut % kEntryBytes) buf[cut - 1] ^= 0x5A;  // the torn entry's last bytes are garbage
  std::vector<FoundRecord> got;
  SegmentScan sc = scan_entries(buf.data(), buf.size() / kEntryBytes, block, gen, n_slots, &got);
  size_t whole = cut / kEntryBytes;
  CHECK(!sc.corrupt && sc.valid == whole && got.size() == whole);
  CHECK(sc.dropped_tail == (cut % kEntryBytes ? 1u : 0u));
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].seq == model[i].seq && got[i].slot == model[i].slot);
  if (whole >= 2) {  // damage an entry in the middle: everything after it is in doubt
    size_t at = rng() % (whole - 1);
    buf[at * kEntryBytes + rng() % kEntryBytes] ^= 0x01;
    got.clear();
    CHECK(scan_entries(buf.data(), buf.size() / kEntryBytes, block, gen, n_slots, &got).corrupt);
    std::memset(&buf[at * kEntryBytes], 0, kEntryBytes);  // a zeroed sector is no tail either
    got.clear();
    CHECK(scan_entries(buf.data(), buf.size() / kEntryBytes, block, gen, n_slots, &got).corrupt);
  }
  // an entry naming a slot past the drive's end
  FoundRecord far = entry_of(rng, n_slots);
  far.slot = n_slots;
  encode_entry(buf.data(), far, block, gen);
  got.clear();
  CHECK(scan_entries(buf.data(), 1, block, gen, n_slots, &got).corrupt);
}

// newest_per_slot against a brute-force map.
static void journal_newest_per_slot(uint32_t seed) {
  std::mt19937 rng(seed);
  uint32_t n_slots = 1 + rng() % 40;
  std::vector<FoundRecord> in;
  std::map<uint32_t, FoundRecord> model;
  for (int i = 0; i < 200; ++i) {
    FoundRecord r = entry_of(rng, n_slots);
    r.seq = static_cast<uint64_t>(i) * 1000 + rng() % 1000;  // distinct
    if (rng() % 3 == 0) r.seq = rng() % 1000;               // an old one arriving late
    in.push_back(r);
    auto it = model.find(r.slot);
    if (it == model.end() || it->second.seq < r.seq) model[r.slot] = r;
  }
  auto out = newest_per_slot(in);
  CHECK(out.size() == model.size());
  for (auto& r : out) CHECK(model[r.slot].seq == r.seq && model[r.slot].key == r.key);
}

// ----------------------------------------------------------- thread pool

static void pool_runs_every_task_once() {
  ThreadPool pool(3);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::atomic<int>> hits(57);
    std::vector<std::function<void()>> tasks;
    for (size_t i = 0; i < hits.size(); ++i) tasks.push_back([&hits, i] { hits[i]++; });
    run_all(&pool, tasks, round % 2 == 1);
    for (auto& h : hits) CHECK(h.load() == 1);
  }
  std::vector<std::function<void()>> none;
  run_all(&pool, none);
  int alone = 0;
  std::vector<std::function<void()>> one = {[&] { ++alone; }};
  run_all(nullptr, one);
  CHECK(alone == 1);
}

static void urgent_tasks_jump_the_queue() {
  ThreadPool pool(0);  // no workers: the caller drains the queues itself
  std::vector<int> order;
  pool.submit([&] { order.push_back(1); });
  pool.submit([&] { order.push_back(2); }, true);
  CHECK(pool.try_run_one(true));     // an urgent caller takes the urgent task
  CHECK(!pool.try_run_one(true));    // and never a normal one
  CHECK(pool.try_run_one(false));
  CHECK(order == std::vector<int>({2, 1}));
}

int main() {
  for (uint32_t seed = 1; seed <= 60; ++seed) allocator_matches_a_bitmap(seed);
  allocator_writes_a_log();
  recovery_keeps_only_valid_records();
  recovery_picks_the_newest_record_per_key();
  for (uint32_t seed = 1; seed <= 100; ++seed) recovery_of_multi_part_slots(seed);
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    journal_records_round_trip(seed);
    journal_segment_torn_tail_and_corruption(seed);
    journal_newest_per_slot(seed);
  }
  pool_runs_every_task_once();
  urgent_tasks_jump_the_queue();
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("store units: all checks passed\n");
  return 0;
}
