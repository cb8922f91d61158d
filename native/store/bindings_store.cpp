// Python bindings of the SSD tier engine (module saria._store).
//
// Every I/O call releases the GIL for its whole duration; the arrays passed in
// stay referenced by the call's arguments while it runs. The Python facade is
// saria.tiers.ssd.SsdStore; see native/store/ssd_store.h for the format.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "np_util.h"
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "store/ssd_store.h"

namespace nb = nanobind;
using namespace nb::literals;
using saria_store::kKeyBytes;
using saria_store::SsdStore;
using saria_store::StoreOptions;

using KeyArray = nb::ndarray<const uint8_t, nb::shape<-1, 32>, nb::c_contig, nb::device::cpu>;
using DataArray = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

namespace {

using saria_np::to_numpy;

nb::ndarray<nb::numpy, bool> bool_array(std::vector<uint8_t>&& v) {
  size_t k = v.size();
  bool* heap = new bool[k ? k : 1];
  for (size_t i = 0; i < k; ++i) heap[i] = v[i] != 0;
  nb::capsule owner(heap, [](void* p) noexcept { delete[] static_cast<bool*>(p); });
  size_t shape[1] = {k};
  return nb::ndarray<nb::numpy, bool>(heap, 1, shape, owner);
}

int parse_op(const std::string& op) {
  if (op == "write") return 1;
  if (op == "read") return 0;
  if (op == "journal") return 2;
  throw std::invalid_argument("op: must be 'write', 'read' or 'journal', got '" + op + "'");
}

}  // namespace

NB_MODULE(_store, m) {
  m.doc() = "saria SSD tier engine: O_DIRECT slot store with crc32c-verified records";
  m.attr("FORMAT_VERSION") = saria_store::kFormatVersion;
  m.attr("HEADER_BYTES") = saria_store::kHeaderBytes;
  m.attr("DATA_OFFSET") = saria_store::kDataOffset;
  m.attr("ALIGN") = saria_store::kAlign;
  m.attr("DATA_FILE_NAME") = saria_store::kDataFileName;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const saria_store::OsFailure& e) {
      PyObject* args = Py_BuildValue("(is)", e.err, e.what());
      if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
      }
    }
  });

  m.def("crc32c", [](nb::bytes b, uint32_t crc) { return saria_store::crc32c(crc, b.c_str(), b.size()); },
        "data"_a, "crc"_a = 0, "crc32c (Castagnoli) of bytes, chained like zlib.crc32.");
  m.def("crc32c_portable",
        [](nb::bytes b, uint32_t crc) { return saria_store::crc32c_portable(crc, b.c_str(), b.size()); },
        "data"_a, "crc"_a = 0, "Table-driven crc32c (the fallback), for tests.");
  m.def("crc32c_hw", &saria_store::crc32c_hw, "Whether crc32c uses the SSE4.2 instruction.");
  m.def(
      "crc32c_rows",
      [](uintptr_t addr, size_t stride, I64Array rows, size_t offset, size_t length) {
        size_t n = rows.shape(0);
        std::vector<uint32_t> out(n);
        const int64_t* idx = rows.data();
        {
          nb::gil_scoped_release rel;
          const auto* base = reinterpret_cast<const uint8_t*>(addr);
          for (size_t i = 0; i < n; ++i)
            out[i] = saria_store::crc32c(0, base + static_cast<size_t>(idx[i]) * stride + offset, length);
        }
        return to_numpy(std::move(out), {n});
      },
      "addr"_a, "stride"_a, "rows"_a, "offset"_a, "length"_a,
      "crc32c of bytes [offset, offset + length) of each row `rows[i]` of a strided buffer, "
      "the GIL released (saria.tiers.remote.rows checks the arguments).");

  m.def(
      "check_drive",
      [](const std::string& dir, bool direct) {
        saria_store::DriveCheck c;
        {
          nb::gil_scoped_release rel;
          c = saria_store::check_drive(dir, direct);
        }
        nb::dict x;
        x["path"] = c.path;
        x["block_bytes"] = c.block_bytes;
        x["capacity_slots"] = c.n_slots;
        x["records"] = c.records;
        x["empty_slots"] = c.empty;
        x["bad_headers"] = c.bad_headers;
        x["bad_payloads"] = c.bad_payloads;
        x["superseded"] = c.superseded;
        x["bytes_read"] = c.bytes_read;
        x["parts"] = c.parts;
        x["read_errors"] = c.read_errors;
        x["journal"] = c.journal;
        x["journal_entries"] = c.journal_entries;
        x["journal_stale"] = c.journal_stale;
        x["journal_missing"] = c.journal_missing;
        return x;
      },
      "dir"_a, "direct"_a = true, "Scan one drive directory offline: every slot and the journal.");

  nb::class_<SsdStore>(m, "SsdStore")
      .def(
          "__init__",
          [](SsdStore* self, std::vector<std::string> dirs, std::vector<uint64_t> capacity_bytes,
             uint64_t block_bytes, int threads, uint64_t unit_bytes, bool durable, bool preallocate, bool direct,
             bool full_scan, bool allow_degraded, bool read_only, bool journal, bool open_from_journal,
             uint64_t journal_compact_entries, uint32_t parts) {
            StoreOptions o;
            o.dirs = std::move(dirs);
            o.capacity_bytes = std::move(capacity_bytes);
            o.block_bytes = block_bytes;
            o.threads = threads;
            o.unit_bytes = unit_bytes;
            o.durable = durable;
            o.preallocate = preallocate;
            o.direct = direct;
            o.full_scan = full_scan;
            o.allow_degraded = allow_degraded;
            o.read_only = read_only;
            o.journal = journal;
            o.open_from_journal = open_from_journal;
            o.journal_compact_entries = journal_compact_entries;
            o.parts = parts;
            nb::gil_scoped_release rel;
            new (self) SsdStore(o);
          },
          "dirs"_a, "capacity_bytes"_a, "block_bytes"_a, "threads"_a = 0, "unit_bytes"_a = 4u << 20,
          "durable"_a = false, "preallocate"_a = true, "direct"_a = true, "full_scan"_a = true,
          "allow_degraded"_a = false, "read_only"_a = false, "journal"_a = true, "open_from_journal"_a = true,
          "journal_compact_entries"_a = 0, "parts"_a = 1)
      .def(
          "write",
          [](SsdStore& s, KeyArray keys, DataArray data) {
            size_t k = keys.shape(0);
            if (data.shape(0) != k)
              throw std::invalid_argument("data: " + std::to_string(data.shape(0)) + " rows for " +
                                          std::to_string(k) + " keys");
            if (data.shape(1) != s.block_bytes())
              throw std::invalid_argument("data: rows of " + std::to_string(data.shape(1)) +
                                          " bytes, the store's block_bytes is " + std::to_string(s.block_bytes()));
            std::vector<int64_t> h(k);
            {
              nb::gil_scoped_release rel;
              s.write(k, keys.data(), data.data(), h.data());
            }
            return to_numpy(std::move(h), {k});
          },
          "keys"_a, "data"_a)
      .def(
          "read",
          [](SsdStore& s, I64Array handles, KeyArray keys, OutArray out) {
            size_t k = handles.shape(0);
            if (keys.shape(0) != k)
              throw std::invalid_argument("keys: " + std::to_string(keys.shape(0)) + " keys for " +
                                          std::to_string(k) + " handles");
            if (out.shape(0) != k || out.shape(1) != s.block_bytes())
              throw std::invalid_argument("out: shape must be (" + std::to_string(k) + ", " +
                                          std::to_string(s.block_bytes()) + ")");
            std::vector<uint8_t> ok(k);
            {
              nb::gil_scoped_release rel;
              s.read(k, handles.data(), keys.data(), out.data(), ok.data());
            }
            return bool_array(std::move(ok));
          },
          "handles"_a, "keys"_a, "out"_a)
      .def(
          "read_part",
          [](SsdStore& s, I64Array handles, KeyArray keys, uint32_t part, OutArray out) {
            size_t k = handles.shape(0);
            if (keys.shape(0) != k)
              throw std::invalid_argument("keys: " + std::to_string(keys.shape(0)) + " keys for " +
                                          std::to_string(k) + " handles");
            if (out.shape(0) != k || out.shape(1) != s.part_bytes())
              throw std::invalid_argument("out: shape must be (" + std::to_string(k) + ", " +
                                          std::to_string(s.part_bytes()) + ")");
            std::vector<uint8_t> ok(k);
            {
              nb::gil_scoped_release rel;
              s.read_part(k, handles.data(), keys.data(), part, out.data(), ok.data());
            }
            return bool_array(std::move(ok));
          },
          "handles"_a, "keys"_a, "part"_a, "out"_a)
      .def(
          "free",
          [](SsdStore& s, I64Array handles) {
            nb::gil_scoped_release rel;
            return s.free(handles.shape(0), handles.data());
          },
          "handles"_a)
      .def(
          "take_recovered",
          [](SsdStore& s) {
            saria_store::Recovered r = s.take_recovered();
            size_t n = r.handles.size();
            return nb::make_tuple(to_numpy(std::move(r.keys), {n, kKeyBytes}), to_numpy(std::move(r.handles), {n}),
                                  to_numpy(std::move(r.seqs), {n}));
          })
      .def(
          "inject_failure",
          [](SsdStore& s, int drive, const std::string& op, int err, int64_t count, int64_t skip) {
            s.inject_failure(drive, parse_op(op), err, count, skip);
          },
          "drive"_a, "op"_a, "errno"_a, "count"_a = 1, "skip"_a = 0)
      .def("revive", &SsdStore::revive, "drive"_a)
      .def(
          "scrub",
          [](SsdStore& s, uint64_t max_slots) {
            saria_store::ScrubResult r;
            {
              nb::gil_scoped_release rel;
              r = s.scrub(max_slots);
            }
            size_t n = r.handles.size();
            return nb::make_tuple(to_numpy(std::move(r.handles), {n}), to_numpy(std::move(r.keys), {n, kKeyBytes}),
                                  r.checked, r.bytes, r.wrapped);
          },
          "max_slots"_a)
      .def("check_drives", &SsdStore::check_drives, nb::call_guard<nb::gil_scoped_release>())
      .def("sync", &SsdStore::sync, nb::call_guard<nb::gil_scoped_release>())
      .def("close", &SsdStore::close, nb::call_guard<nb::gil_scoped_release>())
      .def("stats",
           [](SsdStore& s) {
             nb::list drives;
             for (auto& d : s.stats()) {
               nb::dict x;
               x["path"] = d.path;
               x["capacity_slots"] = d.n_slots;
               x["free_slots"] = d.free_slots;
               x["handle_base"] = d.base;
               x["bytes_written"] = d.bytes_written;
               x["bytes_read"] = d.bytes_read;
               x["payload_bytes_written"] = d.payload_bytes_written;
               x["payload_bytes_read"] = d.payload_bytes_read;
               x["blocks_written"] = d.blocks_written;
               x["blocks_read"] = d.blocks_read;
               x["write_errors"] = d.write_errors;
               x["read_errors"] = d.read_errors;
               x["checksum_failures"] = d.checksum_failures;
               x["key_mismatches"] = d.key_mismatches;
               x["injected_failures"] = d.injected_failures;
               x["recovered_blocks"] = d.recovered_blocks;
               x["recovery_invalid_slots"] = d.recovery_invalid_slots;
               x["recovery_bytes_read"] = d.recovery_bytes_read;
               x["recovery_seconds"] = static_cast<double>(d.recovery_ns) * 1e-9;
               x["recovery_source"] = d.recovery_source;
               x["journal_bytes_written"] = d.journal_bytes_written;
               x["journal_entries"] = d.journal_entries;
               x["journal_generation"] = d.journal_generation;
               x["checkpoints"] = d.checkpoints;
               x["journal_dropped_tail"] = d.journal_dropped_tail;
               x["scrub_bytes_read"] = d.scrub_bytes_read;
               x["scrub_slots_checked"] = d.scrub_slots_checked;
               x["scrub_bad_slots"] = d.scrub_bad_slots;
               x["failed"] = d.failed;
               x["last_errno"] = d.last_errno;
               x["last_error"] = d.last_error;
               drives.append(x);
             }
             nb::dict r;
             r["drives"] = drives;
             r["no_space"] = s.no_space();
             r["bad_handles"] = s.bad_handles();
             r["bad_frees"] = s.bad_frees();
             r["next_seq"] = s.next_seq();
             return r;
           })
      .def_prop_ro("block_bytes", &SsdStore::block_bytes)
      .def_prop_ro("slot_bytes", &SsdStore::slot_bytes)
      .def_prop_ro("parts", &SsdStore::parts)
      .def_prop_ro("part_bytes", &SsdStore::part_bytes)
      .def_prop_ro("capacity_slots", &SsdStore::capacity_slots)
      .def_prop_ro("free_slots", &SsdStore::free_slots)
      .def_prop_ro("n_drives", &SsdStore::n_drives)
      .def_prop_ro("threads", &SsdStore::threads)
      .def_prop_ro("closed", &SsdStore::closed)
      .def_prop_ro("read_only", &SsdStore::read_only);
}
