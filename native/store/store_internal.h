// Helpers shared by the SSD store's translation units (not part of its API):
// little-endian field access, the slot/superblock magics, aligned per-thread
// staging buffers and the in-memory slot check.
#pragma once

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

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
inline constexpr size_t kSuperPartsAt = 80;     // version 2: parts per slot
inline constexpr size_t kSuperPartsCrcAt = 84;  // version 2: crc32c of [0, 84)

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline std::string errstr(int e) {
  char buf[256];
  return std::string(strerror_r(e, buf, sizeof buf));
}

// A file or directory of a drive is private to this user: owned by the
// effective uid (else refused: another user's file is never used), with no
// group/other bits (ours and looser -- made by an older saria, 0644/0755 --
// is tightened in place). `fd` is open on it; `what` names it in errors.
inline void make_private(int fd, const std::string& path, const std::string& what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    throw OsFailure(e, what + ": cannot stat " + path + ": " + errstr(e));
  }
  if (st.st_uid != ::geteuid())
    throw OsFailure(EPERM, what + ": " + path + " is owned by uid " + std::to_string(st.st_uid) +
                             ", not this user (" + std::to_string(::geteuid()) + "); refusing to use it");
  if ((st.st_mode & 077) != 0 && ::fchmod(fd, st.st_mode & 07700) != 0) {
    int e = errno;
    throw OsFailure(e, what + ": cannot make " + path + " private (chmod): " + errstr(e));
  }
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

// The parts per slot a verified superblock records (version 1: one;
// version 2: its field at 80, under the crc at 84). False, with *why, for a
// version this build does not read or a torn version-2 tail.
inline bool superblock_parts(const uint8_t* sb, uint32_t* parts, std::string* why) {
  uint32_t v = get32(sb + 8);
  if (v == kFormatVersion) {
    *parts = 1;
    return true;
  }
  if (v == kPartsFormatVersion) {
    if (crc32c(0, sb, kSuperPartsCrcAt) != get32(sb + kSuperPartsCrcAt) || get32(sb + kSuperPartsAt) < 2 ||
        get32(sb + kSuperPartsAt) > kMaxParts) {
      *why = "has a bad or torn superblock (parts field); move it away";
      return false;
    }
    *parts = get32(sb + kSuperPartsAt);
    return true;
  }
  *why = "has on-disk format version " + std::to_string(v) + ", this build reads " + std::to_string(kFormatVersion) +
         " and " + std::to_string(kPartsFormatVersion);
  return false;
}

struct KeyHash {
  size_t operator()(const std::array<uint8_t, 32>& k) const {
    uint64_t a, b;
    std::memcpy(&a, k.data(), 8);
    std::memcpy(&b, k.data() + 8, 8);
    return static_cast<size_t>(a ^ (b * 0x9E3779B97F4A7C15ull));
  }
};

enum class Verdict { kOk, kInvalid, kKeyMismatch };

// Where the parts of a slot lie. A slot of `parts` parts holds, per part,
// a 64-byte part header and part_bytes = block_bytes / parts of payload,
// padded to `part_stride` (a multiple of 4096): rank r of a tensor-parallel
// engine reads part r alone. One part is the original format.
struct Geom {
  uint64_t block_bytes = 0, part_bytes = 0, part_stride = 0, slot_bytes = 0;
  uint32_t parts = 1;
};
inline Geom make_geom(uint64_t block_bytes, uint32_t parts) {
  Geom g;
  g.block_bytes = block_bytes;
  g.parts = parts;
  g.part_bytes = block_bytes / parts;
  g.part_stride = round_up(kHeaderBytes + g.part_bytes, kAlign);
  g.slot_bytes = g.part_stride * parts;
  return g;
}

// Header bytes 8..12: the format version 1 in a one-part slot; in a slot of
// several parts, version 2 with the part index and the part count.
inline uint32_t part_word(uint32_t part, uint32_t parts) {
  return parts == 1 ? kFormatVersion : 2u | (part << 16) | (parts << 24);
}

inline uint32_t header_crc(const uint8_t* s, uint32_t local) {
  uint8_t loc[4];
  put32(loc, local);
  return crc32c(crc32c(0, s, 60), loc, 4);
}

// Builds part `part` of slot `local` at `s` (header, payload, zero padding
// to part_stride); returns its header crc.
inline uint32_t encode_part(uint8_t* s, const Geom& g, uint32_t part, uint32_t local, const uint8_t* key,
                            uint64_t seq, const uint8_t* payload) {
  std::memcpy(s, kSlotMagic, 8);
  put32(s + 8, part_word(part, g.parts));
  put32(s + 12, static_cast<uint32_t>(g.part_bytes));
  std::memcpy(s + 16, key, kKeyBytes);
  put64(s + 48, seq);
  std::memcpy(s + kHeaderBytes, payload, g.part_bytes);
  std::memset(s + kHeaderBytes + g.part_bytes, 0, g.part_stride - kHeaderBytes - g.part_bytes);
  put32(s + 56, crc32c(0, s + kHeaderBytes, g.part_bytes));
  uint32_t hc = header_crc(s, local);
  put32(s + 60, hc);
  return hc;
}

// Verify one part in memory (its header at `s`). `key` may be null.
inline Verdict verify_part(const uint8_t* s, uint32_t local, const Geom& g, uint32_t part, bool check_payload,
                           const uint8_t* key) {
  if (std::memcmp(s, kSlotMagic, 8) != 0) return Verdict::kInvalid;
  if (get32(s + 8) != part_word(part, g.parts)) return Verdict::kInvalid;
  if (get32(s + 12) != g.part_bytes) return Verdict::kInvalid;
  if (header_crc(s, local) != get32(s + 60)) return Verdict::kInvalid;
  if (check_payload && crc32c(0, s + kHeaderBytes, g.part_bytes) != get32(s + 56)) return Verdict::kInvalid;
  if (key && std::memcmp(s + 16, key, kKeyBytes) != 0) return Verdict::kKeyMismatch;
  return Verdict::kOk;
}

// What a slot's record is, as the journal lists it: the key, the sequence
// number, and the header crc (one part: the header's crc; several: the
// crc32c of every part's header crc, in part order).
struct SlotRecord {
  uint64_t seq = 0;
  uint32_t hcrc = 0;
  const uint8_t* key = nullptr;
};

// Verify a whole slot in memory, part p's header at s + p * pitch (pitch:
// part_stride for a slot read whole, 4096 for a header-only read of each
// part's first page). Every part must verify and carry the same key and
// sequence number (a torn rewrite leaves parts of two records: invalid).
// `key` may be null (recovery).
inline Verdict verify_slot(const uint8_t* s, uint32_t local, const Geom& g, uint64_t pitch, bool check_payload,
                           const uint8_t* key, SlotRecord* rec = nullptr) {
  uint32_t combined = 0;
  for (uint32_t p = 0; p < g.parts; ++p) {
    const uint8_t* q = s + p * pitch;
    Verdict v = verify_part(q, local, g, p, check_payload, key);
    if (v != Verdict::kOk) return v;
    if (p > 0 && (get64(q + 48) != get64(s + 48) || std::memcmp(q + 16, s + 16, kKeyBytes) != 0))
      return Verdict::kInvalid;
    uint8_t hc[4];
    put32(hc, get32(q + 60));
    combined = crc32c(combined, hc, 4);
  }
  if (rec) {
    rec->seq = get64(s + 48);
    rec->hcrc = g.parts == 1 ? get32(s + 60) : combined;
    rec->key = s + 16;
  }
  return Verdict::kOk;
}

}  // namespace detail
}  // namespace saria_store
