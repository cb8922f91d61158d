"""``saria serve``: one cache per node; ``saria status ADDRESS``: its figures.

    saria serve --dram 64GB --ssd-dir /mnt/nvme0/kv --ssd-dir /mnt/nvme1/kv --ssd-bytes 2TB
    saria serve --dram 64GB --remote mooncake://10.0.0.5:50051 --remote-segment 32GB \
        --remote-fleet-key /etc/saria/fleet.key
    saria serve --config /etc/saria/serve.toml      # the same keys as the flags
    saria status ipc:///run/user/1000/saria/serve.sock
    saria serve keygen --out /etc/saria/keys --name server --name engine-a
    saria serve --listen tcp://10.0.0.7:5555 --curve-secret /etc/saria/keys/server.key_secret \
        --curve-clients /etc/saria/clients --tenants /etc/saria/tenants.json

Engines point their connector's ``server`` key at ``--listen``. ``--remote``
makes a Mooncake Store the fleet shares this node's cluster tier (its master;
the metadata server defaults to the master host's, port 8080). At start the
server checks every SSD directory (it never creates one), the cluster tier and
the listen address, and exits with one line naming the flag if one is bad;
it logs one line per tier, serves until SIGTERM, then flushes, says what it
kept for the next start (SSD blocks) and what not (DRAM), and closes.
"""

from __future__ import annotations

import argparse
import logging
import sys

from saria.units import parse_size


def register(sub) -> None:
    from saria.serve.paths import default_listen

    p = sub.add_parser("serve", help="run the node's shared cache server (one per node)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a TOML file of these flags' values (keys as the flags: dram, ssd-dir, "
                   "...); flags given here override it")
    p.add_argument("--dram", default="16GB", help="DRAM pool size (default 16GB)")
    p.add_argument("--ssd-dir", action="append", default=[],
                   help="an SSD directory (repeat for several drives)")
    p.add_argument("--ssd-bytes", default="0", help="SSD bytes per directory (default: off)")
    p.add_argument("--admission", default="saria",
                   help="SSD admission policy (every --policy name of saria replay; budget:<f>)")
    p.add_argument("--promotion", default="lazy", help="promotion after prefill (none|full|lazy)")
    p.add_argument("--dwpd", type=float, default=1.0, help="the drives' rating (budget admission)")
    p.add_argument("--max-models", type=int, default=1,
                   help="model layouts served at once; each gets 1/N of DRAM and SSD (default 1)")
    p.add_argument("--lease", type=float, default=10.0,
                   help="seconds an engine's session outlives its last call or heartbeat")
    p.add_argument("--listen", default=default_listen(),
                   help="ZMQ address (default: an owner-only ipc:// socket in the runtime dir)")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus endpoint port")
    p.add_argument("--events", default=None, metavar="ENDPOINT",
                   help="publish the node's KV events (vLLM's KVEventBatch, ZMQ PUB) at this "
                   "endpoint, e.g. tcp://127.0.0.1:5557 (default: off; tcp://*:... reaches "
                   "every host: events name each prompt's blocks)")
    p.add_argument("--node", default="", help="this node's name in event topics kv@NODE@MODEL "
                   "(default: the host name)")
    p.add_argument("--scrub-rate", default="0",
                   help="background SSD scrub, bytes per second (e.g. 50MB; default 0: off)")
    p.add_argument("--remote", default=None, metavar="mooncake://HOST:PORT",
                   help="the cluster tier: a Mooncake Store master (default: off)")
    for flag, key, what in _REMOTE_FLAGS:
        p.add_argument(flag, default=None, dest=key, help=what)
    _security_flags(p)
    p.set_defaults(func=_serve, parser=p)

    s = sub.add_parser("status", help="print a running saria serve's figures")
    s.add_argument("address", nargs="?", default=default_listen())
    s.add_argument("--timeout", type=float, default=2.0)
    s.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    s.add_argument("--curve-secret", default=None, metavar="FILE",
                   help="for a tcp:// server: this client's NAME.key_secret")
    s.add_argument("--curve-key", default=None, metavar="FILE",
                   help="for a tcp:// server: the server's NAME.key")
    s.set_defaults(func=_status)


def _security_flags(p) -> None:
    """Identity, tenants and quotas (docs/security.md; issue 32)."""
    from saria.serve.limits import Limits

    d = Limits()
    p.add_argument("action", nargs="?", choices=("keygen",),
                   help="keygen: write CurveZMQ key pairs (--out DIR, --name NAME...) and exit")
    p.add_argument("--out", default=".", help="keygen: the folder for the key files")
    p.add_argument("--name", action="append", default=[], help="keygen: a key pair's name "
                   "(NAME.key public, NAME.key_secret 0600; repeat)")
    p.add_argument("--curve-secret", default=None, metavar="FILE",
                   help="this server's NAME.key_secret; a tcp:// --listen needs it")
    p.add_argument("--curve-clients", default=None, metavar="DIR",
                   help="the allowed clients' NAME.key files; each is the peer key:NAME")
    p.add_argument("--insecure-tcp", action="store_true",
                   help="serve tcp:// without CURVE: ANYONE who reaches it can read and poison "
                   "the cache (warned at every start)")
    p.add_argument("--allow-uid", type=int, action="append", default=[],
                   help="an ipc:// peer uid let in besides this server's own (repeat)")
    p.add_argument("--tenants", default=None, metavar="FILE",
                   help="the tenants file (JSON: peers -> tenants, sharing groups)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="where --metrics-port binds (default 127.0.0.1)")
    for flag, key, what in (
            ("--max-frame", "max_frame", "bytes of one request"),
            ("--max-sessions", "sessions", "open sessions in all"),
            ("--max-sessions-per-peer", "sessions_per_peer", "open sessions of one peer (uid "
             "or client key)"),
            ("--max-sessions-per-process", "sessions_per_process", "open sessions of one client "
             "process"),
            ("--max-specs", "specs_per_session", "loads and stores one session holds"),
            ("--max-lock-age", "spec_age_s", "seconds a held load or store lives; heartbeats "
             "do not extend it"),
            ("--max-staging-share", "staging_per_session", "the share of staging slots one "
             "session, or one process over its sessions, may hold"),
            ("--max-hello-rate", "hellos_per_s", "hellos per second from one client process"),
            ("--min-slot", "min_slot_bytes", "a layout's smallest block, bytes"),
            ("--max-slot", "max_slot_bytes", "a layout's largest block, bytes"),
            ("--max-slots", "max_slots", "DRAM slots one namespace may have"),
            ("--namespace-idle", "namespace_idle_s", "seconds a namespace no session uses "
             "stays open")):
        kind = float if isinstance(getattr(d, key), float) else int
        p.add_argument(flag, type=kind, default=getattr(d, key), dest=f"limit_{key}",
                       help=f"{what} (default {getattr(d, key)}; 0: no limit)")


def _security(args) -> dict:
    """The security flags as ``ServerConfig`` fields."""
    from dataclasses import fields

    from saria.serve.limits import Limits

    limits = Limits(**{f.name: getattr(args, f"limit_{f.name}") for f in fields(Limits)})
    return dict(limits=limits, curve_secret=args.curve_secret, curve_clients=args.curve_clients,
                insecure_tcp=args.insecure_tcp, allow_uids=tuple(args.allow_uid),
                tenants=args.tenants, metrics_host=args.metrics_host)


def _keygen(args) -> int:
    from saria.errors import ConfigError
    from saria.serve.auth import write_keypair

    if not args.name:
        raise ConfigError("--name", "keygen needs at least one --name")
    for name in args.name:
        public, secret = write_keypair(args.out, name)
        print(f"{name}: {public} (public), {secret} (secret, 0600)")
    return 0


#: --remote-* flags -> RemoteSettings.from_mapping keys
_REMOTE_FLAGS = (
    ("--remote-metadata", "metadata_server", "metadata server (http://HOST:PORT/metadata, "
     "P2PHANDSHAKE or etcd; default: the master host's, port 8080)"),
    ("--remote-protocol", "protocol", "tcp (default) or rdma"),
    ("--remote-rdma-devices", "rdma_devices", "RDMA devices for --remote-protocol rdma"),
    ("--remote-host", "local_hostname", "the address other nodes reach this node's segment at "
     "(default: the host name)"),
    ("--remote-segment", "segment_bytes", "memory this node lends the cluster (default 1GB; 0: none)"),
    ("--remote-buffer", "local_buffer_bytes", "Mooncake's own transfer buffer (default 64MB)"),
    ("--remote-deadline", "deadline", "the longest one remote call may take (default 50ms)"),
    ("--remote-fleet-key", "fleet_key_file", "the fleet's key file, mode 0600 (saria fleet-key "
     "makes one); --remote needs it or --remote-fleet-key-env"),
    ("--remote-fleet-key-env", "fleet_key_env", "an environment variable holding the fleet's key"),
    ("--remote-fleet-key-id", "fleet_key_id", "the fleet key id to sign with (default: the highest)"),
)


def remote_mapping(args) -> dict | None:
    """The ``--remote*`` flags as ``RemoteSettings.from_mapping`` keys (None: off)."""
    from saria.errors import ConfigError

    given = {key: getattr(args, key) for _, key, _ in _REMOTE_FLAGS if getattr(args, key) is not None}
    if args.remote is None:
        if given:
            flag = next(f for f, k, _ in _REMOTE_FLAGS if k in given)
            raise ConfigError(flag, "needs --remote mooncake://HOST:PORT")
        return None
    return {"master": args.remote, **given}


def _serve(args) -> int:
    from saria.serve.server import ServerConfig, run

    if args.action == "keygen":
        return _keygen(args)
    if args.config is not None:
        from saria.cli import serve_config

        rest = args.argv[args.argv.index("serve") + 1:]
        args = serve_config.parse(args.parser, rest, serve_config.load(args.config),
                                  source=args.config)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    cfg = ServerConfig(
        listen=args.listen, dram_bytes=int(parse_size(args.dram, name="--dram")),
        ssd_dirs=tuple(args.ssd_dir), ssd_bytes=int(parse_size(args.ssd_bytes, name="--ssd-bytes")),
        admission=args.admission, promotion=args.promotion, dwpd=args.dwpd,
        max_models=args.max_models, lease_s=args.lease, metrics_port=args.metrics_port,
        events=args.events, node=args.node,
        scrub_bytes_per_s=float(parse_size(args.scrub_rate, name="--scrub-rate")),
        remote=remote_mapping(args), **_security(args))
    return run(cfg)


def _status(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from saria.serve.auth import ClientSecurity
    from saria.serve.client import server_stats

    snap = server_stats(args.address, args.timeout,
                        ClientSecurity(args.curve_secret, args.curve_key))
    if args.json:
        print(json.dumps(snap, indent=2))
        return 0
    con = Console()
    con.print(f"saria serve at {snap['address']} (boot {snap['boot']}): {snap['sessions']} "
              f"session(s), {snap['leases_expired']} lease(s) expired, "
              f"{snap['rpc_errors']} RPC error(s)")
    t = Table(title="engines")
    remote = any("remote_hit_blocks" in e for e in snap["engines"].values())
    cols = ["engine", "sessions", "matched blocks", "DRAM hit blocks", "SSD hit blocks"]
    tiers = ["dram", "ssd"] + (["remote"] if remote else [])
    for col in cols + (["cluster hit blocks"] if remote else []) + ["hit bytes"]:
        t.add_column(col)
    for name in sorted(set(snap["engines"]) | set(snap["sessions_by_engine"])):
        e = snap["engines"].get(name, {})
        t.add_row(name, str(snap["sessions_by_engine"].get(name, 0)),
                  f"{e.get('matched_blocks', 0):,.0f}",
                  *(f"{e.get(f'{tier}_hit_blocks', 0):,.0f}" for tier in tiers),
                  f"{sum(e.get(f'{tier}_hit_bytes', 0) for tier in tiers):,.0f}")
    con.print(t)
    for ns, g in snap["namespaces"].items():
        t = Table(title=f"namespace {ns}")
        t.add_column("gauge")
        t.add_column("value", justify="right")
        for k, v in sorted(g.items()):
            t.add_row(k, f"{v:,.4g}")
        con.print(t)
    t = Table(title="RPC latency")
    for col in ("op", "count", "mean"):
        t.add_column(col)
    for op, r in sorted(snap["rpc"].items()):
        t.add_row(op, f"{r['count']:,}", f"{1e6 * r['sum_s'] / max(r['count'], 1):,.0f} µs")
    con.print(t)
    return 0
