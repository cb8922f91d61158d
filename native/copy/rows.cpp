// Row copies by index; see rows.h.
#include "copy/rows.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace saria_copy {

namespace {

// Rows at least this long are copied with non-temporal (streaming) stores:
// a row of a KV page or a DRAM slot is not read again soon, and glibc's
// memcpy uses ordinary stores below its own threshold (several MiB), which
// pay a read-for-ownership of every destination line: on this machine kind
// that held row-by-row copies to ~0.6 of one big memcpy.
constexpr size_t kStreamBytes = 64 << 10;

#if defined(__x86_64__)
// 256 bytes per iteration: unaligned 32-byte loads, aligned streaming stores
// (a software prefetch of the source measured slower here).
__attribute__((target("avx2"))) void stream_avx2(uint8_t* dst, const uint8_t* src, size_t n) {
  auto* d = reinterpret_cast<__m256i*>(dst);
  auto* s = reinterpret_cast<const __m256i*>(src);
  for (size_t i = 0; i < n / 256; ++i, d += 8, s += 8)
    for (int k = 0; k < 8; ++k) _mm256_stream_si256(d + k, _mm256_loadu_si256(s + k));
}

void stream_sse2(uint8_t* dst, const uint8_t* src, size_t n) {
  auto* d = reinterpret_cast<__m128i*>(dst);
  auto* s = reinterpret_cast<const __m128i*>(src);
  for (size_t i = 0; i < n / 256; ++i, d += 16, s += 16)
    for (int k = 0; k < 16; ++k) _mm_stream_si128(d + k, _mm_loadu_si128(s + k));
}

const bool kAvx2 = __builtin_cpu_supports("avx2");
#endif

void copy_one(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamBytes) {
    size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    if (kAvx2) stream_avx2(dst, src, n);
    else stream_sse2(dst, src, n);
    size_t done = n / 256 * 256;
    std::memcpy(dst + done, src + done, n - done);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace

void copy_rows(uint8_t* dst, size_t dst_stride, const int64_t* dst_idx, const uint8_t* src,
               size_t src_stride, const int64_t* src_idx, size_t n, size_t row_bytes) {
  for (size_t i = 0; i < n; ++i) {
    size_t d = dst_idx ? static_cast<size_t>(dst_idx[i]) : i;
    size_t s = src_idx ? static_cast<size_t>(src_idx[i]) : i;
    copy_one(dst + d * dst_stride, src + s * src_stride, row_bytes);
  }
#if defined(__x86_64__)
  if (row_bytes >= kStreamBytes) _mm_sfence();  // streaming stores visible before we return
#endif
}

}  // namespace saria_copy
