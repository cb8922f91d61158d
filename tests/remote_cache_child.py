"""A saria node with its own DRAM (and SSD) for the cluster-tier core tests:
a ``TieredCache`` over a ``RemoteTier`` that lends a segment to the cluster.

    python remote_cache_child.py MASTER_URL METADATA_SERVER NAMESPACE BLOCK_BYTES SSD_DIR

Reads commands from stdin, one a line, and answers one line each:

* ``put N SEED``: stores the chain of ``N`` blocks ``blocks(N, BLOCK, SEED)``
  (``remote_node_child.blocks``), touches it (the publishing policy publishes
  on the first access here), waits for the puts, answers ``ready K`` (K:
  blocks the cluster holds now);
* ``quit``: closes and exits.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from remote_node_child import blocks  # noqa: E402

from saria.policy.publish import PublishPolicy  # noqa: E402
from saria.runtime import CacheConfig, TieredCache  # noqa: E402
from saria.tiers.remote import FleetKeys, RemoteSettings, RemoteTier, client_env  # noqa: E402


def main() -> None:
    master, metadata, namespace, block, ssd_dir = sys.argv[1:6]
    block = int(block)
    client_env()
    s = RemoteSettings(master=master, metadata_server=metadata, local_hostname="127.0.0.1",
                       segment_bytes=128 << 20, staging_rows=16, deadline_s=5.0,
                       fleet_keys=FleetKeys.from_env("SARIA_FLEET_KEY"))
    tier = RemoteTier(s, namespace, block)
    cfg = CacheConfig(block_bytes=block, dram_bytes=64 * block, ssd_dirs=(ssd_dir,),
                      ssd_bytes=64 * block, write_mode="async")
    cache = TieredCache(cfg, remote=tier, publish=PublishPolicy(min_reuse=1))
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        n, seed = int(cmd[1]), int(cmd[2])
        keys, data = blocks(n, block, seed)
        cache.store(keys, data)
        cache.touch(keys, hits=0)
        cache.flush()
        print(f"ready {int(tier.exists(keys).sum())}", flush=True)
    cache.close()
    tier.close()


if __name__ == "__main__":
    main()
