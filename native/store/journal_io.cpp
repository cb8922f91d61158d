// The SSD store's journal I/O: reading it at open, appending entries after
// writes, checkpoints; the background scrub; the offline drive check. The
// format and its rules are in journal.h.
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "store/journal.h"
#include "store/ssd_store.h"
#include "store/store_internal.h"

namespace saria_store {

using namespace detail;

namespace {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Aligned = std::unique_ptr<uint8_t, FreeDeleter>;

Aligned aligned(size_t n) {
  void* q = nullptr;
  if (posix_memalign(&q, kAlign, std::max<size_t>(n, kAlign)) != 0) throw std::bad_alloc();
  return Aligned(static_cast<uint8_t*>(q));
}

// Reads a whole file (a multiple of 4096 bytes) into an aligned buffer.
// Returns false with *why set when it is missing or unreadable.
bool read_whole(const std::string& path, bool direct, Aligned* out, size_t* n, uint64_t* counted,
                std::string* why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) {
    *why = errno == ENOENT ? "missing " + path : "cannot open " + path + ": " + errstr(errno);
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kAlign) || st.st_size % kAlign != 0) {
    ::close(fd);
    *why = path + " has a size that is not a whole number of pages";
    return false;
  }
  size_t size = static_cast<size_t>(st.st_size);
  *out = aligned(size);
  size_t got = 0;
  while (got < size) {
    ssize_t r = ::pread(fd, out->get() + got, size - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  *counted += got;
  if (got < size) {
    *why = "short read of " + path;
    return false;
  }
  *n = size;
  return true;
}

bool same_file(const JournalHeader& h, const JournalHeader& want, const std::string& path, std::string* why) {
  if (h.block_bytes != want.block_bytes || h.n_slots != want.n_slots || h.store_id != want.store_id) {
    *why = path + " belongs to another data file";
    return false;
  }
  return true;
}

// The journal of a drive directory: the entries it holds (checkpoint and
// segment, newest per slot), or false and why it is unusable.
bool read_journal(const std::string& dir, bool direct, const JournalHeader& want, std::vector<FoundRecord>* out,
                  uint64_t* bytes, uint64_t* gen, uint64_t* dropped, std::string* why) {
  Aligned ck, sg;
  size_t nck = 0, nsg = 0;
  std::string cpath = dir + "/" + kCheckpointFileName, spath = dir + "/" + kSegmentFileName;
  if (!read_whole(cpath, direct, &ck, &nck, bytes, why)) return false;
  JournalHeader ch, sh;
  if (!decode_header(ck.get(), true, &ch)) {
    *why = cpath + " has a bad header";
    return false;
  }
  if (!same_file(ch, want, cpath, why)) return false;
  if (ch.count > (nck - kAlign) / kEntryBytes ||
      crc32c(0, ck.get() + kAlign, ch.count * kEntryBytes) != ch.body_crc) {
    *why = cpath + " is torn or corrupt (entry crc)";
    return false;
  }
  std::vector<FoundRecord> all;
  all.reserve(ch.count);
  SegmentScan cs = scan_entries(ck.get() + kAlign, ch.count, static_cast<uint32_t>(want.block_bytes), ch.gen,
                                want.n_slots, &all);
  if (cs.corrupt || cs.valid != ch.count) {
    *why = cpath + " holds a bad entry";
    return false;
  }
  if (!read_whole(spath, direct, &sg, &nsg, bytes, why)) return false;
  if (!decode_header(sg.get(), false, &sh)) {
    *why = spath + " has a bad header";
    return false;
  }
  if (!same_file(sh, want, spath, why)) return false;
  if (sh.gen > ch.gen) {
    *why = spath + " is newer than its checkpoint";
    return false;
  }
  *dropped = 0;
  if (sh.gen == ch.gen) {  // an older segment is already in the checkpoint
    SegmentScan ss = scan_entries(sg.get() + kAlign, (nsg - kAlign) / kEntryBytes,
                                  static_cast<uint32_t>(want.block_bytes), sh.gen, want.n_slots, &all);
    if (ss.corrupt) {
      *why = spath + " holds a bad entry before good ones";
      return false;
    }
    *dropped = ss.dropped_tail;
  }
  *gen = ch.gen;
  *out = newest_per_slot(all);
  return true;
}

ssize_t pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pwrite(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) {
      errno = ENOSPC;
      return -1;
    }
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

void fsync_dir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

bool SsdStore::load_journal(Drive& dr, std::vector<FoundRecord>* out, std::string* why) {
  JournalHeader want;
  want.block_bytes = block_bytes_;
  want.n_slots = dr.n_slots;
  want.store_id = dr.store_id;
  uint64_t bytes = 0, gen = 0, dropped = 0;
  bool ok = false;
  try {
    ok = read_journal(dr.dir, opt_.direct, want, out, &bytes, &gen, &dropped, why);
  } catch (const std::bad_alloc&) {
    *why = "out of memory reading the journal";
  }
  dr.recovery_bytes_read += bytes;
  if (!ok) {
    out->clear();
    return false;
  }
  dr.jgen = gen;
  dr.dropped_tail = dropped;
  return true;
}

void SsdStore::drop_journal(Drive& dr) {
  for (const char* name : {kSegmentFileName, kCheckpointFileName}) {
    std::string p = dr.dir + "/" + name;
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
      int e = errno;
      throw OsFailure(e, "drive " + dr.dir + ": cannot remove the journal file " + p +
                             " (a store opened without a journal must not leave one to go stale): " + errstr(e));
    }
  }
  fsync_dir(dr.dir);
}

// Checkpoint gen+1 of every slot that holds a block, then a fresh segment
// gen+1 (journal.h: the crash windows). The caller holds dr.jm.
void SsdStore::write_checkpoint(Drive& dr) {
  uint64_t gen = dr.jgen + 1;
  std::vector<FoundRecord> live;
  {
    std::lock_guard<std::mutex> g(meta_);
    for (uint32_t s = 0; s < dr.meta.size(); ++s)
      if (dr.meta[s].seq != 0) live.push_back(FoundRecord{dr.meta[s].seq, s, dr.meta[s].key, dr.meta[s].hcrc});
  }
  JournalHeader h;
  h.gen = gen;
  h.block_bytes = block_bytes_;
  h.n_slots = dr.n_slots;
  h.store_id = dr.store_id;
  h.count = live.size();
  size_t body = live.size() * kEntryBytes;
  size_t total = kAlign + round_up(body, kAlign);
  Aligned buf = aligned(total);
  std::memset(buf.get(), 0, total);
  for (size_t i = 0; i < live.size(); ++i) {
    encode_entry(buf.get() + kAlign + i * kEntryBytes, live[i], static_cast<uint32_t>(block_bytes_), gen);
    h.max_seq = std::max(h.max_seq, live[i].seq);
  }
  h.body_crc = crc32c(0, buf.get() + kAlign, body);
  encode_header(buf.get(), true, h);

  auto put_file = [&](const char* name, const uint8_t* p, size_t n, bool keep) -> int {
    std::string path = dr.dir + "/" + name, tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (opt_.direct ? O_DIRECT : 0), 0600);
    if (fd < 0) {
      int e = errno;
      throw OsFailure(e, "drive " + dr.dir + ": cannot create " + tmp + ": " + errstr(e));
    }
    int e = 0;
    if (injected(dr, 2, &e)) {
      errno = e;
    } else if (pwrite_all(fd, p, n, 0) < 0) {
      e = errno;
    } else {
      dr.journal_written += n;
      if (::fdatasync(fd) != 0) e = errno;
      else if (::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
    }
    if (e != 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw OsFailure(e, "drive " + dr.dir + ": cannot write the journal file " + path + ": " + errstr(e));
    }
    fsync_dir(dr.dir);
    if (!keep) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  put_file(kCheckpointFileName, buf.get(), total, false);
  JournalHeader sh = h;
  sh.count = sh.max_seq = 0;
  sh.body_crc = 0;
  encode_header(buf.get(), false, sh);
  if (dr.jfd >= 0) {
    ::close(dr.jfd);
    dr.jfd = -1;
  }
  // From here until the new segment is in place the old one is ignored at
  // open (older than the checkpoint): nothing may be appended to it.
  dr.jbroken = true;
  dr.jfd = put_file(kSegmentFileName, buf.get(), kAlign, true);
  dr.jbroken = false;
  dr.jgen = gen;
  dr.jentries = 0;
  dr.jtail_off = kAlign;
  dr.jtail.clear();
  dr.checkpoints++;
}

bool SsdStore::journal_append(Drive& dr, const std::vector<FoundRecord>& recs, int* err) {
  *err = 0;
  if (dr.jbroken || dr.jfd < 0) {
    *err = EIO;
    return false;
  }
  size_t tail = dr.jtail.size();
  size_t bytes = tail + recs.size() * kEntryBytes;
  size_t span = round_up(bytes, kAlign);
  Aligned buf;
  try {
    buf = aligned(span);
  } catch (const std::bad_alloc&) {
    *err = ENOMEM;
    return false;
  }
  if (tail) std::memcpy(buf.get(), dr.jtail.data(), tail);
  for (size_t i = 0; i < recs.size(); ++i)
    encode_entry(buf.get() + tail + i * kEntryBytes, recs[i], static_cast<uint32_t>(block_bytes_), dr.jgen);
  std::memset(buf.get() + bytes, 0, span - bytes);
  int e = 0;
  if (injected(dr, 2, &e)) {
    *err = e;
    return false;
  }
  if (pwrite_all(dr.jfd, buf.get(), span, dr.jtail_off) < 0) {
    *err = errno;
    return false;
  }
  dr.journal_written += span;
  if (opt_.durable && ::fdatasync(dr.jfd) != 0) {
    *err = errno;
    return false;
  }
  size_t full = bytes / kAlign * kAlign;
  dr.jtail_off += full;
  dr.jtail.assign(buf.get() + full, buf.get() + bytes);
  dr.jentries += recs.size();
  return true;
}

// After a write call: the completed blocks of one drive go to its slot table
// and journal; if the journal cannot take them they are not acknowledged
// (handle -1, slot given back) and the drive is marked failed.
void SsdStore::journal_written(Drive& dr, std::vector<FoundRecord>& recs, std::vector<size_t>& idx,
                               int64_t* handles) {
  std::lock_guard<std::mutex> jg(dr.jm);
  {
    std::lock_guard<std::mutex> g(meta_);
    for (const FoundRecord& r : recs) dr.meta[r.slot] = SlotMeta{r.seq, r.hcrc, r.key};
  }
  if (!opt_.journal) return;
  int e = 0;
  if (!journal_append(dr, recs, &e)) {
    mark_failed(dr, e, "journal append to " + dr.dir + "/" + kSegmentFileName + " failed: " + errstr(e));
    std::lock_guard<std::mutex> g(meta_);
    for (size_t j = 0; j < recs.size(); ++j) {
      handles[idx[j]] = -1;
      dr.write_errors++;
      dr.meta[recs[j].slot] = SlotMeta{};
      dr.slots.give_back(recs[j].slot, 1);
    }
    return;
  }
  uint64_t limit = opt_.journal_compact_entries;
  if (limit == 0) {
    std::lock_guard<std::mutex> g(meta_);
    limit = std::max<uint64_t>(16384, dr.n_slots - dr.slots.free_count());
  }
  if (dr.jentries < limit) return;
  try {
    write_checkpoint(dr);
  } catch (const OsFailure& ex) {
    // The blocks above are in the old segment or the new checkpoint; what
    // comes next has no journal to go to until revive() writes one.
    dr.jbroken = true;
    mark_failed(dr, ex.err, ex.what());
  } catch (const std::bad_alloc&) {
    dr.jbroken = true;
    mark_failed(dr, ENOMEM, "out of memory writing a checkpoint of " + dr.dir);
  }
}

// ---------------------------------------------------------------------------
// Scrub
// ---------------------------------------------------------------------------
ScrubResult SsdStore::scrub(uint64_t max_slots) {
  std::shared_lock<std::shared_mutex> life(life_);
  check_open();
  check_writable();
  std::lock_guard<std::mutex> sg(scrub_m_);
  ScrubResult res;
  if (total_slots_ == 0) return res;
  uint8_t* buf = tl_buf.get(slot_bytes_);
  const Geom g = make_geom(block_bytes_, opt_.parts);
  uint64_t looked = 0;
  while (!res.wrapped && res.checked < max_slots && looked < total_slots_) {
    uint64_t h = scrub_pos_;
    scrub_pos_ = (scrub_pos_ + 1) % total_slots_;
    ++looked;
    if (scrub_pos_ == 0) res.wrapped = true;
    uint32_t d = 0;
    while (d + 1 < drives_.size() && drives_[d + 1]->base <= h) ++d;
    Drive& dr = *drives_[d];
    uint32_t slot = static_cast<uint32_t>(h - dr.base);
    if (dr.fd < 0) continue;
    SlotMeta m;
    {
      std::lock_guard<std::mutex> g(meta_);
      m = dr.meta[slot];
    }
    if (m.seq == 0) continue;
    ssize_t r;
    do {
      r = ::pread(dr.fd, buf, slot_bytes_, static_cast<off_t>(kDataOffset + static_cast<uint64_t>(slot) * slot_bytes_));
    } while (r < 0 && errno == EINTR);
    if (r > 0) {
      dr.scrub_read += static_cast<uint64_t>(r);
      res.bytes += static_cast<uint64_t>(r);
    }
    ++res.checked;
    dr.scrub_checked++;
    SlotRecord rec;
    bool good = r == static_cast<ssize_t>(slot_bytes_) &&
                verify_slot(buf, slot, g, g.part_stride, true, m.key.data(), &rec) == Verdict::kOk &&
                rec.seq == m.seq && rec.hcrc == m.hcrc;
    if (good) continue;
    {
      std::lock_guard<std::mutex> g(meta_);
      if (dr.meta[slot].seq != m.seq) continue;  // freed or rewritten meanwhile: not ours to judge
    }
    dr.scrub_bad++;
    res.handles.push_back(static_cast<int64_t>(h));
    res.keys.insert(res.keys.end(), m.key.begin(), m.key.end());
  }
  return res;
}

// ---------------------------------------------------------------------------
// Offline check
// ---------------------------------------------------------------------------
DriveCheck check_drive(const std::string& dir_in, bool direct) {
  DriveCheck c;
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  c.path = dir;
  std::string path = dir + "/" + kDataFileName;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) {
    int e = errno;
    throw OsFailure(e, "dir: cannot open " + path + ": " + errstr(e));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  Aligned sb = aligned(kAlign);
  ssize_t r = ::pread(fd, sb.get(), kAlign, 0);
  if (r != static_cast<ssize_t>(kAlign) || std::memcmp(sb.get(), kSuperMagic, 8) != 0 ||
      crc32c(0, sb.get(), kSuperCrcAt) != get32(sb.get() + kSuperCrcAt))
    throw std::invalid_argument("dir: " + path + " is not a saria SSD data file (bad or torn superblock)");
  uint32_t parts = 0;
  std::string bad_sb;
  if (!superblock_parts(sb.get(), &parts, &bad_sb)) throw std::invalid_argument("dir: " + path + " " + bad_sb);
  c.bytes_read += kAlign;
  c.block_bytes = get64(sb.get() + 16);
  c.parts = parts;
  uint64_t slot_bytes = get64(sb.get() + 24);
  c.n_slots = get64(sb.get() + 32);
  if (c.block_bytes == 0 || c.block_bytes % parts != 0 || slot_bytes != make_geom(c.block_bytes, parts).slot_bytes)
    throw std::invalid_argument("dir: " + path + " has an unexpected slot layout");
  const Geom g = make_geom(c.block_bytes, parts);
  JournalHeader want;
  want.block_bytes = c.block_bytes;
  want.n_slots = c.n_slots;
  std::memcpy(want.store_id.data(), sb.get() + 56, 16);

  // what the slots hold: per key, the newest record
  std::vector<FoundRecord> found;
  uint64_t chunk = std::max<uint64_t>(1, (4ull << 20) / slot_bytes);
  Aligned buf = aligned(chunk * slot_bytes);
  for (uint64_t s0 = 0; s0 < c.n_slots; s0 += chunk) {
    uint64_t n = std::min(chunk, c.n_slots - s0);
    size_t bytes = n * slot_bytes, got = 0;
    while (got < bytes) {
      ssize_t q = ::pread(fd, buf.get() + got, bytes - got, static_cast<off_t>(kDataOffset + s0 * slot_bytes + got));
      if (q < 0 && errno == EINTR) continue;
      if (q <= 0) break;
      got += static_cast<size_t>(q);
    }
    c.bytes_read += got;
    if (got < bytes) c.read_errors += n - got / slot_bytes;
    for (uint64_t j = 0; j < got / slot_bytes; ++j) {
      const uint8_t* s = buf.get() + j * slot_bytes;
      uint32_t slot = static_cast<uint32_t>(s0 + j);
      SlotRecord sr;
      if (verify_slot(s, slot, g, g.part_stride, false, nullptr) != Verdict::kOk) {
        bool magic = false;
        for (uint32_t p = 0; p < parts; ++p) magic = magic || std::memcmp(s + p * g.part_stride, kSlotMagic, 8) == 0;
        if (magic) {
          ++c.bad_headers;
        } else {
          ++c.empty;
        }
      } else if (verify_slot(s, slot, g, g.part_stride, true, nullptr, &sr) != Verdict::kOk) {
        ++c.bad_payloads;
      } else {
        FoundRecord rec{sr.seq, slot, {}, sr.hcrc};
        std::memcpy(rec.key.data(), sr.key, 32);
        found.push_back(rec);
      }
    }
  }
  uint64_t max_seq = 0;
  std::vector<Survivor> surv = newest_per_key({found}, &max_seq);
  c.records = surv.size();
  c.superseded = found.size() - surv.size();
  std::unordered_map<uint32_t, const FoundRecord*> by_slot;
  for (const FoundRecord& f : found) by_slot[f.slot] = &f;

  std::vector<FoundRecord> entries;
  uint64_t jbytes = 0, gen = 0, dropped = 0;
  std::string why;
  if (read_journal(dir, direct, want, &entries, &jbytes, &gen, &dropped, &why)) {
    c.journal = "ok";
    c.journal_entries = entries.size();
    std::vector<uint8_t> listed(c.n_slots, 0);
    for (const FoundRecord& e : entries) {
      listed[e.slot] = 1;
      auto it = by_slot.find(e.slot);
      if (it == by_slot.end() || it->second->seq != e.seq || it->second->key != e.key || it->second->hcrc != e.hcrc)
        ++c.journal_stale;
    }
    // newest records of their key the journal does not list (written after
    // the last entry landed: a crash window, nothing acknowledged)
    for (const Survivor& s : surv)
      if (!listed[s.slot]) ++c.journal_missing;
  } else {
    c.journal = why.rfind("missing ", 0) == 0 ? "missing" : "unusable: " + why;
  }
  c.bytes_read += jbytes;
  return c;
}

}  // namespace saria_store
