"""A second saria node for the cluster-tier tests: contributes a segment to
the cluster, puts ``n`` blocks derived from ``seed``, prints ``ready`` and
holds its segment until stdin closes (or it is killed).

    python remote_node_child.py MASTER_URL METADATA_SERVER NAMESPACE BLOCK_BYTES N SEED
"""

from __future__ import annotations

import sys
import time

import numpy as np

from saria.tiers.remote import FleetKeys, RemoteSettings, RemoteTier, client_env


def blocks(n: int, block: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, 32), dtype=np.uint8),
            rng.integers(0, 256, (n, block), dtype=np.uint8))


def wait_closed(guard, probe, timeout: float) -> bool:
    """Calls `probe` (a lookup: the breaker's probe once its cooldown is
    over) until the breaker is closed again; False after `timeout` s."""
    from saria.tiers.remote import BreakerState

    end = time.monotonic() + timeout
    while guard.state != BreakerState.CLOSED and time.monotonic() < end:
        probe()
        time.sleep(0.2)
    return guard.state == BreakerState.CLOSED


def main() -> None:
    master, metadata, namespace, block, n, seed = sys.argv[1:7]
    client_env()
    s = RemoteSettings(master=master, metadata_server=metadata, local_hostname="127.0.0.1",
                       segment_bytes=128 << 20, staging_rows=16, deadline_s=5.0,
                       fleet_keys=FleetKeys.from_env("SARIA_FLEET_KEY"))
    tier = RemoteTier(s, namespace, int(block))
    keys, data = blocks(int(n), int(block), int(seed))
    res = tier.put(keys, data)
    print("ready" if res.stored.all() else f"failed {res.failed.sum()}", flush=True)
    sys.stdin.read()
    tier.close()


if __name__ == "__main__":
    main()
