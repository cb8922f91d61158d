// crc32c for the SSD store: hardware (SSE4.2) and portable versions.
#include <cstdint>
#include <cstring>

#include "store/ssd_store.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define SARIA_X86 1
#endif

namespace saria_store {

// ---------------------------------------------------------------------------
// crc32c (Castagnoli, reflected polynomial 0x82F63B78), standard init/xorout
// (~0), chained like zlib's crc32: crc32c(crc32c(0, a), b) == crc32c(0, a||b).
// SSE4.2 with three interleaved streams combined in GF(2) for large buffers;
// a portable slicing-by-8 table otherwise.
// ---------------------------------------------------------------------------
namespace {
constexpr uint32_t kPoly = 0x82F63B78u;

struct SwTable {
  uint32_t t[8][256];
  SwTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};
const SwTable& sw_table() {
  static SwTable tab;
  return tab;
}

uint32_t crc_sw(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = sw_table().t;
  uint32_t c = ~crc;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
    --n;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

// GF(2) helpers from zlib's crc32_combine, for the crc32c polynomial.
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}
struct X2n {
  uint32_t t[32];
  X2n() {
    uint32_t p = 1u << 30;  // x^1
    t[0] = p;
    for (int n = 1; n < 32; ++n) t[n] = p = multmodp(p, p);
  }
};
uint32_t x8nmodp(size_t n) {  // x^(8n) mod P
  static X2n x2n;
  uint32_t p = 1u << 31;
  unsigned k = 3;
  while (n) {
    if (n & 1) p = multmodp(x2n.t[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}
inline uint32_t crc_combine(uint32_t c1, uint32_t c2, size_t len2) {
  return multmodp(x8nmodp(len2), c1) ^ c2;
}

#ifdef SARIA_X86
__attribute__((target("sse4.2"))) uint32_t crc_hw_raw(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t s = c;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    s = _mm_crc32_u8(static_cast<uint32_t>(s), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    s = _mm_crc32_u64(s, w);
    p += 8;
    n -= 8;
  }
  while (n--) s = _mm_crc32_u8(static_cast<uint32_t>(s), *p++);
  return static_cast<uint32_t>(s);
}

__attribute__((target("sse4.2"))) uint32_t crc_hw(uint32_t crc, const uint8_t* p, size_t n) {
  if (n < 3 * 1024) return ~crc_hw_raw(~crc, p, n);
  // Three independent streams hide the 3-cycle latency of crc32q.
  size_t L = (n / 3) & ~size_t(7);
  uint64_t a = ~crc, b = 0xffffffffu, c = 0xffffffffu;
  const uint8_t* pa = p;
  const uint8_t* pb = p + L;
  const uint8_t* pc = p + 2 * L;
  for (size_t i = 0; i < L; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, pa + i, 8);
    std::memcpy(&wb, pb + i, 8);
    std::memcpy(&wc, pc + i, 8);
    a = _mm_crc32_u64(a, wa);
    b = _mm_crc32_u64(b, wb);
    c = _mm_crc32_u64(c, wc);
  }
  uint32_t fa = ~static_cast<uint32_t>(a), fb = ~static_cast<uint32_t>(b), fc = ~static_cast<uint32_t>(c);
  uint32_t r = crc_combine(crc_combine(fa, fb, L), fc, L);
  return ~crc_hw_raw(~r, p + 3 * L, n - 3 * L);
}
bool detect_hw() { return __builtin_cpu_supports("sse4.2"); }
#else
bool detect_hw() { return false; }
#endif

const bool g_hw = detect_hw();

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#ifdef SARIA_X86
  if (g_hw) return crc_hw(crc, p, n);
#endif
  return crc_sw(crc, p, n);
}
bool crc32c_hw() { return g_hw; }
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  return crc_sw(crc, static_cast<const uint8_t*>(data), n);
}

}  // namespace saria_store
