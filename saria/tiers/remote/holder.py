"""A node that only lends memory to the cluster: ``python -m saria.tiers.remote.holder``.

It sets up a Mooncake client contributing ``SEGMENT_BYTES`` of its memory,
prints ``ready`` and holds the segment until its stdin closes (or it is
killed: its objects vanish with it). Benches and tests use it as the node
whose memory holds the objects, so transfers cross the transport.

    python -m saria.tiers.remote.holder MASTER_URL METADATA_SERVER SEGMENT_BYTES
"""

from __future__ import annotations

import subprocess
import sys

from saria.tiers.remote.master import client_env
from saria.tiers.remote.settings import RemoteSettings

__all__ = ["start_holder"]


def start_holder(settings: RemoteSettings, segment_bytes: int) -> subprocess.Popen:
    """Starts a holder process for ``settings``' master; returns once it holds its segment."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "saria.tiers.remote.holder", settings.master,
         settings.metadata_server, str(int(segment_bytes))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the segment holder did not start: {line or proc.returncode}")
    return proc


def main() -> None:
    master, metadata, segment = sys.argv[1:4]
    client_env()
    from mooncake.store import MooncakeDistributedStore

    s = RemoteSettings(master=master, metadata_server=metadata, local_hostname="127.0.0.1",
                       segment_bytes=int(segment))
    store = MooncakeDistributedStore()
    rc = store.setup(s.hostname, s.metadata_server, s.segment_bytes, 16 << 20, s.protocol,
                     s.rdma_devices, s.master_address)
    print("ready" if rc == 0 else f"setup failed {rc}", flush=True)
    sys.stdin.read()
    store.close()


if __name__ == "__main__":
    main()
