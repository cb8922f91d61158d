// SSD store: the data path (write, read, free). See ssd_store.h.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <vector>

#include "store/ssd_store.h"
#include "store/store_internal.h"

namespace saria_store {

using namespace detail;

// ---------------------------------------------------------------------------
// Write
// ---------------------------------------------------------------------------
// Slots per I/O for a call of k blocks: at most unit_bytes, and small enough
// that every worker (the pool and the calling thread) gets a share -- a batch
// cut into a few big units leaves workers idle while the last unit runs
// alone (measured: 1 MiB units beat 4 MiB ones by ~40% for 16 x 1 MiB).
uint64_t SsdStore::balanced_unit(size_t k) const {
  uint64_t workers = static_cast<uint64_t>(nthreads_) + 1;
  uint64_t per = (k + workers - 1) / workers;
  return std::max<uint64_t>(1, std::min<uint64_t>(unit_slots_, per));
}

void SsdStore::check_writable() const {
  if (opt_.read_only) throw std::logic_error("this SSD store is a read-only reader: write and free belong to its owner");
}

void SsdStore::write(size_t k, const uint8_t* keys, const uint8_t* data, int64_t* handles) {
  std::shared_lock<std::shared_mutex> life(life_);
  check_open();
  check_writable();
  for (size_t i = 0; i < k; ++i) handles[i] = -1;
  if (k == 0) return;
  for (auto& d : drives_)
    if (!d->failed && d->fd >= 0) path_ok(*d);

  struct Run {
    uint32_t drive, start, len;
    size_t first;     // index of the run's first block in the batch
    uint64_t seq0;    // sequence number of that block
  };
  std::vector<Run> runs;
  size_t placed = 0;
  const uint64_t unit = balanced_unit(k);
  {
    std::lock_guard<std::mutex> g(meta_);
    std::vector<uint32_t> healthy;
    for (uint32_t d = 0; d < drives_.size(); ++d)
      if (!drives_[d]->failed && drives_[d]->slots.free_count() > 0) healthy.push_back(d);
    if (!healthy.empty()) {
      // Stripe the batch over the healthy drives in contiguous chunks (one
      // sequential stream per drive), starting from a rotating drive; what a
      // full drive cannot take goes to the next.
      size_t nd = healthy.size();
      size_t chunk = (k + nd - 1) / nd;
      size_t start = rr_++ % nd;
      std::vector<std::pair<uint32_t, uint32_t>> got_runs;
      for (int pass = 0; pass < 2 && placed < k; ++pass) {
        for (size_t j = 0; j < nd && placed < k; ++j) {
          uint32_t d = healthy[(start + j) % nd];
          Drive& dr = *drives_[d];
          size_t want = pass == 0 ? std::min(chunk, k - placed) : k - placed;
          got_runs.clear();
          dr.slots.take(static_cast<uint32_t>(want), &got_runs);
          for (auto& [s, len] : got_runs) {
            // split into write units
            for (uint32_t o = 0; o < len; o += static_cast<uint32_t>(unit)) {
              uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(unit), len - o);
              runs.push_back(Run{d, s + o, n, placed, 0});
              placed += n;
            }
          }
        }
      }
    }
    uint64_t seq0 = seq_.fetch_add(placed);
    for (auto& r : runs) r.seq0 = seq0 + r.first;
  }
  if (placed < k) no_space_ += k - placed;
  // `runs` index blocks by placement order; placement order == batch order.

  std::vector<uint32_t> hcrcs(k, 0);  // each slot header's crc, for the journal
  std::vector<std::function<void()>> tasks;
  tasks.reserve(runs.size());
  const Geom g = make_geom(block_bytes_, opt_.parts);
  for (const Run& r : runs) {
    tasks.push_back([this, r, keys, data, handles, &hcrcs, &g] {
      Drive& dr = *drives_[r.drive];
      size_t bytes = static_cast<size_t>(r.len) * slot_bytes_;
      size_t done = 0;
      int e = 0;
      try {
        uint8_t* buf = tl_buf.get(bytes);
        for (uint32_t j = 0; j < r.len; ++j) {
          uint8_t* s = buf + j * slot_bytes_;
          size_t i = r.first + j;
          uint32_t slot = r.start + j;
          uint32_t combined = 0;
          for (uint32_t p = 0; p < g.parts; ++p) {
            uint8_t hc[4];
            put32(hc, encode_part(s + p * g.part_stride, g, p, slot, keys + i * kKeyBytes, r.seq0 + j,
                                  data + i * block_bytes_ + p * g.part_bytes));
            combined = crc32c(combined, hc, 4);
          }
          hcrcs[i] = g.parts == 1 ? get32(s + 60) : combined;
        }
        ssize_t w = do_pwrite(dr, buf, bytes, kDataOffset + static_cast<uint64_t>(r.start) * slot_bytes_);
        if (w < 0) e = errno;
        else {
          done = static_cast<size_t>(w);
          if (done < bytes) e = errno ? errno : EIO;
        }
      } catch (const std::bad_alloc&) {
        e = ENOMEM;
      }
      uint32_t complete = static_cast<uint32_t>(done / slot_bytes_);
      for (uint32_t j = 0; j < complete; ++j) handles[r.first + j] = static_cast<int64_t>(dr.base + r.start + j);
      dr.blocks_written += complete;
      dr.payload_written += complete * block_bytes_;
      if (complete < r.len) {
        dr.write_errors += r.len - complete;
        if (e != ENOMEM)
          mark_failed(dr, e, "write of " + std::to_string(bytes) + " bytes at slot " + std::to_string(r.start) +
                                 " of " + dr.path + " failed: " + errstr(e));
        std::lock_guard<std::mutex> g(meta_);
        dr.slots.give_back(r.start + complete, r.len - complete);
      }
    });
  }
  run_tasks(tasks);

  if (opt_.durable) {
    std::vector<char> touched(drives_.size(), 0);
    for (const Run& r : runs) touched[r.drive] = 1;
    for (size_t d = 0; d < drives_.size(); ++d) {
      if (!touched[d]) continue;
      Drive& dr = *drives_[d];
      if (::fdatasync(dr.fd) == 0) continue;
      int e = errno;
      mark_failed(dr, e, "fdatasync of " + dr.path + " failed: " + errstr(e));
      std::lock_guard<std::mutex> g(meta_);
      for (const Run& r : runs) {
        if (r.drive != d) continue;
        for (uint32_t j = 0; j < r.len; ++j) {
          if (handles[r.first + j] >= 0) {
            handles[r.first + j] = -1;
            dr.write_errors++;
            dr.slots.give_back(r.start + j, 1);
          }
        }
      }
    }
  }

  // Every completed block into its drive's slot table and journal before
  // write() returns: an acknowledged block is in the journal.
  for (size_t d = 0; d < drives_.size(); ++d) {
    std::vector<FoundRecord> recs;
    std::vector<size_t> idx;
    for (const Run& r : runs) {
      if (r.drive != d) continue;
      for (uint32_t j = 0; j < r.len; ++j) {
        size_t i = r.first + j;
        if (handles[i] < 0) continue;
        FoundRecord rec{r.seq0 + j, r.start + j, {}, hcrcs[i]};
        std::memcpy(rec.key.data(), keys + i * kKeyBytes, kKeyBytes);
        recs.push_back(rec);
        idx.push_back(i);
      }
    }
    if (!recs.empty()) journal_written(*drives_[d], recs, idx, handles);
  }
}

void SsdStore::sync() {
  std::shared_lock<std::shared_mutex> life(life_);
  check_open();
  if (opt_.read_only) return;  // a reader wrote nothing
  for (auto& d : drives_) {
    if (d->fd < 0 || d->failed) continue;
    if (::fdatasync(d->fd) != 0) {
      int e = errno;
      mark_failed(*d, e, "fdatasync of " + d->path + " failed: " + errstr(e));
    }
  }
}

// ---------------------------------------------------------------------------
// Read
// ---------------------------------------------------------------------------
// The blocks of a read by drive and slot; bad handles and unopened drives
// zero their `row_bytes` output row and leave ok 0.
std::vector<SsdStore::ReadReq> SsdStore::read_requests(size_t k, const int64_t* handles, uint8_t* out,
                                                       uint64_t row_bytes, uint8_t* ok) {
  std::vector<ReadReq> reqs;
  reqs.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    ok[i] = 0;
    int64_t h = handles[i];
    if (h < 0 || static_cast<uint64_t>(h) >= total_slots_) {
      bad_handles_++;
      std::memset(out + i * row_bytes, 0, row_bytes);
      continue;
    }
    uint32_t d = 0;
    while (d + 1 < drives_.size() && drives_[d + 1]->base <= static_cast<uint64_t>(h)) ++d;
    if (drives_[d]->fd < 0) {
      drives_[d]->read_errors++;
      std::memset(out + i * row_bytes, 0, row_bytes);
      continue;
    }
    reqs.push_back(ReadReq{d, static_cast<uint32_t>(h - drives_[d]->base), i});
  }
  std::sort(reqs.begin(), reqs.end(), [](const ReadReq& a, const ReadReq& b) {
    return a.drive != b.drive ? a.drive < b.drive : (a.slot != b.slot ? a.slot < b.slot : a.i < b.i);
  });
  return reqs;
}

void SsdStore::read(size_t k, const int64_t* handles, const uint8_t* keys, uint8_t* out, uint8_t* ok) {
  std::shared_lock<std::shared_mutex> life(life_);
  check_open();
  std::vector<ReadReq> reqs = read_requests(k, handles, out, block_bytes_, ok);
  const Geom g = make_geom(block_bytes_, opt_.parts);
  std::vector<std::function<void()>> tasks;
  const uint64_t unit = balanced_unit(reqs.size());
  size_t a = 0;
  while (a < reqs.size()) {
    size_t b = a + 1;
    while (b < reqs.size() && b - a < unit && reqs[b].drive == reqs[a].drive &&
           reqs[b].slot == reqs[b - 1].slot + 1)
      ++b;
    tasks.push_back([this, &reqs, &g, a, b, keys, out, ok] {
      Drive& dr = *drives_[reqs[a].drive];
      size_t n = b - a;
      size_t bytes = n * slot_bytes_;
      size_t done = 0;
      uint8_t* buf = nullptr;
      try {
        buf = tl_buf.get(bytes);
        ssize_t r = do_pread(dr, buf, bytes, kDataOffset + static_cast<uint64_t>(reqs[a].slot) * slot_bytes_);
        if (r > 0) done = static_cast<size_t>(r);
        if (done < bytes) {
          int e = errno;
          std::lock_guard<std::mutex> g(dr.err_m);
          dr.last_errno = e;
          dr.last_error = "read of " + std::to_string(bytes) + " bytes at slot " + std::to_string(reqs[a].slot) +
                          " of " + dr.path + " failed: " + errstr(e);
        }
      } catch (const std::bad_alloc&) {
        done = 0;
      }
      for (size_t j = 0; j < n; ++j) {
        const ReadReq& q = reqs[a + j];
        uint8_t* dst = out + q.i * block_bytes_;
        if ((j + 1) * slot_bytes_ > done) {
          dr.read_errors++;
          std::memset(dst, 0, block_bytes_);
          continue;
        }
        const uint8_t* s = buf + j * slot_bytes_;
        Verdict v = verify_slot(s, q.slot, g, g.part_stride, true, keys + q.i * kKeyBytes);
        if (v == Verdict::kOk) {
          for (uint32_t p = 0; p < g.parts; ++p)
            std::memcpy(dst + p * g.part_bytes, s + p * g.part_stride + kHeaderBytes, g.part_bytes);
          ok[q.i] = 1;
          dr.blocks_read++;
          dr.payload_read += block_bytes_;
        } else {
          if (v == Verdict::kKeyMismatch) dr.key_mismatches++;
          else dr.checksum_failures++;
          std::memset(dst, 0, block_bytes_);
        }
      }
    });
    a = b;
  }
  run_tasks(tasks, /*urgent=*/true);  // reads jump queued background writes
}

void SsdStore::read_part(size_t k, const int64_t* handles, const uint8_t* keys, uint32_t part, uint8_t* out,
                         uint8_t* ok) {
  std::shared_lock<std::shared_mutex> life(life_);
  check_open();
  if (part >= opt_.parts)
    throw std::invalid_argument("part: must be in [0, " + std::to_string(opt_.parts) + "), got " +
                                std::to_string(part));
  const Geom g = make_geom(block_bytes_, opt_.parts);
  std::vector<ReadReq> reqs = read_requests(k, handles, out, g.part_bytes, ok);
  // Parts of neighbouring slots are not adjacent: one read of part_stride
  // bytes per block, `unit` blocks per task.
  std::vector<std::function<void()>> tasks;
  const uint64_t unit = balanced_unit(reqs.size());
  for (size_t a = 0; a < reqs.size(); a += unit) {
    size_t b = std::min<size_t>(reqs.size(), a + unit);
    tasks.push_back([this, &reqs, &g, a, b, part, keys, out, ok] {
      uint8_t* buf = nullptr;
      try {
        buf = tl_buf.get(g.part_stride);
      } catch (const std::bad_alloc&) {
      }
      for (size_t j = a; j < b; ++j) {
        const ReadReq& q = reqs[j];
        Drive& dr = *drives_[q.drive];
        uint8_t* dst = out + q.i * g.part_bytes;
        uint64_t off = kDataOffset + static_cast<uint64_t>(q.slot) * slot_bytes_ + part * g.part_stride;
        ssize_t r = buf ? do_pread(dr, buf, g.part_stride, off) : -1;
        if (r != static_cast<ssize_t>(g.part_stride)) {
          int e = buf ? errno : ENOMEM;
          dr.read_errors++;
          std::memset(dst, 0, g.part_bytes);
          std::lock_guard<std::mutex> eg(dr.err_m);
          dr.last_errno = e;
          dr.last_error = "read of part " + std::to_string(part) + " of slot " + std::to_string(q.slot) + " of " +
                          dr.path + " failed: " + errstr(e);
          continue;
        }
        Verdict v = verify_part(buf, q.slot, g, part, true, keys + q.i * kKeyBytes);
        if (v == Verdict::kOk) {
          std::memcpy(dst, buf + kHeaderBytes, g.part_bytes);
          ok[q.i] = 1;
          dr.blocks_read++;
          dr.payload_read += g.part_bytes;
        } else {
          if (v == Verdict::kKeyMismatch) dr.key_mismatches++;
          else dr.checksum_failures++;
          std::memset(dst, 0, g.part_bytes);
        }
      }
    });
  }
  run_tasks(tasks, /*urgent=*/true);
}

size_t SsdStore::free(size_t k, const int64_t* handles) {
  std::shared_lock<std::shared_mutex> life(life_);
  check_open();
  check_writable();
  std::lock_guard<std::mutex> g(meta_);
  size_t n = 0;
  for (size_t i = 0; i < k; ++i) {
    int64_t h = handles[i];
    if (h < 0 || static_cast<uint64_t>(h) >= total_slots_) {
      bad_frees_++;
      continue;
    }
    uint32_t d = 0;
    while (d + 1 < drives_.size() && drives_[d + 1]->base <= static_cast<uint64_t>(h)) ++d;
    Drive& dr = *drives_[d];
    uint32_t slot = static_cast<uint32_t>(h - dr.base);
    if (dr.fd < 0 || !dr.slots.allocated(slot)) {
      bad_frees_++;
      continue;
    }
    dr.slots.give_back(slot, 1);
    if (slot < dr.meta.size()) dr.meta[slot] = SlotMeta{};
    ++n;
  }
  return n;
}


}  // namespace saria_store
