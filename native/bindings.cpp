// Python bindings of the native core (module saria._native).
//
// Keys cross the boundary as C-contiguous uint8 arrays of shape (n, 32): one
// call per run of blocks, never one per block. The heavy calls release the GIL
// while they work; the Python facade serialises access with its own lock.
#include <nanobind/nanobind.h>
#include <algorithm>
#include <nanobind/ndarray.h>

#include "np_util.h"
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "copy/rows.h"
#include "index/key_set.h"
#include "index/radix_core.h"

namespace nb = nanobind;
using namespace nb::literals;
using saria::EvictedBlock;
using saria::KeySet;
using saria::kKeyBytes;
using saria::RadixCore;

using KeyArray = nb::ndarray<const uint8_t, nb::shape<-1, 32>, nb::c_contig, nb::device::cpu>;
using OneKey = nb::ndarray<const uint8_t, nb::shape<32>, nb::c_contig, nb::device::cpu>;
using I64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U32Array = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F64Array = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

namespace {

using saria_np::to_numpy;

nb::dict evicted_to_dict(std::vector<EvictedBlock>&& ev) {
  size_t k = ev.size();
  std::vector<uint8_t> keys(k * kKeyBytes);
  std::vector<uint32_t> slot(k), reuse(k), hits(k), dram_ev(k), session(k), depth(k);
  std::vector<uint8_t> tiers(k), child(k), ckpt(k);
  std::vector<double> last(k);
  for (size_t i = 0; i < k; ++i) {
    std::memcpy(&keys[i * kKeyBytes], ev[i].key.w, kKeyBytes);
    slot[i] = ev[i].slot;
    reuse[i] = ev[i].reuse;
    hits[i] = ev[i].hits;
    dram_ev[i] = ev[i].dram_evictions;
    session[i] = ev[i].session;
    depth[i] = ev[i].depth;
    tiers[i] = ev[i].tiers_after;
    child[i] = ev[i].child_tiers;
    ckpt[i] = ev[i].ckpt;
    last[i] = ev[i].last_access;
  }
  nb::dict d;
  d["keys"] = to_numpy(std::move(keys), {k, kKeyBytes});
  d["slots"] = to_numpy(std::move(slot), {k});
  d["reuse"] = to_numpy(std::move(reuse), {k});
  d["hits"] = to_numpy(std::move(hits), {k});
  d["dram_evictions"] = to_numpy(std::move(dram_ev), {k});
  d["session"] = to_numpy(std::move(session), {k});
  d["depth"] = to_numpy(std::move(depth), {k});
  d["tiers_after"] = to_numpy(std::move(tiers), {k});
  d["child_tiers"] = to_numpy(std::move(child), {k});
  d["ckpt"] = to_numpy(std::move(ckpt), {k});
  d["last_access"] = to_numpy(std::move(last), {k});
  return d;
}

// The per-block history arrays of history() and touch_history() (with
// `previous`: the last access before a touch too).
struct HistoryArrays {
  std::vector<uint32_t> reuse, hits, dram_ev;
  std::vector<double> last, prev;
  std::vector<uint8_t> tiers, ckpt, filling;
  HistoryArrays(size_t n, bool previous)
      : reuse(n), hits(n), dram_ev(n), last(n), prev(previous ? n : 0), tiers(n), ckpt(n),
        filling(n) {}
  saria::TouchHistory out() {
    return {reuse.data(), hits.data(), dram_ev.data(), last.data(),
            prev.empty() ? nullptr : prev.data(), tiers.data(), ckpt.data(), filling.data()};
  }
  nb::dict to_dict(size_t k) {
    nb::dict d;
    bool previous = !prev.empty();
    for (auto* v : {&reuse, &hits, &dram_ev}) v->resize(k);
    last.resize(k);
    prev.resize(previous ? k : 0);
    for (auto* v : {&tiers, &ckpt, &filling}) v->resize(k);
    d["reuse"] = to_numpy(std::move(reuse), {k});
    d["hits"] = to_numpy(std::move(hits), {k});
    d["dram_evictions"] = to_numpy(std::move(dram_ev), {k});
    d["last_access"] = to_numpy(std::move(last), {k});
    if (previous) d["previous_access"] = to_numpy(std::move(prev), {k});
    d["tiers"] = to_numpy(std::move(tiers), {k});
    d["checkpoints"] = to_numpy(std::move(ckpt), {k});
    d["filling"] = to_numpy(std::move(filling), {k});
    return d;
  }
};

}  // namespace

NB_MODULE(_native, m) {
  m.def(
      "copy_rows",
      [](uintptr_t dst, size_t dst_stride, I64Array dst_idx, uintptr_t src, size_t src_stride,
         I64Array src_idx, size_t n, size_t row_bytes) {
        const int64_t* di = dst_idx.shape(0) ? dst_idx.data() : nullptr;
        const int64_t* si = src_idx.shape(0) ? src_idx.data() : nullptr;
        nb::gil_scoped_release rel;
        saria_copy::copy_rows(reinterpret_cast<uint8_t*>(dst), dst_stride, di,
                              reinterpret_cast<const uint8_t*>(src), src_stride, si, n, row_bytes);
      },
      "dst"_a, "dst_stride"_a, "dst_idx"_a, "src"_a, "src_stride"_a, "src_idx"_a, "n"_a,
      "row_bytes"_a,
      "Row copies by index between raw strided buffers (saria.tiers.copy checks the arguments).");
  m.def(
      "bin_counts",
      [](F64Array x, F64Array edges) {
        const size_t n = edges.shape(0);
        if (n == 0) throw std::invalid_argument("bin_counts: no bin edges");
        const double* e = edges.data();
        const double* v = x.data();
        std::vector<int64_t> out(n, 0);
        // numpy's order for doubles (NaN after everything), as searchsorted uses it
        auto lt = [](double a, double b) { return a < b || (b != b && a == a); };
        size_t b = 0;
        for (size_t j = 0; j < x.shape(0); ++j) {
          if (j == 0 || !(v[j] == v[j - 1])) {  // a request's blocks share idle times: runs
            const size_t i = static_cast<size_t>(std::upper_bound(e, e + n, v[j], lt) - e);
            b = std::min(i == 0 ? 0 : i - 1, n - 1);
          }
          out[b] += 1;
        }
        return to_numpy(std::move(out), {n});
      },
      "x"_a, "edges"_a,
      "Counts of x per bin [edges[i], edges[i+1]) (ascending edges; below the first in bin 0, "
      "past the last in the last): np.bincount(np.clip(np.searchsorted(edges, x, 'right') - 1, "
      "0, n - 1), minlength=n) in one call.");
  m.doc() = "saria native core: the radix-tree index";
  m.attr("KEY_BYTES") = kKeyBytes;
  m.attr("NUM_TIERS") = saria::kNumTiers;
  m.attr("NO_SLOT") = saria::kNil;

  nb::class_<KeySet>(m, "KeySet")
      .def(nb::init<>())
      .def(
          "add",
          [](KeySet& s, KeyArray keys) {
            nb::gil_scoped_release rel;
            return s.add(keys.data(), keys.shape(0));
          },
          "keys"_a)
      .def(
          "contains",
          [](const KeySet& s, KeyArray keys) {
            size_t k = keys.shape(0);
            std::vector<uint8_t> out(k);
            s.contains(keys.data(), k, out.data());
            return to_numpy(std::move(out), {k});
          },
          "keys"_a)
      .def("count_absent_from", &KeySet::count_absent_from, "other"_a)
      .def("__len__", &KeySet::size)
      .def("memory_bytes", &KeySet::memory_bytes)
      .def("keys", [](const KeySet& s) {
        size_t k = s.size();
        std::vector<uint8_t> out(k * kKeyBytes);
        if (k) std::memcpy(out.data(), s.keys().data(), k * kKeyBytes);
        return to_numpy(std::move(out), {k, kKeyBytes});
      });

  nb::class_<RadixCore>(m, "RadixCore")
      .def(nb::init<uint64_t, bool>(), "max_nodes"_a, "hybrid"_a)
      .def(
          "match",
          [](RadixCore& c, KeyArray keys, bool lock) {
            size_t n = keys.shape(0);
            std::vector<uint8_t> masks(n), ckpt(n), fill(n);
            std::vector<uint32_t> slots(n);
            saria::MatchResult r;
            {
              nb::gil_scoped_release rel;
              r = lock ? c.match_lock(keys.data(), n, masks.data(), slots.data(), ckpt.data(),
                                      fill.data())
                       : c.match(keys.data(), n, masks.data(), slots.data(), ckpt.data(),
                                 fill.data());
            }
            size_t k = r.n_known;
            masks.resize(k);
            slots.resize(k);
            ckpt.resize(k);
            fill.resize(k);
            return nb::make_tuple(r.n_known, r.n_avail, r.n_tier_by_tier, r.first_tier, r.n_usable,
                                  r.ckpt_tier, r.ckpt_slot, to_numpy(std::move(masks), {k}),
                                  to_numpy(std::move(slots), {k}), to_numpy(std::move(ckpt), {k}),
                                  to_numpy(std::move(fill), {k}));
          },
          "keys"_a, "lock"_a = false)
      .def(
          "residency",
          [](const RadixCore& c, KeyArray keys) {
            size_t n = keys.shape(0);
            std::vector<uint8_t> masks(n), ckpt(n);
            uint32_t m;
            {
              nb::gil_scoped_release rel;
              m = c.residency(keys.data(), n, masks.data(), ckpt.data());
            }
            masks.resize(m);
            ckpt.resize(m);
            size_t k = m;
            return nb::make_tuple(m, to_numpy(std::move(masks), {k}), to_numpy(std::move(ckpt), {k}));
          },
          "keys"_a)
      .def(
          "history",
          [](const RadixCore& c, KeyArray keys) {
            HistoryArrays h(keys.shape(0), false);
            uint32_t m;
            {
              nb::gil_scoped_release rel;
              m = c.history(keys.data(), keys.shape(0), h.reuse.data(), h.hits.data(),
                            h.dram_ev.data(), h.last.data(), h.tiers.data(), h.ckpt.data(),
                            h.filling.data());
            }
            return h.to_dict(m);
          },
          "keys"_a)
      .def(
          "touch",
          [](RadixCore& c, KeyArray keys, uint32_t n_hit, uint32_t ckpt_at, double now) {
            nb::gil_scoped_release rel;
            return c.touch(keys.data(), keys.shape(0), n_hit, ckpt_at, now);
          },
          "keys"_a, "n_hit"_a, "ckpt_at"_a, "now"_a)
      .def(
          "touch_history",
          [](RadixCore& c, KeyArray keys, uint32_t n_hit, uint32_t ckpt_at, double now) {
            HistoryArrays h(keys.shape(0), true);
            saria::TouchHistory out = h.out();
            uint32_t m;
            {
              nb::gil_scoped_release rel;
              m = c.touch(keys.data(), keys.shape(0), n_hit, ckpt_at, now, &out);
            }
            return nb::make_tuple(m, h.to_dict(m));
          },
          "keys"_a, "n_hit"_a, "ckpt_at"_a, "now"_a)
      .def(
          "add",
          [](RadixCore& c, KeyArray keys, int tier, I64Array where, U32Array slots, uint32_t session,
             double now, bool filling, bool lock) {
            if (where.shape(0) != slots.shape(0))
              throw std::invalid_argument("add: `where` and `slots` differ in length");
            nb::gil_scoped_release rel;
            return c.add(keys.data(), keys.shape(0), tier, where.data(), slots.data(),
                         where.shape(0), session, now, filling, lock);
          },
          "keys"_a, "tier"_a, "where"_a, "slots"_a, "session"_a, "now"_a, "filling"_a = false,
          "lock"_a = false)
      .def(
          "set_ready",
          [](RadixCore& c, KeyArray keys, int tier, double now) {
            c.set_ready(keys.data(), keys.shape(0), tier, now);
          },
          "keys"_a, "tier"_a, "now"_a)
      .def("hold", [](RadixCore& c, KeyArray keys) { c.hold(keys.data(), keys.shape(0)); }, "keys"_a)
      .def(
          "release",
          [](RadixCore& c, KeyArray keys, double now) {
            size_t k = keys.shape(0);
            std::vector<uint8_t> out(k);
            c.release(keys.data(), k, now, out.data());
            return to_numpy(std::move(out), {k});
          },
          "keys"_a, "now"_a)
      .def(
          "add_existing",
          [](RadixCore& c, KeyArray keys, int tier, U32Array slots, double now) {
            if (keys.shape(0) != slots.shape(0))
              throw std::invalid_argument("add_existing: `keys` and `slots` differ in length");
            nb::gil_scoped_release rel;
            c.add_existing(keys.data(), keys.shape(0), tier, slots.data(), now);
          },
          "keys"_a, "tier"_a, "slots"_a, "now"_a)
      .def(
          "remove",
          [](RadixCore& c, KeyArray keys, int tier, double now) {
            size_t k = keys.shape(0);
            std::vector<uint32_t> out(k);
            {
              nb::gil_scoped_release rel;
              c.remove(keys.data(), k, tier, out.data(), now);
            }
            return to_numpy(std::move(out), {k});
          },
          "keys"_a, "tier"_a, "now"_a)
      .def(
          "evict",
          [](RadixCore& c, int tier, size_t count, double cutoff, double now) {
            std::vector<EvictedBlock> ev;
            {
              nb::gil_scoped_release rel;
              ev = c.evict(tier, count, cutoff, now);
            }
            return evicted_to_dict(std::move(ev));
          },
          "tier"_a, "count"_a, "cutoff"_a, "now"_a)
      .def(
          "evict_pinned",
          [](RadixCore& c, int tier, size_t count, double cutoff, double now, KeyArray pin,
             bool unpin) {
            std::vector<EvictedBlock> ev;
            {
              nb::gil_scoped_release rel;
              ev = c.evict_pinned(tier, count, cutoff, now, pin.data(), pin.shape(0), unpin);
            }
            return evicted_to_dict(std::move(ev));
          },
          "tier"_a, "count"_a, "cutoff"_a, "now"_a, "pin"_a, "unpin"_a)
      .def(
          "place",
          [](RadixCore& c, KeyArray keys, int tier, int64_t free, uint32_t session, double now) {
            std::pair<uint32_t, uint32_t> r;
            {
              nb::gil_scoped_release rel;
              r = c.place(keys.data(), keys.shape(0), tier, free, session, now);
            }
            return nb::make_tuple(r.first, r.second);
          },
          "keys"_a, "tier"_a, "free"_a, "session"_a, "now"_a)
      .def("lock", [](RadixCore& c, KeyArray keys) { c.lock(keys.data(), keys.shape(0)); }, "keys"_a)
      .def(
          "unlock",
          [](RadixCore& c, KeyArray keys, double now) { c.unlock(keys.data(), keys.shape(0), now); },
          "keys"_a, "now"_a)
      .def(
          "ckpt_add",
          [](RadixCore& c, OneKey key, int tier, uint32_t slot, double now, bool filling) {
            c.ckpt_add(key.data(), tier, slot, now, filling);
          },
          "key"_a, "tier"_a, "slot"_a, "now"_a, "filling"_a = false)
      .def(
          "ckpt_set_ready",
          [](RadixCore& c, OneKey key, int tier, double now) { c.ckpt_set_ready(key.data(), tier, now); },
          "key"_a, "tier"_a, "now"_a)
      .def(
          "ckpt_remove",
          [](RadixCore& c, OneKey key, int tier, double now) { return c.ckpt_remove(key.data(), tier, now); },
          "key"_a, "tier"_a, "now"_a)
      .def(
          "ckpt_evict",
          [](RadixCore& c, int tier, size_t count, double cutoff, double now) {
            return evicted_to_dict(c.ckpt_evict(tier, count, cutoff, now));
          },
          "tier"_a, "count"_a, "cutoff"_a, "now"_a)
      .def(
          "slot_of",
          [](const RadixCore& c, OneKey key, int tier, bool ready) {
            return c.slot_of(key.data(), tier, ready);
          },
          "key"_a, "tier"_a, "ready"_a = true)
      .def(
          "path_slots",
          [](const RadixCore& c, KeyArray keys, uint8_t tier_mask) {
            size_t n = keys.shape(0);
            std::vector<uint32_t> slots(n);
            std::vector<int8_t> tiers(n);
            uint32_t m = c.path_slots(keys.data(), n, tier_mask, slots.data(), tiers.data());
            slots.resize(m);
            tiers.resize(m);
            return nb::make_tuple(to_numpy(std::move(slots), {size_t{m}}),
                                  to_numpy(std::move(tiers), {size_t{m}}));
          },
          "keys"_a, "tier_mask"_a)
      .def(
          "path_to",
          [](const RadixCore& c, OneKey key) {
            std::vector<uint8_t> out;
            if (!c.path_to(key.data(), &out)) throw std::invalid_argument("path_to: unknown block");
            size_t n = out.size() / kKeyBytes;
            return to_numpy(std::move(out), {n, kKeyBytes});
          },
          "key"_a)
      .def(
          "ckpt_slot_of",
          [](const RadixCore& c, OneKey key, int tier, bool ready) {
            return c.ckpt_slot_of(key.data(), tier, ready);
          },
          "key"_a, "tier"_a, "ready"_a = true)
      .def("num_nodes", &RadixCore::num_nodes)
      .def("num_resident", &RadixCore::num_resident, "tier"_a)
      .def("num_ghosts", &RadixCore::num_ghosts)
      .def("num_checkpoints", &RadixCore::num_checkpoints)
      .def("ghosts_dropped", &RadixCore::ghosts_dropped)
      .def("memory_bytes", &RadixCore::memory_bytes)
      .def("last_now", &RadixCore::last_now)
      .def_static("node_bytes", []() { return RadixCore::node_bytes(); })
      .def("check_invariants", &RadixCore::check_invariants)
      .def("dump", [](const RadixCore& c) {
        // Every live node, parents before children is NOT guaranteed: callers
        // use the `index`/`parent` columns (parent 0 is the root).
        std::vector<uint32_t> live = c.live_nodes();
        size_t n = live.size();
        std::vector<uint8_t> keys(n * kKeyBytes), tiers(n), ckpt(n), filling(n), ckpt_filling(n);
        std::vector<uint32_t> index(n), parent(n), slots(n * saria::kNumTiers), ckpt_slots(n * saria::kNumTiers), reuse(n),
            hits(n), dram_ev(n), session(n), depth(n), lock(n);
        std::vector<double> last(n);
        for (size_t i = 0; i < n; ++i) {
          const saria::Node& nd = c.node(live[i]);
          std::memcpy(&keys[i * kKeyBytes], nd.key.w, kKeyBytes);
          index[i] = live[i];
          parent[i] = nd.parent;
          tiers[i] = nd.tiers;
          ckpt[i] = nd.ckpt;
          filling[i] = nd.filling;
          ckpt_filling[i] = nd.ckpt_filling;
          const saria::Checkpoint* cp = c.checkpoint(live[i]);
          for (int t = 0; t < saria::kNumTiers; ++t) {
            slots[i * saria::kNumTiers + t] = nd.slot[t];
            ckpt_slots[i * saria::kNumTiers + t] = (cp && (nd.ckpt & (1u << t))) ? cp->slot[t] : saria::kNil;
          }
          reuse[i] = nd.reuse;
          hits[i] = nd.hits;
          dram_ev[i] = nd.dram_evictions;
          session[i] = nd.session;
          depth[i] = nd.depth;
          lock[i] = nd.lock;
          last[i] = nd.last_access;
        }
        nb::dict d;
        d["keys"] = to_numpy(std::move(keys), {n, kKeyBytes});
        d["index"] = to_numpy(std::move(index), {n});
        d["parent"] = to_numpy(std::move(parent), {n});
        d["tiers"] = to_numpy(std::move(tiers), {n});
        d["ckpt"] = to_numpy(std::move(ckpt), {n});
        d["filling"] = to_numpy(std::move(filling), {n});
        d["ckpt_filling"] = to_numpy(std::move(ckpt_filling), {n});
        d["slots"] = to_numpy(std::move(slots), {n, size_t{saria::kNumTiers}});
        d["ckpt_slots"] = to_numpy(std::move(ckpt_slots), {n, size_t{saria::kNumTiers}});
        d["reuse"] = to_numpy(std::move(reuse), {n});
        d["hits"] = to_numpy(std::move(hits), {n});
        d["dram_evictions"] = to_numpy(std::move(dram_ev), {n});
        d["session"] = to_numpy(std::move(session), {n});
        d["depth"] = to_numpy(std::move(depth), {n});
        d["lock"] = to_numpy(std::move(lock), {n});
        d["last_access"] = to_numpy(std::move(last), {n});
        return d;
      });
}
