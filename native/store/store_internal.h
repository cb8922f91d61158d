// Helpers shared by the SSD store's translation units (not part of its API):
// little-endian field access, the slot/superblock magics, aligned per-thread
// staging buffers and the in-memory slot check.
#pragma once

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "store/ssd_store.h"

namespace saria_store {
namespace detail {

inline void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }  // little-endian hosts only
inline void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline uint32_t get32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t get64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

inline constexpr uint8_t kSlotMagic[8] = {'S', 'A', 'R', 'I', 'A', 'S', 'L', 'T'};
inline constexpr uint8_t kSuperMagic[8] = {'S', 'A', 'R', 'I', 'A', 'S', 'U', 'P'};
inline constexpr size_t kSuperCrcAt = 76;

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline std::string errstr(int e) {
  char buf[256];
  return std::string(strerror_r(e, buf, sizeof buf));
}

// Aligned staging buffer, one per thread, grown on demand.
struct AlignedBuf {
  uint8_t* p = nullptr;
  size_t n = 0;
  ~AlignedBuf() { std::free(p); }
  uint8_t* get(size_t want) {
    if (n < want) {
      std::free(p);
      p = nullptr;
      n = 0;
      void* q = nullptr;
      if (posix_memalign(&q, kAlign, want) != 0) throw std::bad_alloc();
      p = static_cast<uint8_t*>(q);
      n = want;
    }
    return p;
  }
};
inline thread_local AlignedBuf tl_buf;

struct KeyHash {
  size_t operator()(const std::array<uint8_t, 32>& k) const {
    uint64_t a, b;
    std::memcpy(&a, k.data(), 8);
    std::memcpy(&b, k.data() + 8, 8);
    return static_cast<size_t>(a ^ (b * 0x9E3779B97F4A7C15ull));
  }
};

enum class Verdict { kOk, kInvalid, kKeyMismatch };

// Verify a slot record in memory. `key` may be null (recovery).
inline Verdict verify_slot(const uint8_t* s, uint32_t local, uint64_t block_bytes, bool check_payload,
                    const uint8_t* key) {
  if (std::memcmp(s, kSlotMagic, 8) != 0) return Verdict::kInvalid;
  if (get32(s + 8) != kFormatVersion) return Verdict::kInvalid;
  if (get32(s + 12) != block_bytes) return Verdict::kInvalid;
  uint8_t loc[4];
  put32(loc, local);
  uint32_t hc = crc32c(crc32c(0, s, 60), loc, 4);
  if (hc != get32(s + 60)) return Verdict::kInvalid;
  if (check_payload && crc32c(0, s + kHeaderBytes, block_bytes) != get32(s + 56)) return Verdict::kInvalid;
  if (key && std::memcmp(s + 16, key, kKeyBytes) != 0) return Verdict::kKeyMismatch;
  return Verdict::kOk;
}

}  // namespace detail
}  // namespace saria_store
