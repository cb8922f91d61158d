// SSD tier engine of saria (module saria._store).
//
// A store is one or more drives. Each drive is a directory holding one
// pre-allocated data file, `saria-ssd.data`, opened with O_DIRECT. Blocks are
// fixed-size (block_bytes, chosen when the store is created) and live in
// fixed-size slots; the store owns the free space, the caller (the radix
// index) owns the policy: it decides what to write and what to free.
//
// ---------------------------------------------------------------------------
// SSD on-disk format (version 1). All integers are little endian.
// ---------------------------------------------------------------------------
//
// File `<drive dir>/saria-ssd.data`, size = 4096 + n_slots * slot_bytes:
//
//   [0, 4096)            superblock
//   [4096 + i*slot_bytes, 4096 + (i+1)*slot_bytes)   slot i, i in [0, n_slots)
//
// Superblock (the first 80 bytes of a 4096-byte page, the rest zero):
//   0   u64  magic "SARIASUP" (bytes 'S','A','R','I','A','S','U','P')
//   8   u32  format version (1)
//   12  u32  slot header bytes (64)
//   16  u64  block_bytes (payload bytes of every block)
//   24  u64  slot_bytes = round_up(64 + block_bytes, 4096)
//   32  u64  n_slots
//   40  u64  data offset (4096)
//   48  u64  creation time, ns since the Unix epoch
//   56  u8[16] random store id (informational)
//   72  u32  drive index given at creation (informational)
//   76  u32  crc32c of bytes [0, 76)
// A store of P > 1 parts per slot (tensor parallelism: one part per rank,
// below) has format version 2 in the superblock and two more fields:
//   80  u32  P, the number of parts of every slot
//   84  u32  crc32c of bytes [0, 84)
// (a build that reads only version 1 refuses it by its version). A one-part
// store is version 1, byte for byte the original format.
//
// A new file is built as `saria-ssd.data.tmp` (fallocate to full size, write
// and fdatasync the superblock), then renamed into place and the directory
// fsynced, so a crash during creation never leaves a half-made data file. On
// open the superblock must verify and match block_bytes, n_slots and P
// (another P is refused: "parts: ... was created with parts=...").
//
// Slot = a 64-byte header, the payload, zero padding up to slot_bytes:
//   0   u64  magic "SARIASLT"
//   8   u32  format version (1)
//   12  u32  payload length (== block_bytes)
//   16  u8[32] block key
//   48  u64  write sequence number (monotone per store; on open it resumes
//            from 1 + the largest sequence number found on any drive)
//   56  u32  crc32c of the payload (payload_len bytes)
//   60  u32  crc32c of header bytes [0, 60) followed by the slot's local
//            index as a u32 (so a record read at the wrong place fails)
// A slot holds a valid record iff magic, version, payload length, header crc
// and payload crc all verify. Never-written space reads back as zeros (no
// magic); a torn or partial write leaves a header or payload whose crc fails.
//
// Parts (P > 1). block_bytes must be a multiple of P; part p holds payload
// bytes [p*B/P, (p+1)*B/P) (B = block_bytes; a DRAM slot is rank-major, so
// part r is tensor-parallel rank r's pages of every layer). A slot is P
// parts of part_stride = round_up(64 + B/P, 4096) bytes each, part p at
// slot offset p*part_stride, every part a 64-byte part header (the slot
// header above with payload length B/P, the part's own payload crc, and at
// bytes 8..12 the u32 2 | p << 16 | P << 24 instead of the version; its
// header crc covers these bytes and the slot index), its payload, zero
// padding. slot_bytes = P * part_stride. read_part(p) reads part p alone (one
// O_DIRECT read of part_stride bytes) and verifies its header, crc and key:
// rank r reads 1/P of the slot. A whole-slot record (recovery, scrub, read)
// needs all P parts valid with the same key and sequence number; the header
// crc a journal entry records for it is the crc32c of the P part header
// crcs. A torn write of several parts leaves a slot whose parts disagree:
// not a record at recovery, and a miss on read for every rank whose part is
// not the key's.
//
// Handles: global slot handle = drive_base[d] + local slot, where drive_base
// is the running sum of n_slots over the drives in the order given at open.
// Handles fit a uint32 (the total slot count is checked at open).
//
// Durability. write() returns a handle only after the O_DIRECT pwrite of its
// slot completed in full: the record is then in the device and survives the
// death of the process (kill -9). With durable=true each write() call also
// fdatasyncs the drives it wrote before returning, which makes it survive a
// power loss on drives with a volatile write cache.
//
// Recovery. Opening an existing store reads each drive's journal
// (journal.h: a checkpoint and an append-only segment listing key, slot,
// sequence number and header crc of every block) and adopts what it lists,
// without reading the slots; the sequence numbers then resume 2**32 above
// the largest entry. A drive whose journal is missing or does not verify, or
// every drive with open_from_journal=false, is scanned instead: every slot
// (large sequential O_DIRECT reads; scan=full verifies header and payload
// crc, scan=header only the header crc, leaving torn payloads to be caught,
// as every corruption is, by the crc check on read). Every open then writes
// a fresh checkpoint of what it recovered. Recovery returns every valid
// record, one per key: when several valid records carry the same key, the
// newest sequence number wins and the others are freed. A slot the caller
// freed is not overwritten, so until it is reused its old record (correct
// bytes for its key) may come back after a restart; the caller may simply
// free it again. An entry gone stale (its slot rewritten by a write that
// died before its own entry landed) is a miss on read, like any corruption.
//
// Journal appends. write() appends the entries of the blocks it wrote to
// their drives' segments (O_DIRECT, the segment's last page rewritten with
// its earlier bytes unchanged; fdatasync'ed too when durable) before it
// returns their handles: an acknowledged block is in the journal. A failed
// append acknowledges none of that drive's blocks in the call (handle -1,
// slots given back) and marks the drive failed, like a failed slot write.
//
// Reads. read() verifies header, payload crc and that the stored key equals
// the key the caller expects before copying a payload out (every part of a
// slot of several; read_part the one part it reads). On any failure
// (I/O error, crc mismatch, wrong key, bad handle) the block's ok flag is
// false, a counter is bumped, and its output row is zero-filled: unverified
// bytes are never returned.
//
// Failures. A write that fails (EIO, ENOSPC, EFBIG, a short write, a data
// file that is no longer at its path) marks the drive failed: no new slots
// are allocated on it (until revive()), its failing blocks get handle -1,
// the batch's other blocks go on, other drives keep working. Reads from a
// failed drive are still attempted (every byte served is verified). Read
// errors are counted and leave the drive's state alone. Counters, the
// failed flag and the last error (errno and message) are in stats().
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "store/journal.h"
#include "store/recovery.h"
#include "store/slot_allocator.h"
#include "store/thread_pool.h"

namespace saria_store {

constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kPartsFormatVersion = 2;  // superblock of a store of several parts per slot
constexpr uint32_t kMaxParts = 255;
constexpr uint64_t kAlign = 4096;
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kDataOffset = 4096;
constexpr size_t kKeyBytes = 32;
constexpr const char* kDataFileName = "saria-ssd.data";
// One writer per drive: the owner holds an exclusive flock on this file
// (released by the kernel when the process dies) and writes its pid in it.
constexpr const char* kOwnerFileName = "saria-ssd.owner";

uint32_t crc32c(uint32_t crc, const void* data, size_t n);
bool crc32c_hw();
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);  // table version, for tests

// An OS-level failure while opening a store: carries errno.
struct OsFailure : std::runtime_error {
  int err;
  OsFailure(int e, const std::string& msg) : std::runtime_error(msg), err(e) {}
};

struct StoreOptions {
  std::vector<std::string> dirs;
  std::vector<uint64_t> capacity_bytes;  // per drive
  uint64_t block_bytes = 0;
  uint32_t parts = 1;                    // parts per slot (one per tensor-parallel rank)
  int threads = 0;                       // 0: 4 per drive
  uint64_t unit_bytes = 4ull << 20;      // largest single pwrite/pread
  bool durable = false;
  bool preallocate = true;               // fallocate the file (else sparse)
  bool direct = true;                    // O_DIRECT
  bool full_scan = true;                 // verify payload crcs when open scans a drive
  // Keep a per-drive journal (journal.h) and open from it; without one, an
  // open removes any journal files (they would go stale).
  bool journal = true;
  bool open_from_journal = true;         // false: scan even when a journal is usable (then rewrite it)
  uint64_t journal_compact_entries = 0;  // segment entries before a checkpoint (0: max(16384, live slots))
  bool allow_degraded = false;           // a drive failing at open is marked failed
  // A reader: opens existing data files read-only (O_DIRECT), takes their
  // size from the superblock (capacity_bytes is ignored), takes no owner
  // lock, scans nothing; read() only. The engine's workers read SSD blocks
  // straight into KV pages this way while the owner (the scheduler) writes.
  bool read_only = false;
};

struct DriveStats {
  std::string path;
  uint64_t n_slots = 0, free_slots = 0, base = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t payload_bytes_written = 0, payload_bytes_read = 0;
  uint64_t blocks_written = 0, blocks_read = 0;
  uint64_t write_errors = 0, read_errors = 0;
  uint64_t checksum_failures = 0, key_mismatches = 0;
  uint64_t injected_failures = 0;
  uint64_t recovered_blocks = 0, recovery_invalid_slots = 0;
  uint64_t recovery_bytes_read = 0, recovery_ns = 0;
  std::string recovery_source;
  uint64_t journal_bytes_written = 0, journal_entries = 0, journal_generation = 0, checkpoints = 0;
  uint64_t journal_dropped_tail = 0;
  uint64_t scrub_bytes_read = 0, scrub_slots_checked = 0, scrub_bad_slots = 0;
  bool failed = false;
  int last_errno = 0;
  std::string last_error;
};

struct Recovered {
  std::vector<uint8_t> keys;     // n * 32
  std::vector<int64_t> handles;
  std::vector<uint64_t> seqs;
};

// What one slot holds, as far as the writer knows (seq 0: nothing).
struct SlotMeta {
  uint64_t seq = 0;
  uint32_t hcrc = 0;
  std::array<uint8_t, 32> key{};
};

struct ScrubResult {
  std::vector<int64_t> handles;  // slots whose record no longer verifies
  std::vector<uint8_t> keys;     // the key each of them was written with (n * 32)
  uint64_t checked = 0, bytes = 0;
  bool wrapped = false;          // the pass reached the end of the store and starts over
};

struct Injection {
  int err = 0;
  int64_t count = 0;
  int64_t skip = 0;
};

struct Drive {
  std::string dir, path;
  int fd = -1;
  int owner_fd = -1;                       // flock'ed saria-ssd.owner (writers only)
  uint64_t n_slots = 0, base = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  bool created = false;                    // made by this open: nothing to scan
  SlotAllocator slots;                     // guarded by SsdStore::meta_
  // health and counters
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> bytes_written{0}, bytes_read{0};
  std::atomic<uint64_t> payload_written{0}, payload_read{0};
  std::atomic<uint64_t> blocks_written{0}, blocks_read{0};
  std::atomic<uint64_t> write_errors{0}, read_errors{0};
  std::atomic<uint64_t> checksum_failures{0}, key_mismatches{0};
  std::atomic<uint64_t> injected{0};
  uint64_t recovered = 0, invalid_slots = 0;
  std::mutex err_m;
  int last_errno = 0;
  std::string last_error;
  std::mutex inj_m;
  std::atomic<bool> has_injection{false};
  Injection inj_write, inj_read, inj_journal;
  // recovery
  std::atomic<uint64_t> recovery_bytes_read{0};
  uint64_t recovery_ns = 0;
  std::string recovery_source;
  std::array<uint8_t, 16> store_id{};    // superblock bytes 56..72
  // what each slot holds (writers): guarded by SsdStore::meta_
  std::vector<SlotMeta> meta;
  // journal (writers; journal.h): guarded by jm, taken before meta_
  std::mutex jm;
  int jfd = -1;
  bool jbroken = false;
  std::atomic<uint64_t> jgen{0}, jentries{0};
  uint64_t jtail_off = 0, dropped_tail = 0;
  std::vector<uint8_t> jtail;              // bytes of the last, partial page of the segment
  std::atomic<uint64_t> journal_written{0}, checkpoints{0};
  // scrub
  std::atomic<uint64_t> scrub_read{0}, scrub_checked{0}, scrub_bad{0};
};

// Offline check of one drive directory (saria store check): every slot read
// and classified, the journal compared with what the slots hold.
struct DriveCheck {
  std::string path;
  uint64_t block_bytes = 0, n_slots = 0;
  uint32_t parts = 1;
  uint64_t records = 0, empty = 0, bad_headers = 0, bad_payloads = 0, superseded = 0;
  uint64_t bytes_read = 0, read_errors = 0;
  std::string journal;                     // "ok", "missing", or "unusable: why"
  uint64_t journal_entries = 0, journal_stale = 0, journal_missing = 0;
};
DriveCheck check_drive(const std::string& dir, bool direct);

class SsdStore {
 public:
  explicit SsdStore(const StoreOptions& opt);
  ~SsdStore();

  // keys: k*32 bytes; data: k*block_bytes; handles out: k (-1 on failure).
  void write(size_t k, const uint8_t* keys, const uint8_t* data, int64_t* handles);
  // ok out: k bytes (1/0); out: k*block_bytes.
  void read(size_t k, const int64_t* handles, const uint8_t* keys, uint8_t* out, uint8_t* ok);
  // Part `part` of each block: ok out: k bytes; out: k*part_bytes.
  void read_part(size_t k, const int64_t* handles, const uint8_t* keys, uint32_t part, uint8_t* out, uint8_t* ok);
  // Returns the number of slots actually freed (invalid or already free handles are counted
  // in stats as bad_frees and skipped).
  size_t free(size_t k, const int64_t* handles);
  // op: 0 read, 1 write (data file), 2 journal write (appends and checkpoints)
  void inject_failure(int drive, int op, int err, int64_t count, int64_t skip);
  void revive(int drive);
  // Reads and verifies up to `max_slots` slots that hold a block, from where
  // the last call stopped; reports those whose record no longer verifies.
  ScrubResult scrub(uint64_t max_slots);
  void check_drives();
  void sync();
  void close();

  Recovered take_recovered();
  std::vector<DriveStats> stats();
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t parts() const { return opt_.parts; }
  uint64_t part_bytes() const { return block_bytes_ / opt_.parts; }
  uint64_t capacity_slots() const { return total_slots_; }
  uint64_t free_slots();
  uint64_t no_space() const { return no_space_.load(); }
  uint64_t bad_handles() const { return bad_handles_.load(); }
  uint64_t bad_frees() const { return bad_frees_.load(); }
  uint64_t next_seq() const { return seq_.load(); }
  size_t n_drives() const { return drives_.size(); }
  bool closed() const { return closed_; }
  bool read_only() const { return opt_.read_only; }
  int threads() const { return nthreads_; }

 private:
  struct ReadReq {
    uint32_t drive, slot;
    size_t i;
  };
  std::vector<ReadReq> read_requests(size_t k, const int64_t* handles, uint8_t* out, uint64_t row_bytes,
                                     uint8_t* ok);
  void open_drive(size_t d, uint32_t index);
  void open_reader(Drive& dr);
  void take_ownership(Drive& dr);
  void check_superblock(const uint8_t* sb, const Drive& dr, bool know_slots);
  void check_writable() const;
  void release_all();  // closes every descriptor (a failed open)
  void create_file(Drive& dr, uint32_t index);
  void scan_drive(size_t d, std::vector<FoundRecord>* out);
  // journal_io.cpp
  bool load_journal(Drive& dr, std::vector<FoundRecord>* out, std::string* why);
  void write_checkpoint(Drive& dr);  // holds dr.jm; throws OsFailure
  bool journal_append(Drive& dr, const std::vector<FoundRecord>& recs, int* err);  // holds dr.jm
  void journal_written(Drive& dr, std::vector<FoundRecord>& recs, std::vector<size_t>& idx,
                       int64_t* handles);
  void drop_journal(Drive& dr);
  void mark_failed(Drive& dr, int err, const std::string& what);
  bool path_ok(Drive& dr);
  ssize_t do_pwrite(Drive& dr, const void* buf, size_t n, uint64_t off);
  ssize_t do_pread(Drive& dr, void* buf, size_t n, uint64_t off);
  uint64_t balanced_unit(size_t k) const;
  bool injected(Drive& dr, int op, int* err);
  void run_tasks(std::vector<std::function<void()>>& tasks, bool urgent = false) {
    run_all(pool_.get(), tasks, urgent);
  }
  void check_open() const;

  StoreOptions opt_;
  uint64_t block_bytes_ = 0, slot_bytes_ = 0, part_stride_ = 0, unit_slots_ = 1, total_slots_ = 0;
  std::vector<std::unique_ptr<Drive>> drives_;
  std::unique_ptr<ThreadPool> pool_;
  int nthreads_ = 0;
  std::mutex meta_;
  std::shared_mutex life_;
  size_t rr_ = 0;
  std::atomic<uint64_t> seq_{1};
  uint64_t scrub_pos_ = 0;  // next global slot the scrub looks at (guarded by scrub_m_)
  std::mutex scrub_m_;
  std::atomic<uint64_t> no_space_{0}, bad_handles_{0}, bad_frees_{0};
  bool closed_ = false;
  Recovered recovered_;
};

}  // namespace saria_store
