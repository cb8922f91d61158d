// Restart recovery of the SSD store; see recovery.h.
#include "store/recovery.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "store/store_internal.h"

namespace saria_store {

using namespace detail;

uint64_t find_records(const uint8_t* buf, uint64_t n, uint32_t first_slot, uint64_t slot_bytes,
                      uint64_t block_bytes, bool check_payload, std::vector<FoundRecord>* out,
                      uint32_t parts, uint64_t pitch) {
  const Geom g = make_geom(block_bytes, parts);
  if (pitch == 0) pitch = g.part_stride;
  uint64_t invalid = 0;
  for (uint64_t j = 0; j < n; ++j) {
    const uint8_t* s = buf + j * slot_bytes;
    uint32_t slot = first_slot + static_cast<uint32_t>(j);
    SlotRecord rec;
    if (verify_slot(s, slot, g, pitch, check_payload, nullptr, &rec) == Verdict::kOk) {
      FoundRecord r{rec.seq, slot, {}, rec.hcrc};
      std::memcpy(r.key.data(), rec.key, 32);
      out->push_back(r);
    } else {
      for (uint32_t p = 0; p < parts; ++p) {
        if (std::memcmp(s + p * pitch, kSlotMagic, 8) == 0) {
          ++invalid;
          break;
        }
      }
    }
  }
  return invalid;
}

std::vector<Survivor> newest_per_key(const std::vector<std::vector<FoundRecord>>& found,
                                     uint64_t* max_seq) {
  std::unordered_map<std::array<uint8_t, 32>, Survivor, KeyHash> best;
  uint64_t top = 0;
  for (size_t d = 0; d < found.size(); ++d) {
    for (const FoundRecord& r : found[d]) {
      top = std::max(top, r.seq);
      auto it = best.find(r.key);
      if (it == best.end() || it->second.seq < r.seq)
        best[r.key] = Survivor{r.key, r.seq, static_cast<uint32_t>(d), r.slot, r.hcrc};
    }
  }
  *max_seq = top;
  std::vector<Survivor> out;
  out.reserve(best.size());
  for (auto& [key, s] : best) out.push_back(s);
  return out;
}

}  // namespace saria_store
