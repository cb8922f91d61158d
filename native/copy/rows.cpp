// Row copies by index; see rows.h.
#include "copy/rows.h"

#include <cstring>

namespace saria_copy {

void copy_rows(uint8_t* dst, size_t dst_stride, const int64_t* dst_idx, const uint8_t* src,
               size_t src_stride, const int64_t* src_idx, size_t n, size_t row_bytes) {
  for (size_t i = 0; i < n; ++i) {
    size_t d = dst_idx ? static_cast<size_t>(dst_idx[i]) : i;
    size_t s = src_idx ? static_cast<size_t>(src_idx[i]) : i;
    std::memcpy(dst + d * dst_stride, src + s * src_stride, row_bytes);
  }
}

}  // namespace saria_copy
