"""One simulated node: engines (vLLM double + real saria scheduler + real
workers per rank), faults, and the checks.

Determinism: the events decide everything; the SSD writer lands writes only
at ``land`` events (``write_mode="manual"``, forced here through the
scheduler module's ``CacheConfig`` -- a test-side seam, the connector does
not expose the mode), the op tracker's deadlines run on the virtual clock,
the load coordinator is ``serial`` and CPU copies run in the caller. A copy
made "late" is held in a future that lands at a ``late_land`` event (or when
someone waits for it).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import torch

import saria.connector.scheduler as sched_mod
from saria.connector.config import parse_config
from saria.connector.groups import GroupLayout
from saria.connector.layout import Geometry
from saria.connector.meta import Medium, SariaWorkerMetadata
from saria.connector.ops import OpTracker
from saria.connector.scheduler import SariaScheduler
from saria.connector.worker import SariaWorker
from saria.errors import ConfigError
from saria.index import Tier
from saria.tiers.remote.fleetkey import generate
from saria.tiers.ssd import slot_bytes_for
from whole_stack.cluster import FakeCluster
from whole_stack.failures import SimFailure
from whole_stack.pages import GARBAGE, page, state
from whole_stack.server import ServerNode
from whole_stack.vllm_double import Request, VllmDouble

BS = 4            # tokens per block
PAGE = 128        # bytes per page (one layer, one rank)
LAYERS = ("l0", "l1")
NUM_BLOCKS = 32   # vLLM's KV blocks per engine
DRAM_SLOTS = 12
SSD_BLOCKS = 48
BUDGET = 24       # tokens per step
OP_TIMEOUT = 20.0
# hybrid engines: one recurrent layer, its state (content bytes) in a padded
# page as vLLM registers a Mamba layer; the null block and state blocks take
# room in the block pool too
STATE_LAYER = "s0"
STATE_PAGE = 48
HYBRID_BLOCKS = 48


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LateCopy(Future):
    """A rank's copy that has not run yet; it runs at ``land`` or when waited for."""

    def __init__(self, fn) -> None:
        super().__init__()
        self._fn = fn

    def land(self) -> None:
        if self.done():
            return
        try:
            self._fn()
            self.set_result(None)
        except Exception as e:  # noqa: BLE001 -- a failed copy is an op failure
            self.set_exception(e)

    def result(self, timeout=None):
        self.land()
        return super().result(timeout)

    def exception(self, timeout=None):
        self.land()
        return super().exception(timeout)


class Rank:
    """One tensor-parallel worker: a real ``SariaWorker`` over CPU KV pages."""

    def __init__(self, engine: "Engine", rank: int) -> None:
        self.engine = engine
        self.rank = rank
        self.geo = dataclasses.replace(engine.geo, tp_rank=rank)
        blocks = engine.geo.num_gpu_blocks
        self.kv = {n: torch.full((blocks, PAGE), GARBAGE, dtype=torch.uint8)
                   for n in LAYERS + ((STATE_LAYER,) if engine.geo.hybrid else ())}
        self.worker = SariaWorker(engine.cfg, engine.vllm_config, self.geo)
        self.fail = False           # this step's copies fail
        self.slow_stores = False    # this step's store copies land late
        self.late: list[LateCopy] = []
        real_attach = self.worker._attach

        def attach():  # a new copier (first step with a server, or its restart): wrap it too
            real_attach()
            self._wrap(self.worker.copier)

        self.worker._attach = attach
        self.worker.register_kv_caches(self.kv)

    def _wrap(self, copier) -> None:
        real_submit = copier.submit

        def submit(t, layer):
            if self.fail:
                f = Future()
                f.set_exception(OSError("injected copy failure"))
                return f
            if self.slow_stores and t.src == Medium.KV:
                f = LateCopy(lambda: copier.copy(t, layer))
                self.late.append(f)
                return f
            return real_submit(t, layer)

        copier.submit = submit  # instance attribute: this worker only

    def land_late(self) -> None:
        for f in self.late:
            f.land()
        self.late = [f for f in self.late if not f.done()]

    def write_forward(self, layer: int, req: Request, first: int, end: int) -> None:
        digests = req.digest_chain(BS)
        pages = self.kv[LAYERS[layer]]
        for i in range(first, end):
            pages[req.block_ids[i]] = torch.from_numpy(page(digests[i], self.rank, layer, PAGE).copy())

    def holds(self, layer: int, block: int, digest: bytes) -> bool:
        return bool(np.array_equal(self.kv[LAYERS[layer]][block].numpy(),
                                   page(digest, self.rank, layer, PAGE)))

    def write_state(self, req: Request, end: int) -> None:
        """The recurrent state after `end` tokens, where vLLM keeps it: the
        state block of the position holding the last of them."""
        b = req.state_ids[(end - 1) // BS]
        self.kv[STATE_LAYER][b, :STATE_PAGE] = torch.from_numpy(
            state(tuple(req.all_token_ids[:end]), self.rank, STATE_PAGE).copy())

    def holds_state(self, req: Request, end: int) -> bool:
        pos = (end - 1) // BS
        b = req.state_ids[pos] if pos < len(req.state_ids) else 0
        return b != 0 and bool(np.array_equal(
            self.kv[STATE_LAYER][b, :STATE_PAGE].numpy(),
            state(tuple(req.all_token_ids[:end]), self.rank, STATE_PAGE)))


class Engine:
    """vLLM double + saria's scheduler + one worker per rank, on one drive folder."""

    def __init__(self, world: "World", name: str, tp: int, gen: int) -> None:
        self.world = world
        self.name = name
        self.tp = tp
        groups = None
        if world.hybrid:  # vLLM's groups: attention (0) and one recurrent group (1)
            groups = GroupLayout((0,), (0,), (LAYERS,), PAGE, BS, (1,), ((STATE_LAYER,),),
                                 STATE_PAGE, PAGE)
        self.geo = Geometry(BS, PAGE, LAYERS, tp, 0, HYBRID_BLOCKS if world.hybrid else NUM_BLOCKS,
                            "torch.uint8", "sim-model", "sim", groups)
        engine_id = f"sim-{os.getpid()}-{world.tag}-{name}-{gen}"
        self.vllm_config = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(engine_id=engine_id),
            cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256"),
            parallel_config=SimpleNamespace(data_parallel_index=0))
        self.session_name = f"{name}g{gen}-dp0"
        if world.node is not None:
            self.cfg = parse_config({
                "server": world.node.address, "server_timeout_s": SERVER_TIMEOUT,
                "engine_name": f"{name}g{gen}", "events": False, "coordinator": "serial",
                "op_timeout_s": OP_TIMEOUT})
        else:
            self.cfg = parse_config({
            "dram_bytes": DRAM_SLOTS * self.geo.slot_bytes, "events": False,
            "ssd_dirs": [os.path.join(world.root, name)], "ssd_bytes": 4096 + SSD_BLOCKS * self.tp * slot_bytes_for(self.geo.rank_bytes),
            "admission": world.admission, "coordinator": "serial", "op_timeout_s": OP_TIMEOUT,
            "promotion_min_age_s": 0,
            **({"remote": REMOTE} if world.cluster is not None else {})})
        self.last_failed = False
        self.ranks = [Rank(self, r) for r in range(tp)]  # workers first, as vLLM does
        for attempt in range(3):  # a loaded machine may miss the first hello's deadline
            try:
                with _fake_cluster(world.cluster):
                    self.sched = SariaScheduler(self.cfg, self.vllm_config, self.geo)
                break
            except ConfigError:
                if world.node is None or attempt == 2:
                    raise
        if world.cluster is not None and world.node is None:
            backend = self.sched.cache.backend
            real_fetch = backend.fetch_remote

            def fetch_remote(keys, slots):
                # failure 5: a restarted node fetches over the network what its own drive holds
                mine = [k for k in map(bytes, keys) if k in backend.recovered]
                if mine:
                    raise SimFailure("cluster-shadows-ssd", f"{name}: fetching {len(mine)} "
                                     "blocks from the cluster that its SSD recovered")
                return real_fetch(keys, slots)

            backend.fetch_remote = fetch_remote
        self.sched.ops = OpTracker(tp, OP_TIMEOUT, clock=world.clock)
        self.vllm = VllmDouble(self.sched, self._execute, block_size=BS,
                               num_blocks=self.geo.num_gpu_blocks, budget=BUDGET,
                               hybrid=world.hybrid)
        self.sending = Counter()     # vLLM's aggregator: finished_sending per rank
        self.recving = Counter()     # ... and finished_recving
        self.failed_recving: set[str] = set()
        self.lost_acks: set[int] = set()
        self.dropped = SariaWorkerMetadata()   # lost acks, delivered late (or never)
        self.ssd_read_fail: set[int] = set()
        self.bad: dict[str, str] = {}
        self.closed = False

    @property
    def cache(self):
        """The engine's in-process cache, or the server's cache of its layout."""
        if self.world.node is None:
            return self.sched.cache
        caches = self.world.node.caches()
        want = self.sched.cache.client.info.get("namespace")
        for c, ns in zip(caches, self.world.node.server.caches if self.world.node.server else ()):
            if ns == want:
                return c
        return None

    def _execute(self, so, before: dict[str, int]):
        meta = self.sched.build_connector_meta(so)
        self._check_load_specs()
        if self.world.kill_mid_step:  # after the scheduler's meta, before any worker ran
            self.world.kill_mid_step = False
            self.world.server_event("srv_kill")
        reqs = {rid: self.vllm.requests[rid] for rid in so.num_scheduled_tokens}
        wmeta = SariaWorkerMetadata()
        invalid: set[int] = set()
        finished: list[str] = []
        recving: list[str] = []
        state_bad: dict[str, str] = {}
        for r in self.ranks:
            w = r.worker
            fail = r.rank in self.ssd_read_fail
            for x in _readers(w) if fail else ():
                x.inject_failure(0, "read", "EIO", count=8)
            w.handle_preemptions(meta)   # vLLM's first call of every step
            if self.geo.hybrid:  # the state each request starts from, before its forward
                for rid, req in reqs.items():
                    if before[rid] and not r.holds_state(req, before[rid]):
                        state_bad.setdefault(rid, f"{rid} starts at token {before[rid]} from "
                                             f"another recurrent state (rank {r.rank})")
            w.start_load_kv(meta)
            for layer, name in enumerate(LAYERS):
                w.wait_for_layer_load(name)
                for rid, req in reqs.items():
                    r.write_forward(layer, req, before[rid] // BS, req.num_computed_tokens // BS)
                w.save_kv_layer(meta, name)
            if self.geo.hybrid:
                for rid, req in reqs.items():
                    r.write_state(req, req.num_computed_tokens)
            w.wait_for_save(meta)
            for x in _readers(w) if fail else ():  # a server restart may have made new ones
                x.inject_failure(0, "read", "EIO", count=0)
            res = w.get_transfer_results(so.finished_req_ids)
            finished.extend(res.finished_sending)
            recving.extend(res.finished_recving)
            self.failed_recving |= res.failed_recving
            errors = w.get_block_ids_with_load_errors()
            invalid |= errors
            m = w.build_worker_meta()
            # a lost ack is one of copies that all went well (a rank whose copies
            # failed reports it with the load errors vLLM sees: lost, both are)
            lost = r.rank in self.lost_acks and m is not None and not (m.failed or m.bad_ssd
                                                                       or errors)
            if m is not None and not lost:
                wmeta = wmeta.aggregate(m)
            elif lost:  # it may still arrive, however late (``late_land``, quiescence)
                self.dropped = self.dropped.aggregate(m)
        # the attention of this step read every block below each request's
        # computed tokens: each must hold its own bytes on every rank and layer
        self.bad = {}
        for rid, req in reqs.items():
            digests = req.digest_chain(BS)
            for i in range(before[rid] // BS):
                b = req.block_ids[i]
                wrong = [(r.rank, layer) for r in self.ranks for layer in range(len(LAYERS))
                         if not r.holds(layer, b, digests[i])]
                if wrong:
                    self.bad[rid] = f"block {i} (KV block {b}) of {rid}: ranks/layers {wrong} " \
                                    f"hold other bytes"
                    break
        for rid, why in state_bad.items():
            self.bad.setdefault(rid, why)
        self.sending.update(finished)
        done = [rid for rid, n in self.sending.items() if n >= self.tp]
        for rid in done:
            del self.sending[rid]
        self.recving.update(recving)   # vLLM's aggregator: every rank's, then failed ones
        received = {rid for rid, n in self.recving.items() if n >= self.tp}
        for rid in received:
            del self.recving[rid]
        failed_recving = self.failed_recving & received
        self.failed_recving -= failed_recving
        for f in (self.ssd_read_fail, self.lost_acks):
            f.clear()
        for r in self.ranks:
            r.fail = r.slow_stores = False
        return wmeta, done, invalid, received, failed_recving

    def step(self) -> None:
        down = self.world.node is not None and not self.world.node.answering
        before = self._waited()
        out = self.vllm.step()
        for rid, why in self.bad.items():
            if rid not in out["affected"]:
                raise SimFailure("wrong-kv", f"{self.name}: {why}")
        if self.world.node is None:
            return
        # failure 6: a server that does not answer must cost a step nothing
        # once the client knows: no call on the step path after a failed step
        failed = self._waited() - before
        if down and failed > 1 and self.last_failed:
            raise SimFailure("server-down-stall", f"{self.name}: a step with the server "
                             f"down waited out {failed} more call deadlines")
        self.last_failed = down and failed > 0

    def _check_load_specs(self) -> None:
        """Before any worker reads: every DRAM slot a load op names is still
        its block's ready DRAM copy in the index, and the block is locked --
        a spec never names a slot it does not hold (failure 1: the bytes are
        still right when the worker reads them in this step, so only this
        check sees a slot that already went back to the pool). In process
        only: a server's specs of an older boot are stale by design (the
        workers fail them)."""
        if self.world.node is not None:
            return
        index = self.cache.index
        d = index.dump()
        locked = {bytes(k) for k, n in zip(d["keys"], d["lock"]) if n > 0}
        for op in self.sched.ops.pending():
            spec = op.spec
            if op.kind != "load" or not hasattr(spec, "tiers") or spec.num_blocks == 0:
                continue
            slots, tiers = index.slots_in(spec.path, Tier.DRAM)
            fetched = set(spec.remote.tolist())  # filling until their fetch completes
            for i in range(spec.start, spec.num_blocks):
                if spec.tiers[i] != int(Tier.DRAM) or i in fetched:
                    continue
                if (i >= len(slots) or tiers[i] != int(Tier.DRAM) or slots[i] != spec.slots[i]
                        or bytes(spec.path[i]) not in locked):
                    raise SimFailure("wrong-kv", f"{self.name}: load op {op.op_id} of "
                                     f"{op.req_id} reads block {i} from DRAM slot "
                                     f"{spec.slots[i]}, which its block no longer holds")

    def _waited(self) -> int:
        """Server calls that failed after waiting (a breaker's refusals cost nothing)."""
        cache = self.sched.cache
        breaker = getattr(getattr(cache, "client", None), "breaker", None)
        return getattr(cache, "failures", 0) - (breaker.skipped if breaker is not None else 0)

    def deliver_dropped(self) -> None:
        """Acks that were lost on the way arrive after all (a store past its
        deadline is quarantined until its last report arrives)."""
        if self.dropped.done or self.dropped.failed:
            m, self.dropped = self.dropped, SariaWorkerMetadata()
            self.sched.update_connector_output(SimpleNamespace(kv_connector_worker_meta=m))

    def acknowledged_ssd(self) -> set[bytes]:
        if self.world.node is not None:
            return set()  # the server's drive: checked when the server restarts
        d = self.cache.index.dump()
        on = (d["tiers"] & Tier.SSD.bit) != 0
        return {bytes(k) for k in d["keys"][on]}

    def close(self, *, crash: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for r in self.ranks:
            for f in r.late:   # a crashed process's copies end with it
                if not f.done():
                    f.set_exception(OSError("process gone"))
            r.worker.shutdown()
        if self.world.node is not None:
            if crash:  # its session lives on until its lease runs out: no bye
                client = self.sched.cache.client
                client.session = None
                client.close()
                if self.world.node.server is not None:
                    self.world.node.server.expire_engines.add(self.session_name)
            else:
                self.sched.shutdown()
        elif crash:  # no flush: what the writer had not landed is lost
            self.sched.cache.close()
        else:
            self.sched.shutdown()


class World:
    """Engines on one node, driven by a list of events."""

    def __init__(self, *, engines: tuple[int, ...] = (1, 2), admission: str = "full-duplicate",
                 tag: str = "", cluster: bool = False, server: bool = False,
                 hybrid: bool = False) -> None:
        self.clock = Clock()
        self.hybrid = hybrid
        self.cluster = FakeCluster() if cluster else None
        self.admission = admission
        self.tag = tag or os.urandom(3).hex()
        self.root = tempfile.mkdtemp(prefix="saria-sim-", dir=os.environ.get("SARIA_SIM_DIR"))
        self.node = None
        if server:
            one = 4096 + SSD_BLOCKS * 2 * slot_bytes_for(len(LAYERS) * PAGE)
            self.node = ServerNode(self.root, dram_bytes=2 * DRAM_SLOTS * 2 * len(LAYERS) * PAGE,
                                   ssd_bytes=2 * one, admission=admission, max_models=2)
            self.node.start()
        self.gens = Counter()
        self.kept_by_server: set[bytes] = set()
        self.kill_mid_step = False  # srv_flap: the next engine step kills the server mid-step
        self.engines = [self._engine(f"e{i}", tp) for i, tp in enumerate(engines)]
        self.next_req = 0
        self.log: list[str] = []

    def _engine(self, name: str, tp: int) -> Engine:
        self.gens[name] += 1
        with _manual_writes():
            return Engine(self, name, tp, self.gens[name])

    # ------------------------------------------------------------- events

    def apply(self, ev: tuple) -> None:
        kind, e = ev[0], self.engines[ev[1] % len(self.engines)]
        v = e.vllm
        if kind == "arrive":
            _, _, tokens, max_new = ev
            self.next_req += 1
            v.add(Request(f"r{self.next_req}", list(tokens), max_new))
        elif kind == "step":
            e.step()
        elif kind == "evict_local":
            v.pool.evict_cached(ev[2])
        elif kind == "alloc_fail":
            v.fail_next_alloc = True
        elif kind == "preempt" and v.running:
            v.preempt(v.running[ev[2] % len(v.running)])
        elif kind == "abort":
            live = [r for r in v.requests.values() if r.status != "finished"]
            if live:
                v.abort(live[ev[2] % len(live)].request_id)
        elif kind == "rank_fail":
            e.ranks[ev[2] % e.tp].fail = True
        elif kind == "rank_slow":
            e.ranks[ev[2] % e.tp].slow_stores = True
        elif kind == "late_land":
            for r in e.ranks:
                r.land_late()
            e.deliver_dropped()
        elif kind == "ack_lost":
            e.lost_acks.add(ev[2] % e.tp)
        elif kind == "ssd_read_fail":
            e.ssd_read_fail.add(ev[2] % e.tp)
        elif kind in ("land", "land_fail") and e.cache is None:
            return  # the server is down or has not opened this layout yet
        elif kind == "land":
            e.cache.run_writes(ev[2])
        elif kind == "land_fail":
            ssd = e.cache.backend.ssd
            ssd.inject_failure(0, "write", "EIO", count=1)
            e.cache.run_writes(1)
            ssd.inject_failure(0, "write", "EIO", count=0)
            ssd.revive(0)
        elif kind == "clock":
            self.clock.now += ev[2]
        elif kind == "crash":
            self.restart(e, crash=True)
        elif kind.startswith("srv_"):
            if self.node is not None:
                self.server_event(kind)
        elif self.cluster is None:
            return
        elif kind == "publish":
            e.cache.run_publishes()
        elif kind == "cl_fail_get":
            self.cluster.fail_gets += ev[2]
        elif kind == "cl_corrupt":
            self.cluster.corrupt(ev[2])
        elif kind == "cl_vanish":
            self.cluster.vanish(ev[2])
        elif kind == "cl_late":
            self.cluster.late_gets += 1
        elif kind == "cl_land_late":
            self.cluster.land_late()
        elif kind == "cl_down":
            self.cluster.down = True
        elif kind == "cl_up":
            self.cluster.down = False

    def server_event(self, kind: str) -> None:
        node, srv = self.node, self.node.server
        if kind == "srv_pause" and srv is not None:
            srv.answering.clear()
        elif kind == "srv_resume" and srv is not None:
            srv.answering.set()
        elif kind == "srv_drop" and srv is not None:
            srv.drop_replies += 1
        elif kind == "srv_expire" and srv is not None:
            srv.expire_all = True
        elif kind == "srv_kill" and srv is not None:
            self.kept_by_server = node.acknowledged_ssd()
            node.stop(crash=True)
        elif kind == "srv_start" and srv is None:
            self.start_server()
        elif kind == "srv_flap":
            # a crash-looping server (N2): restarted -- the engines say hello
            # and their next meta names its new pool -- then killed again
            # between a scheduler's step and its workers' (its pool file gone)
            if srv is not None:
                self.server_event("srv_kill")
            self.start_server()
            self.kill_mid_step = True

    def start_server(self, closed: Engine | None = None) -> None:
        """A new server on the same drive: every block its SSD acknowledged is
        found again once the engines open their layouts (`closed`: an engine
        that just ended and makes no call -- its successor's hello opens its
        layout, so ``restart`` checks then: server seed 37)."""
        self.node.start()
        if closed is None:
            self._check_server_recovery()

    def _check_server_recovery(self) -> None:
        layouts = {e.tp for e in self.engines}
        end = time.monotonic() + 30.0  # generous: a loaded machine is slow to say hello
        while time.monotonic() < end:  # the clients say hello again (past their breaker)
            for e in self.engines:
                e.sched.cache.gauges()
            if len(self.node.caches()) >= len(layouts):
                break
            time.sleep(0.1)
        lost = self.kept_by_server - self.node.recovered()
        self.kept_by_server = set()
        if lost:
            raise SimFailure("ssd-lost", f"server: {len(lost)} acknowledged SSD blocks not "
                             "recovered after a restart")

    def restart(self, e: Engine, *, crash: bool) -> Engine:
        """The engine's process ends (crash: unlanded writes lost) and a new one
        starts on the same drive: every block the SSD acknowledged is found."""
        kept = e.acknowledged_ssd()
        e.close(crash=crash)
        started = False
        if self.node is not None and not self.node.answering:
            # an engine does not start without its server (a config error): it comes back first
            if self.node.server is None:
                self.start_server(closed=e)  # server seed 4: the closed client was asked for gauges
                started = True
            self.node.server.answering.set()
        new = self._engine(e.name, e.tp)
        self.engines[self.engines.index(e)] = new
        if started:
            self._check_server_recovery()
        lost = kept - set(new.cache.backend.recovered)
        if lost:
            raise SimFailure("ssd-lost", f"{e.name}: {len(lost)} acknowledged SSD blocks not "
                             "recovered after a restart")
        return new

    # ------------------------------------------------------------ the end

    def quiesce(self) -> None:
        """No more faults: every request runs to its end, every late copy lands,
        every lost ack expires, every write lands."""
        self.kill_mid_step = False
        if self.cluster is not None:
            self.cluster.down = False
            self.cluster.fail_gets = self.cluster.late_gets = 0
            self.cluster.land_late()
        if self.node is not None:
            if self.node.server is None:
                self.start_server()
            self.node.server.answering.set()
            self.node.server.drop_replies = 0
        for e in self.engines:
            for _ in range(400):
                for r in e.ranks:
                    r.land_late()
                e.deliver_dropped()
                if e.vllm.idle() and len(e.sched.ops) == 0:
                    break
                if not (e.vllm.waiting or e.vllm.running):
                    self.clock.now += OP_TIMEOUT / 4   # only acks can be outstanding
                e.step()
            else:
                raise SimFailure("stuck", f"{e.name}: requests or ops never end "
                                 f"({len(e.vllm.waiting)} waiting, {len(e.vllm.running)} running, "
                                 f"{len(e.vllm.delayed_free)} frees delayed, {len(e.sched.ops)} ops)")
            if e.cache is not None:
                e.cache.run_writes()
        if self.node is not None:
            self._wait_for_debts()

    def _wait_for_debts(self) -> None:
        """Each client pays what it owes (cancels of prepares whose reply was
        lost) once a probe of its breaker gets a reply. A probe whose reply
        was lost too backs off, up to the breaker's ``max_s``: the server
        rightly holds those specs until the next probe, up to that long plus
        a deadline or two after the last fault -- so quiescence waits for it
        (bounded: debts still owed then are found by the leak check)."""
        clients = [e.sched.cache.client for e in self.engines]
        end = time.monotonic() + 2 * (max(c.breaker.max_s for c in clients) + SERVER_TIMEOUT)
        while time.monotonic() < end and any(_owes(c) for c in clients):
            time.sleep(0.05)

    def check_leaks(self) -> None:
        if self.node is not None:
            return self.check_server_leaks()
        for e in self.engines:
            g = e.cache.gauges()
            st = e.cache.index.stats()
            if e.sched.reqs:
                raise SimFailure("leak", f"{e.name}: scheduler still tracks {sorted(e.sched.reqs)}")
            used = g["dram_used_slots"] - e.cache.staging_slots  # staging is reserved up front
            ck = e.cache.index.dump()["ckpt"] if self.hybrid else np.zeros(0, np.uint8)
            units = e.cache.backend.state_units
            ck_dram = int(np.count_nonzero(ck & Tier.DRAM.bit)) * units
            if used != st.resident["DRAM"] + ck_dram:
                raise SimFailure("leak", f"{e.name}: {used} DRAM slots used outside staging, "
                                 f"{st.resident['DRAM']} held by the index, {ck_dram} by "
                                 "its checkpoints")
            held = (st.resident["SSD"] + len(e.cache.backend.recovered)
                    + int(np.count_nonzero(ck & Tier.SSD.bit)) * units)
            if g["ssd_slots"] - g["ssd_free_slots"] != held:
                raise SimFailure("leak", f"{e.name}: {g['ssd_slots'] - g['ssd_free_slots']} SSD "
                                 f"slots used, {held} held")
            n = st.resident["DRAM"]
            ev = e.cache.index.evict(Tier.DRAM, n)
            if len(ev) != n:
                raise SimFailure("leak", f"{e.name}: {n - len(ev)} DRAM blocks still locked")
            if any(v.block_ids for v in e.vllm.requests.values()):
                raise SimFailure("leak", f"{e.name}: vLLM blocks never freed")

    def check_server_leaks(self) -> None:
        time.sleep(0.3)  # a turn of the server's loop: crashed engines' leases run out
        for e in self.engines:
            if e.sched.reqs or len(e.sched.ops):
                raise SimFailure("leak", f"{e.name}: scheduler still tracks requests or ops")
        held = self.node.held_by_sessions()
        if held:
            raise SimFailure("leak", "server: after quiescence " + "; ".join(held))
        for c in self.node.caches():
            g = c.gauges()
            used = g["dram_used_slots"] - c.staging_slots
            if used != c.index.stats().resident["DRAM"]:
                raise SimFailure("leak", f"server: {used} DRAM slots used outside staging, "
                                 f"{c.index.stats().resident['DRAM']} held by the index")

    def finish(self) -> None:
        self.quiesce()
        self.check_leaks()
        if self.node is not None:
            self.kept_by_server = self.node.acknowledged_ssd()
            self.node.stop(crash=False)
            self.start_server()
            return
        for e in list(self.engines):
            self.restart(e, crash=False)

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.land_late()
        for e in self.engines:
            try:
                e.close(crash=True)
            except Exception:  # noqa: BLE001 -- best effort at teardown
                pass
        if self.node is not None:
            self.node.stop(crash=True)
        shutil.rmtree(self.root, ignore_errors=True)


SERVER_TIMEOUT = 0.5   # the engines' deadline per server call (seconds, real time)
REMOTE = {"master": "127.0.0.1:1", "metadata_server": "http://127.0.0.1:1/metadata",
          "deadline_s": 0.5, "exist_cache_s": 0, "staging_rows": 16, "lane": 2,
          "breaker_failures": 3, "breaker_cooldown_s": 0.5, "segment_bytes": 0,
          "fleet_key_env": "SARIA_SIM_FLEET_KEY"}  # rows are signed (set below)
os.environ.setdefault("SARIA_SIM_FLEET_KEY", generate(1))


def _readers(w: SariaWorker) -> list:
    """The SSD stores a worker reads from: KV pages' and checkpoints'."""
    reader = w.coordinator.reader if w.coordinator is not None else None
    return [x.ssd_store() for x in (reader, w.states)
            if x is not None and (x is reader or x.ssd_dirs)]


def _owes(client) -> bool:
    """Whether `client` still owes the server a call; under its lock, so a
    batch of debts on its way (the heartbeat pays under it) counts as owed."""
    with client._lock:
        return client.debts > 0


class _fake_cluster:
    """The engine's ``RemoteTier`` gets the simulated cluster's client (test
    seam: ``saria.tiers.remote.RemoteTier``, which the scheduler imports
    when it builds its cluster tier)."""

    def __init__(self, cluster: FakeCluster | None) -> None:
        self.cluster = cluster

    def __enter__(self):
        import saria.tiers.remote as remote

        self.real = remote.RemoteTier
        if self.cluster is not None:
            real, cl = self.real, self.cluster
            remote.RemoteTier = lambda *a, **k: real(*a, client=cl.client(), **k)

    def __exit__(self, *exc):
        import saria.tiers.remote as remote

        remote.RemoteTier = self.real


class _manual_writes:
    """The SSD writer lands writes only when the schedule says (test seam:
    the scheduler module's ``CacheConfig`` with ``write_mode="manual"``)."""

    def __enter__(self):
        self.real = sched_mod.CacheConfig
        real = self.real
        sched_mod.CacheConfig = lambda **kw: real(**{**kw, "write_mode": "manual"})

    def __exit__(self, *exc):
        sched_mod.CacheConfig = self.real
