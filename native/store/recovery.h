// Restart recovery of the SSD store: which slots hold valid records, and
// which record of a key wins.
//
// The store scans every slot of every drive at open (the I/O is the store's;
// see SsdStore::scan_drive); these functions decide, from the bytes read,
// what survived: a slot holds a record iff its magic, version, payload
// length, header crc (which covers the slot's own index, so a record read at
// the wrong place fails) and, for a full scan, payload crc verify. When
// several valid records carry the same key, the newest sequence number wins.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace saria_store {

struct FoundRecord {
  uint64_t seq;
  uint32_t slot;  // local to its drive
  std::array<uint8_t, 32> key;
  uint32_t hcrc = 0;  // the slot header's crc (header bytes 60..64; several parts: ssd_store.h)
};

// Checks `n` consecutive slots of `slot_bytes` bytes in `buf`, the first at
// local index `first_slot`; appends the valid records to `out` (payloads
// verified when `check_payload`). Returns how many slots hold a record
// header (the magic) that does not verify: torn or corrupt writes. A slot of
// `parts` parts has part p at p * `pitch` bytes from its start in `buf` (0:
// the part stride, a slot read whole; 4096 for each part's first page) and
// is a record only when every part verifies with one key and sequence number.
uint64_t find_records(const uint8_t* buf, uint64_t n, uint32_t first_slot, uint64_t slot_bytes,
                      uint64_t block_bytes, bool check_payload, std::vector<FoundRecord>* out,
                      uint32_t parts = 1, uint64_t pitch = 0);

struct Survivor {
  std::array<uint8_t, 32> key;
  uint64_t seq;
  uint32_t drive, slot;
  uint32_t hcrc = 0;
};

// The newest record of each key over all drives (`found[d]`: drive d's
// records); `*max_seq` receives the largest sequence number seen (0 if none).
// Ties between equal sequence numbers, which one store never writes, keep
// the first found.
std::vector<Survivor> newest_per_key(const std::vector<std::vector<FoundRecord>>& found,
                                     uint64_t* max_seq);

}  // namespace saria_store
