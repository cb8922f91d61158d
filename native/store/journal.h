// The SSD store's per-drive journal: what a restart needs (key, slot,
// sequence number, header crc of every block a drive holds) in a few
// megabytes, so that opening a store reads the journal, not the drive.
//
// The slot header stays the truth; the journal is a verified hint. Every
// read already verifies header, key and payload crc, so a stale entry (a
// slot rewritten after its entry, by a write that died before its own entry
// landed) is a miss, never wrong bytes. What the journal guarantees: a
// block's entry is on the drive before write() returns its handle, so every
// acknowledged block is in the journal.
//
// ---------------------------------------------------------------------------
// On-disk format (version 1, little endian), beside `saria-ssd.data`:
// ---------------------------------------------------------------------------
//   saria-ssd.ckpt     checkpoint: a header page, then `count` entries
//   saria-ssd.journal  segment: a header page, then entries appended in
//                      4096-byte pages (the last page is rewritten as it
//                      fills, its earlier bytes unchanged)
//
// Header page (4096 bytes, the first 96 used, the rest zero):
//   0   u64  magic "SARIACKP" (checkpoint) or "SARIAJNL" (segment)
//   8   u32  version (1)
//   12  u32  entry bytes (64)
//   16  u64  generation
//   24  u64  block_bytes of the data file
//   32  u64  n_slots of the data file
//   40  u8[16] store id of the data file (superblock bytes 56..72)
//   56  u64  entry count (checkpoint; 0 in a segment)
//   64  u64  largest sequence number in the checkpoint (0 in a segment)
//   72  u32  crc32c of the checkpoint's entry bytes (0 in a segment)
//   76  u32  crc32c of bytes [0, 76)
//
// Entry (64 bytes):
//   0   u32  magic "SJE1"
//   4   u32  slot (local to the drive)
//   8   u64  write sequence number of the slot's record
//   16  u8[32] block key
//   48  u32  payload length (block_bytes)
//   52  u32  the slot header's crc (header bytes 60..64)
//   56  u32  low 32 bits of the generation the entry was written in
//   60  u32  crc32c of bytes [0, 60)
//
// Generations. A checkpoint of generation g holds every live slot at the
// moment it was taken; the segment of generation g holds what was written
// after it. Compaction writes checkpoint g+1 (to a .tmp file, fdatasync,
// rename, directory fsync), then a fresh segment g+1 the same way. A crash
// between the two leaves checkpoint g+1 beside segment g, whose entries the
// checkpoint already holds: a segment older than its checkpoint is ignored.
// Any other mismatch (a segment newer than its checkpoint, a header that
// does not verify or names another data file, a checkpoint whose entry crc
// fails, a bad entry followed by good ones) makes the journal unusable and
// the store falls back to scanning the drive. Bad entries at the very end
// of a segment are a torn tail (an append the crash cut) and are dropped.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "store/recovery.h"

namespace saria_store {

constexpr uint32_t kJournalVersion = 1;
constexpr size_t kEntryBytes = 64;
constexpr const char* kCheckpointFileName = "saria-ssd.ckpt";
constexpr const char* kSegmentFileName = "saria-ssd.journal";

struct JournalHeader {
  uint64_t gen = 0, block_bytes = 0, n_slots = 0;
  std::array<uint8_t, 16> store_id{};
  uint64_t count = 0, max_seq = 0;
  uint32_t body_crc = 0;
};

// `page` is 4096 bytes; `checkpoint` picks the magic.
void encode_header(uint8_t* page, bool checkpoint, const JournalHeader& h);
// False when the magic, version, entry size or crc does not verify.
bool decode_header(const uint8_t* page, bool checkpoint, JournalHeader* h);

void encode_entry(uint8_t* p, const FoundRecord& r, uint32_t block_bytes, uint64_t gen);
// False when the magic, length, generation or crc does not verify.
bool decode_entry(const uint8_t* p, uint32_t block_bytes, uint64_t gen, FoundRecord* r);

struct SegmentScan {
  uint64_t valid = 0;         // entries taken
  uint64_t dropped_tail = 0;  // non-zero entries after the last good one (a torn tail)
  bool corrupt = false;       // a bad entry before a good one, or a slot out of range
};

// Decodes the `n` entries in `buf`, appending the good ones to `out`. The
// good entries must come first: a good entry after one that is not (torn,
// corrupt or zero: never written) makes the segment corrupt; what follows the
// last good entry is the unwritten or torn tail.
SegmentScan scan_entries(const uint8_t* buf, uint64_t n, uint32_t block_bytes, uint64_t gen,
                         uint64_t n_slots, std::vector<FoundRecord>* out);

// What a drive's journal says it holds: per slot, the entry with the
// highest sequence number (checkpoint first, then the segment).
std::vector<FoundRecord> newest_per_slot(const std::vector<FoundRecord>& entries);

}  // namespace saria_store
