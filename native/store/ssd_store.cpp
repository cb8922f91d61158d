// SSD tier engine: see ssd_store.h for the on-disk format and the contract.
#include "store/ssd_store.h"
#include "store/store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <unordered_map>


namespace saria_store {

using namespace detail;

// ---------------------------------------------------------------------------
// Store: open, create, recover
// ---------------------------------------------------------------------------
SsdStore::SsdStore(const StoreOptions& opt) : opt_(opt) {
  if (opt_.dirs.empty()) throw std::invalid_argument("dirs: at least one drive directory is needed");
  if (!opt_.read_only && opt_.capacity_bytes.size() != opt_.dirs.size())
    throw std::invalid_argument("capacity_bytes: one capacity per drive is needed (" +
                                std::to_string(opt_.dirs.size()) + " drives, " +
                                std::to_string(opt_.capacity_bytes.size()) + " capacities)");
  if (opt_.block_bytes == 0 || opt_.block_bytes > (1ull << 30))
    throw std::invalid_argument("block_bytes: must be in [1, 2**30], got " + std::to_string(opt_.block_bytes));
  if (opt_.unit_bytes < kAlign)
    throw std::invalid_argument("unit_bytes: must be at least 4096, got " + std::to_string(opt_.unit_bytes));
  if (opt_.threads < 0 || opt_.threads > 1024)
    throw std::invalid_argument("threads: must be in [0, 1024], got " + std::to_string(opt_.threads));
  if (opt_.parts == 0 || opt_.parts > kMaxParts)
    throw std::invalid_argument("parts: must be in [1, " + std::to_string(kMaxParts) + "], got " +
                                std::to_string(opt_.parts));
  if (opt_.block_bytes % opt_.parts != 0)
    throw std::invalid_argument("parts: block_bytes=" + std::to_string(opt_.block_bytes) +
                                " does not split into " + std::to_string(opt_.parts) + " equal parts");
  block_bytes_ = opt_.block_bytes;
  {
    Geom g = make_geom(block_bytes_, opt_.parts);
    part_stride_ = g.part_stride;
    slot_bytes_ = g.slot_bytes;
  }
  unit_slots_ = std::max<uint64_t>(1, opt_.unit_bytes / slot_bytes_);
  uint64_t base = 0;
  for (size_t d = 0; d < opt_.dirs.size(); ++d) {
    auto dr = std::make_unique<Drive>();
    dr->dir = opt_.dirs[d];
    while (dr->dir.size() > 1 && dr->dir.back() == '/') dr->dir.pop_back();
    dr->path = dr->dir + "/" + kDataFileName;
    if (opt_.read_only) {
      try {
        open_reader(*dr);  // sets n_slots from the superblock
      } catch (...) {
        for (auto& x : drives_)
          if (x->fd >= 0) ::close(x->fd);
        if (dr->fd >= 0) ::close(dr->fd);
        throw;
      }
    } else {
      uint64_t cap = opt_.capacity_bytes[d];
      if (cap < kDataOffset + slot_bytes_)
        throw std::invalid_argument("capacity_bytes: drive " + std::to_string(d) + " (" + dr->dir +
                                    ") capacity " + std::to_string(cap) + " holds no slot of " +
                                    std::to_string(slot_bytes_) + " bytes (needs at least " +
                                    std::to_string(kDataOffset + slot_bytes_) + ")");
      dr->n_slots = (cap - kDataOffset) / slot_bytes_;
    }
    dr->base = base;
    base += dr->n_slots;
    drives_.push_back(std::move(dr));
  }
  if (base > 0xFFFFFFFFull)
    throw std::invalid_argument("capacity_bytes: " + std::to_string(base) +
                                " slots in all exceed the 2**32 handle space; use larger blocks or less capacity");
  total_slots_ = base;
  for (size_t i = 0; i + 1 < drives_.size(); ++i)
    for (size_t j = i + 1; j < drives_.size(); ++j)
      if (drives_[i]->dir == drives_[j]->dir)
        throw std::invalid_argument("dirs: directory " + drives_[i]->dir + " is given twice");

  nthreads_ = opt_.threads > 0 ? opt_.threads : static_cast<int>(4 * drives_.size());
  pool_ = std::make_unique<ThreadPool>(nthreads_);
  if (opt_.read_only) {
    for (auto& dr : drives_) dr->slots.reset(dr->n_slots);
    return;
  }

  size_t usable = 0;
  for (size_t d = 0; d < drives_.size(); ++d) {
    Drive& dr = *drives_[d];
    dr.slots.reset(dr.n_slots);
    try {
      open_drive(d, static_cast<uint32_t>(d));
      ++usable;
    } catch (const OsFailure& e) {
      if (!opt_.allow_degraded) {
        pool_.reset();
        release_all();
        throw;
      }
      mark_failed(dr, e.err, e.what());
    } catch (...) {
      pool_.reset();
      release_all();
      throw;
    }
  }
  if (usable == 0) {
    pool_.reset();
    release_all();
    throw OsFailure(drives_[0]->last_errno, "no drive could be opened; first error: " + drives_[0]->last_error);
  }

  // Recovery: from each usable drive's journal when it is usable, else a
  // scan of the drive; keep the newest record per key.
  std::vector<std::vector<FoundRecord>> found(drives_.size());
  bool from_journal = false;
  const char* scan = opt_.full_scan ? "full scan" : "header scan";
  for (size_t d = 0; d < drives_.size(); ++d) {
    Drive& dr = *drives_[d];
    if (dr.fd < 0) continue;
    dr.meta.assign(dr.n_slots, SlotMeta{});
    if (dr.created) {
      dr.recovery_source = "created";
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string why;
    if (opt_.journal && opt_.open_from_journal && load_journal(dr, &found[d], &why)) {
      dr.recovery_source = "journal";
      from_journal = true;
    } else {
      dr.recovery_source = opt_.journal && opt_.open_from_journal ? std::string(scan) + " (" + why + ")" : scan;
      scan_drive(d, &found[d]);
    }
    dr.recovery_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - t0).count());
  }
  uint64_t max_seq = 0;
  std::vector<Survivor> survivors = newest_per_key(found, &max_seq);
  // A journal does not list a write that died before its entry landed; its
  // record may sit in a (now free) slot with a higher sequence number than
  // any entry. Resume far above it: fewer than 2**32 writes are ever in flight.
  seq_ = max_seq + 1 + (from_journal ? (1ull << 32) : 0);
  std::vector<uint64_t> newest(drives_.size(), 0);
  std::vector<uint32_t> cursor(drives_.size(), 0);
  recovered_.keys.reserve(survivors.size() * kKeyBytes);
  for (const Survivor& s : survivors) {
    Drive& dr = *drives_[s.drive];
    dr.slots.mark(s.slot);
    dr.meta[s.slot] = SlotMeta{s.seq, s.hcrc, s.key};
    dr.recovered++;
    recovered_.keys.insert(recovered_.keys.end(), s.key.begin(), s.key.end());
    recovered_.handles.push_back(static_cast<int64_t>(dr.base + s.slot));
    recovered_.seqs.push_back(s.seq);
    if (s.seq >= newest[s.drive]) {  // the log goes on after its newest record
      newest[s.drive] = s.seq;
      cursor[s.drive] = s.slot + 1;
    }
  }
  for (size_t d = 0; d < drives_.size(); ++d)
    if (drives_[d]->fd >= 0) drives_[d]->slots.rebuild(cursor[d]);

  // A fresh checkpoint of what was recovered (or no journal at all), before
  // the first write.
  for (auto& dp : drives_) {
    Drive& dr = *dp;
    if (dr.fd < 0) continue;
    try {
      if (opt_.journal) {
        std::lock_guard<std::mutex> jg(dr.jm);
        write_checkpoint(dr);
      } else {
        drop_journal(dr);
      }
    } catch (const OsFailure& e) {
      if (!opt_.allow_degraded) {
        pool_.reset();
        release_all();
        throw;
      }
      dr.jbroken = opt_.journal;
      mark_failed(dr, e.err, e.what());
    }
  }
}

SsdStore::~SsdStore() { close(); }

void SsdStore::create_file(Drive& dr, uint32_t index) {
  std::string tmp = dr.path + ".tmp";
  ::unlink(tmp.c_str());
  int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (opt_.direct ? O_DIRECT : 0);
  int fd = ::open(tmp.c_str(), flags, 0600);  // the KV of every cached prompt: this user's only
  if (fd < 0) {
    int e = errno;
    throw OsFailure(e, "drive " + dr.dir + ": cannot create " + tmp + ": " + errstr(e) +
                           (e == EINVAL && opt_.direct ? " (the filesystem may not support O_DIRECT)" : ""));
  }
  auto fail = [&](const std::string& what, int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw OsFailure(e, "drive " + dr.dir + ": " + what + ": " + errstr(e));
  };
  uint64_t size = kDataOffset + dr.n_slots * slot_bytes_;
  if (opt_.preallocate) {
    int r = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (r != 0) fail("fallocate " + std::to_string(size) + " bytes", r);
  } else if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    fail("ftruncate " + std::to_string(size) + " bytes", errno);
  }
  uint8_t* sb = tl_buf.get(kAlign);
  std::memset(sb, 0, kAlign);
  std::memcpy(sb, kSuperMagic, 8);
  put32(sb + 8, opt_.parts == 1 ? kFormatVersion : kPartsFormatVersion);
  put32(sb + 12, static_cast<uint32_t>(kHeaderBytes));
  put64(sb + 16, block_bytes_);
  put64(sb + 24, slot_bytes_);
  put64(sb + 32, dr.n_slots);
  put64(sb + 40, kDataOffset);
  put64(sb + 48, static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count()));
  std::random_device rd;
  for (int i = 0; i < 16; i += 4) put32(sb + 56 + i, rd());
  put32(sb + 72, index);
  put32(sb + kSuperCrcAt, crc32c(0, sb, kSuperCrcAt));
  if (opt_.parts != 1) {
    put32(sb + kSuperPartsAt, opt_.parts);
    put32(sb + kSuperPartsCrcAt, crc32c(0, sb, kSuperPartsCrcAt));
  }
  std::memcpy(dr.store_id.data(), sb + 56, 16);
  dr.fd = fd;
  int e = 0;
  size_t n = 0;
  {
    // Superblock write: counted like every other byte written to the drive.
    ssize_t r;
    do {
      r = ::pwrite(fd, sb, kAlign, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) e = errno;
    else n = static_cast<size_t>(r);
    dr.bytes_written += n;
  }
  dr.fd = -1;
  if (e != 0 || n != kAlign) fail("write superblock", e ? e : EIO);
  if (::fdatasync(fd) != 0) fail("fdatasync", errno);
  if (::rename(tmp.c_str(), dr.path.c_str()) != 0) fail("rename to " + dr.path, errno);
  int dfd = ::open(dr.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  dr.fd = fd;
}

void SsdStore::release_all() {
  for (auto& x : drives_) {
    if (x->jfd >= 0) ::close(x->jfd);
    x->jfd = -1;
    if (x->fd >= 0) ::close(x->fd);
    if (x->owner_fd >= 0) ::close(x->owner_fd);
    x->fd = x->owner_fd = -1;
  }
}

void SsdStore::check_superblock(const uint8_t* sb, const Drive& dr, bool know_slots) {
  if (std::memcmp(sb, kSuperMagic, 8) != 0 || crc32c(0, sb, kSuperCrcAt) != get32(sb + kSuperCrcAt))
    throw std::invalid_argument("dirs: " + dr.path + " is not a saria SSD data file (bad or torn superblock); "
                                "move it away");
  uint32_t parts = 0;
  std::string why;
  if (!superblock_parts(sb, &parts, &why)) throw std::invalid_argument("dirs: " + dr.path + " " + why);
  if (parts != opt_.parts)
    throw std::invalid_argument("parts: " + dr.path + " was created with parts=" + std::to_string(parts) +
                                " (one slot part per tensor-parallel rank), not " + std::to_string(opt_.parts) +
                                "; open it with the same parts, or give this engine another directory");
  if (get64(sb + 16) != block_bytes_)
    throw std::invalid_argument("block_bytes: " + dr.path + " was created with block_bytes=" +
                                std::to_string(get64(sb + 16)) + ", not " + std::to_string(block_bytes_));
  if (get64(sb + 24) != slot_bytes_ || get64(sb + 40) != kDataOffset)
    throw std::invalid_argument("dirs: " + dr.path + " has an unexpected slot layout");
  if (know_slots && get64(sb + 32) != dr.n_slots)
    throw std::invalid_argument("capacity_bytes: " + dr.path + " was created with " + std::to_string(get64(sb + 32)) +
                                " slots (capacity " + std::to_string(kDataOffset + get64(sb + 32) * slot_bytes_) +
                                " bytes), not " + std::to_string(dr.n_slots) + "; open it with the same capacity");
}

void SsdStore::open_reader(Drive& dr) {
  int fd = ::open(dr.path.c_str(), O_RDONLY | O_CLOEXEC | (opt_.direct ? O_DIRECT : 0));
  if (fd < 0) {
    int e = errno;
    throw OsFailure(e, "drive " + dr.dir + ": cannot open " + dr.path + " to read: " + errstr(e));
  }
  dr.fd = fd;
  uint8_t* sb = tl_buf.get(kAlign);
  ssize_t r;
  do {
    r = ::pread(fd, sb, kAlign, 0);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    int e = errno;
    throw OsFailure(e, "drive " + dr.dir + ": cannot read the superblock: " + errstr(e));
  }
  dr.recovery_bytes_read += static_cast<uint64_t>(r);
  if (r != static_cast<ssize_t>(kAlign))
    throw std::invalid_argument("dirs: " + dr.path + " is shorter than a superblock");
  check_superblock(sb, dr, false);
  dr.n_slots = get64(sb + 32);
}

void SsdStore::take_ownership(Drive& dr) {
  std::string path = dr.dir + "/" + kOwnerFileName;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    int e = errno;
    throw OsFailure(e, "drive " + dr.dir + ": cannot open " + path + ": " + errstr(e));
  }
  try {
    make_private(fd, path, "drive " + dr.dir);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char buf[64] = {0};
    ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (e == EWOULDBLOCK)
      throw OsFailure(EBUSY, "drive " + dr.dir + " is in use by another saria cache (pid " + holder +
                                 "); give each cache its own directory, or share one through saria serve");
    throw OsFailure(e, "drive " + dr.dir + ": cannot lock " + path + ": " + errstr(e));
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    int e = errno;
    ::close(fd);
    throw OsFailure(e, "drive " + dr.dir + ": cannot write " + path + ": " + errstr(e));
  }
  dr.owner_fd = fd;
}

void SsdStore::open_drive(size_t d, uint32_t index) {
  Drive& dr = *drives_[d];
  struct stat st;
  if (::stat(dr.dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      int e = errno;
      throw OsFailure(e, "drive " + dr.dir + ": " + errstr(e));
    }
    if (::mkdir(dr.dir.c_str(), 0700) != 0 && errno != EEXIST) {
      int e = errno;
      throw OsFailure(e, "drive " + dr.dir + ": cannot create the directory: " + errstr(e));
    }
  } else if (!S_ISDIR(st.st_mode)) {
    throw OsFailure(ENOTDIR, "drive " + dr.dir + ": not a directory");
  } else if (st.st_mode & (S_ISVTX | S_IWOTH)) {  // /tmp, /dev/shm: never chmod a shared folder
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw OsFailure(EPERM, "drive " + dr.dir + ": a folder every user may write to (mode " + mode +
                               "); give saria a folder of its own inside it");
  }
  {
    int dfd = ::open(dr.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      int e = errno;
      throw OsFailure(e, "drive " + dr.dir + ": cannot open the directory: " + errstr(e));
    }
    try {
      make_private(dfd, dr.dir, "drive " + dr.dir);  // 0700: no other user lists or reads it
    } catch (...) {
      ::close(dfd);
      throw;
    }
    ::close(dfd);
  }
  take_ownership(dr);
  int flags = O_RDWR | O_CLOEXEC | (opt_.direct ? O_DIRECT : 0);
  int fd = ::open(dr.path.c_str(), flags);
  if (fd < 0 && errno == ENOENT) {
    create_file(dr, index);
    dr.created = true;
  } else if (fd < 0) {
    int e = errno;
    throw OsFailure(e, "drive " + dr.dir + ": cannot open " + dr.path + ": " + errstr(e) +
                           (e == EINVAL && opt_.direct ? " (the filesystem may not support O_DIRECT)" : ""));
  } else {
    dr.fd = fd;
    try {
      make_private(fd, dr.path, "drive " + dr.dir);
    } catch (...) {
      ::close(fd);
      dr.fd = -1;
      throw;
    }
    uint8_t* sb = tl_buf.get(kAlign);
    int e = 0;
    ssize_t r;
    do {
      r = ::pread(fd, sb, kAlign, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) e = errno;
    else dr.recovery_bytes_read += static_cast<uint64_t>(r);
    auto bad = [&](const std::string& msg) {
      ::close(fd);
      dr.fd = -1;
      throw std::invalid_argument(msg);
    };
    if (e != 0) {
      ::close(fd);
      dr.fd = -1;
      throw OsFailure(e, "drive " + dr.dir + ": cannot read the superblock: " + errstr(e));
    }
    if (r != static_cast<ssize_t>(kAlign))
      bad("dirs: " + dr.path + " is not a saria SSD data file (bad or torn superblock); move it away");
    try {
      check_superblock(sb, dr, true);
    } catch (const std::invalid_argument& ex) {
      bad(ex.what());
    }
    std::memcpy(dr.store_id.data(), sb + 56, 16);
    struct stat fst;
    if (::fstat(fd, &fst) == 0 && static_cast<uint64_t>(fst.st_size) < kDataOffset + dr.n_slots * slot_bytes_)
      bad("dirs: " + dr.path + " is shorter than its superblock says (truncated?)");
  }
  struct stat fst;
  if (::fstat(dr.fd, &fst) == 0) {
    dr.dev = fst.st_dev;
    dr.ino = fst.st_ino;
  }
}

void SsdStore::scan_drive(size_t d, std::vector<FoundRecord>* out) {
  Drive& dr = *drives_[d];
  // Header-only scans of big slots read just the first page of each slot.
  bool headers_only = !opt_.full_scan && slot_bytes_ > (64u << 10);
  const uint32_t parts = opt_.parts;
  uint64_t chunk_slots = headers_only ? 64 : std::max<uint64_t>(unit_slots_, (4ull << 20) / slot_bytes_);
  chunk_slots = std::max<uint64_t>(chunk_slots, 1);
  std::mutex m;
  std::vector<std::function<void()>> tasks;
  std::atomic<int> io_err{0};
  for (uint64_t s0 = 0; s0 < dr.n_slots; s0 += chunk_slots) {
    uint64_t n = std::min(chunk_slots, dr.n_slots - s0);
    tasks.push_back([&, s0, n] {
      std::vector<FoundRecord> local;
      uint64_t invalid = 0;
      try {
        if (headers_only) {
          // the first page of every part
          uint8_t* buf = tl_buf.get(kAlign * parts);
          for (uint64_t j = 0; j < n; ++j) {
            uint32_t slot = static_cast<uint32_t>(s0 + j);
            int e = 0;
            bool whole = true;
            for (uint32_t p = 0; p < parts && whole; ++p) {
              ssize_t r;
              uint64_t off = kDataOffset + slot * slot_bytes_ + p * part_stride_;
              do {
                r = ::pread(dr.fd, buf + p * kAlign, kAlign, static_cast<off_t>(off));
              } while (r < 0 && errno == EINTR);
              if (r < 0) e = errno;
              else dr.recovery_bytes_read += static_cast<size_t>(r);
              whole = r == static_cast<ssize_t>(kAlign);
            }
            if (!whole) {
              io_err = e ? e : EIO;
              dr.read_errors++;
              continue;
            }
            invalid += find_records(buf, 1, slot, kAlign * parts, block_bytes_, false, &local, parts, kAlign);
          }
        } else {
          size_t bytes = n * slot_bytes_;
          uint8_t* buf = tl_buf.get(bytes);
          int e = 0;
          size_t got = 0;
          uint64_t off = kDataOffset + s0 * slot_bytes_;
          while (got < bytes) {
            ssize_t r = ::pread(dr.fd, buf + got, bytes - got, static_cast<off_t>(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
              e = r < 0 ? errno : EIO;
              break;
            }
            got += static_cast<size_t>(r);
          }
          dr.recovery_bytes_read += got;
          if (e) {
            io_err = e;
            dr.read_errors++;
          }
          invalid += find_records(buf, got / slot_bytes_, static_cast<uint32_t>(s0), slot_bytes_,
                                  block_bytes_, true, &local, parts);
        }
      } catch (const std::bad_alloc&) {
        io_err = ENOMEM;
      }
      std::lock_guard<std::mutex> g(m);
      out->insert(out->end(), local.begin(), local.end());
      dr.invalid_slots += invalid;
    });
  }
  run_tasks(tasks);
  if (io_err.load())
    mark_failed(dr, io_err.load(), "read error while scanning " + dr.path + " at open: " + errstr(io_err.load()));
}

// ---------------------------------------------------------------------------
// Health, fault injection, raw I/O
// ---------------------------------------------------------------------------
void SsdStore::mark_failed(Drive& dr, int err, const std::string& what) {
  std::lock_guard<std::mutex> g(dr.err_m);
  dr.failed = true;
  dr.last_errno = err;
  dr.last_error = what;
}

bool SsdStore::path_ok(Drive& dr) {
  struct stat st;
  if (::stat(dr.path.c_str(), &st) != 0) {
    int e = errno;
    mark_failed(dr, e, "data file " + dr.path + " is no longer reachable: " + errstr(e));
    return false;
  }
  if (st.st_dev != dr.dev || st.st_ino != dr.ino) {
    mark_failed(dr, ESTALE, "data file " + dr.path + " was replaced by another file");
    return false;
  }
  return true;
}

bool SsdStore::injected(Drive& dr, int op, int* err) {
  if (!dr.has_injection.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> g(dr.inj_m);
  Injection& in = op == 1 ? dr.inj_write : op == 2 ? dr.inj_journal : dr.inj_read;
  if (in.count <= 0) return false;
  if (in.skip > 0) {
    --in.skip;
    return false;
  }
  --in.count;
  *err = in.err;
  dr.injected++;
  if (dr.inj_write.count <= 0 && dr.inj_read.count <= 0 && dr.inj_journal.count <= 0) dr.has_injection = false;
  return true;
}

// Full pwrite/pread with retry on EINTR and short transfers. Returns the bytes
// transferred; *err is 0 iff all n bytes were transferred.
ssize_t SsdStore::do_pwrite(Drive& dr, const void* buf, size_t n, uint64_t off) {
  int e = 0;
  if (injected(dr, 1, &e)) {
    errno = e;
    return -1;
  }
  size_t done = 0;
  const auto* p = static_cast<const uint8_t*>(buf);
  while (done < n) {
    ssize_t r = ::pwrite(dr.fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      e = errno;
      break;
    }
    if (r == 0) {
      e = ENOSPC;
      break;
    }
    done += static_cast<size_t>(r);
  }
  dr.bytes_written += done;
  if (done < n) {
    errno = e;
    return done > 0 ? static_cast<ssize_t>(done) : -1;
  }
  return static_cast<ssize_t>(done);
}

ssize_t SsdStore::do_pread(Drive& dr, void* buf, size_t n, uint64_t off) {
  int e = 0;
  if (injected(dr, 0, &e)) {
    errno = e;
    return -1;
  }
  size_t done = 0;
  auto* p = static_cast<uint8_t*>(buf);
  while (done < n) {
    ssize_t r = ::pread(dr.fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      e = errno;
      break;
    }
    if (r == 0) {
      e = EIO;  // unexpected end of file
      break;
    }
    done += static_cast<size_t>(r);
  }
  dr.bytes_read += done;
  if (done < n) {
    errno = e;
    return done > 0 ? static_cast<ssize_t>(done) : -1;
  }
  return static_cast<ssize_t>(done);
}

void SsdStore::inject_failure(int drive, int op, int err, int64_t count, int64_t skip) {
  check_open();
  if (drive < 0 || static_cast<size_t>(drive) >= drives_.size())
    throw std::invalid_argument("drive: no drive " + std::to_string(drive));
  Drive& dr = *drives_[drive];
  std::lock_guard<std::mutex> g(dr.inj_m);
  Injection& in = op == 1 ? dr.inj_write : op == 2 ? dr.inj_journal : dr.inj_read;
  in.err = err;
  in.count = count;
  in.skip = skip;
  dr.has_injection = dr.inj_write.count > 0 || dr.inj_read.count > 0 || dr.inj_journal.count > 0;
}

void SsdStore::revive(int drive) {
  check_open();
  if (drive < 0 || static_cast<size_t>(drive) >= drives_.size())
    throw std::invalid_argument("drive: no drive " + std::to_string(drive));
  Drive& dr = *drives_[drive];
  if (dr.fd < 0) throw OsFailure(EBADF, "drive " + dr.dir + " was never opened; reopen the store");
  if (!path_ok(dr)) return;
  if (opt_.journal && !opt_.read_only) {
    std::lock_guard<std::mutex> jg(dr.jm);
    if (dr.jbroken) {
      try {
        write_checkpoint(dr);  // a journal to go on with, or the drive stays failed
      } catch (const OsFailure& e) {
        dr.jbroken = true;
        mark_failed(dr, e.err, e.what());
        return;
      }
    }
  }
  dr.failed = false;
}

void SsdStore::check_drives() {
  std::shared_lock<std::shared_mutex> life(life_);
  if (closed_) return;
  for (auto& d : drives_)
    if (!d->failed && d->fd >= 0) path_ok(*d);
}

void SsdStore::check_open() const {
  if (closed_) throw std::runtime_error("the SSD store is closed");
}

uint64_t SsdStore::free_slots() {
  std::lock_guard<std::mutex> g(meta_);
  uint64_t n = 0;
  for (auto& d : drives_)
    if (!d->failed) n += d->slots.free_count();
  return n;
}

Recovered SsdStore::take_recovered() {
  Recovered r = std::move(recovered_);
  recovered_ = Recovered{};
  return r;
}

std::vector<DriveStats> SsdStore::stats() {
  std::vector<DriveStats> v;
  std::lock_guard<std::mutex> g(meta_);
  for (auto& dp : drives_) {
    Drive& d = *dp;
    DriveStats s;
    s.path = d.dir;
    s.n_slots = d.n_slots;
    s.free_slots = d.slots.free_count();
    s.base = d.base;
    s.bytes_written = d.bytes_written;
    s.bytes_read = d.bytes_read;
    s.payload_bytes_written = d.payload_written;
    s.payload_bytes_read = d.payload_read;
    s.blocks_written = d.blocks_written;
    s.blocks_read = d.blocks_read;
    s.write_errors = d.write_errors;
    s.read_errors = d.read_errors;
    s.checksum_failures = d.checksum_failures;
    s.key_mismatches = d.key_mismatches;
    s.injected_failures = d.injected;
    s.recovered_blocks = d.recovered;
    s.recovery_invalid_slots = d.invalid_slots;
    s.recovery_bytes_read = d.recovery_bytes_read;
    s.recovery_ns = d.recovery_ns;
    s.recovery_source = d.recovery_source;
    s.journal_bytes_written = d.journal_written;
    s.journal_entries = d.jentries;
    s.journal_generation = d.jgen;
    s.checkpoints = d.checkpoints;
    s.journal_dropped_tail = d.dropped_tail;
    s.scrub_bytes_read = d.scrub_read;
    s.scrub_slots_checked = d.scrub_checked;
    s.scrub_bad_slots = d.scrub_bad;
    s.failed = d.failed;
    std::lock_guard<std::mutex> ge(d.err_m);
    s.last_errno = d.last_errno;
    s.last_error = d.last_error;
    v.push_back(std::move(s));
  }
  return v;
}

void SsdStore::close() {
  std::unique_lock<std::shared_mutex> life(life_);
  if (closed_) return;
  closed_ = true;
  pool_.reset();
  for (auto& d : drives_) {
    if (d->jfd >= 0) {
      ::close(d->jfd);  // every append was written before its write() returned
      d->jfd = -1;
    }
    if (d->fd >= 0) {
      if (opt_.durable && !d->failed && !opt_.read_only) ::fdatasync(d->fd);
      ::close(d->fd);
      d->fd = -1;
    }
    if (d->owner_fd >= 0) {  // closing the lock's only descriptor releases it
      ::close(d->owner_fd);
      d->owner_fd = -1;
    }
  }
}

}  // namespace saria_store
