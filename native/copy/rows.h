// Row copies by index between two strided 2-D byte arrays: the DRAM pool's
// gather and scatter and the worker's page copies between pool slots and KV
// pages. One memcpy per row: numpy's fancy indexing reached only 0.6-0.8 of a
// plain memcpy for 1 MiB rows on some CPUs of this kind.
#pragma once

#include <cstddef>
#include <cstdint>

namespace saria_copy {

// For i in [0, n): dst + dst_idx[i] * dst_stride  <-  src + src_idx[i] * src_stride,
// `row_bytes` each. A null index means the identity (row i). The caller has
// checked every index and that the regions do not overlap.
void copy_rows(uint8_t* dst, size_t dst_stride, const int64_t* dst_idx, const uint8_t* src,
               size_t src_stride, const int64_t* src_idx, size_t n, size_t row_bytes);

}  // namespace saria_copy
