// The SSD store's per-drive journal: encoding and replay; see journal.h.
// The I/O (appends, checkpoints, reading at open) is the store's, in
// journal_io.cpp.
#include "store/journal.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "store/store_internal.h"

namespace saria_store {

using namespace detail;

namespace {
constexpr uint8_t kCkptMagic[8] = {'S', 'A', 'R', 'I', 'A', 'C', 'K', 'P'};
constexpr uint8_t kSegMagic[8] = {'S', 'A', 'R', 'I', 'A', 'J', 'N', 'L'};
constexpr uint8_t kEntryMagic[4] = {'S', 'J', 'E', '1'};
constexpr size_t kHeaderCrcAt = 76;
}  // namespace

void encode_header(uint8_t* page, bool checkpoint, const JournalHeader& h) {
  std::memset(page, 0, kAlign);
  std::memcpy(page, checkpoint ? kCkptMagic : kSegMagic, 8);
  put32(page + 8, kJournalVersion);
  put32(page + 12, static_cast<uint32_t>(kEntryBytes));
  put64(page + 16, h.gen);
  put64(page + 24, h.block_bytes);
  put64(page + 32, h.n_slots);
  std::memcpy(page + 40, h.store_id.data(), 16);
  put64(page + 56, h.count);
  put64(page + 64, h.max_seq);
  put32(page + 72, h.body_crc);
  put32(page + kHeaderCrcAt, crc32c(0, page, kHeaderCrcAt));
}

bool decode_header(const uint8_t* page, bool checkpoint, JournalHeader* h) {
  if (std::memcmp(page, checkpoint ? kCkptMagic : kSegMagic, 8) != 0) return false;
  if (crc32c(0, page, kHeaderCrcAt) != get32(page + kHeaderCrcAt)) return false;
  if (get32(page + 8) != kJournalVersion || get32(page + 12) != kEntryBytes) return false;
  h->gen = get64(page + 16);
  h->block_bytes = get64(page + 24);
  h->n_slots = get64(page + 32);
  std::memcpy(h->store_id.data(), page + 40, 16);
  h->count = get64(page + 56);
  h->max_seq = get64(page + 64);
  h->body_crc = get32(page + 72);
  return true;
}

void encode_entry(uint8_t* p, const FoundRecord& r, uint32_t block_bytes, uint64_t gen) {
  std::memcpy(p, kEntryMagic, 4);
  put32(p + 4, r.slot);
  put64(p + 8, r.seq);
  std::memcpy(p + 16, r.key.data(), 32);
  put32(p + 48, block_bytes);
  put32(p + 52, r.hcrc);
  put32(p + 56, static_cast<uint32_t>(gen));
  put32(p + 60, crc32c(0, p, 60));
}

bool decode_entry(const uint8_t* p, uint32_t block_bytes, uint64_t gen, FoundRecord* r) {
  if (std::memcmp(p, kEntryMagic, 4) != 0) return false;
  if (crc32c(0, p, 60) != get32(p + 60)) return false;
  if (get32(p + 48) != block_bytes || get32(p + 56) != static_cast<uint32_t>(gen)) return false;
  r->slot = get32(p + 4);
  r->seq = get64(p + 8);
  std::memcpy(r->key.data(), p + 16, 32);
  r->hcrc = get32(p + 52);
  return true;
}

SegmentScan scan_entries(const uint8_t* buf, uint64_t n, uint32_t block_bytes, uint64_t gen,
                         uint64_t n_slots, std::vector<FoundRecord>* out) {
  static const uint8_t zero[kEntryBytes] = {};
  SegmentScan s;
  bool gap = false;  // an entry that is not good (torn, corrupt or zero) since the last good one
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t* p = buf + i * kEntryBytes;
    FoundRecord r{};
    if (decode_entry(p, block_bytes, gen, &r)) {
      if (r.slot >= n_slots || gap) {
        s.corrupt = true;
        return s;
      }
      out->push_back(r);
      ++s.valid;
    } else {
      gap = true;
      if (std::memcmp(p, zero, kEntryBytes) != 0) ++s.dropped_tail;
    }
  }
  return s;
}

std::vector<FoundRecord> newest_per_slot(const std::vector<FoundRecord>& entries) {
  std::unordered_map<uint32_t, size_t> at;
  std::vector<FoundRecord> out;
  for (const FoundRecord& r : entries) {
    auto it = at.find(r.slot);
    if (it == at.end()) {
      at.emplace(r.slot, out.size());
      out.push_back(r);
    } else if (out[it->second].seq < r.seq) {
      out[it->second] = r;
    }
  }
  return out;
}

}  // namespace saria_store
