"""The cluster tier: saria's blocks in a Mooncake Store shared by a fleet.

One import line per module: settings (what a node's client needs), the
fleet key, rows (the self-describing, signed object format), guard (deadline, lane,
breaker), stats, the tier itself, and a master launcher for tests and
benches. Importing this package does not import Mooncake; ``RemoteTier``
does when it connects.
"""

from saria.tiers.remote.fleetkey import FleetKeys
from saria.tiers.remote.guard import BreakerState, Guard, RemoteUnavailable
from saria.tiers.remote.master import MooncakeMaster, client_env, mooncake_available
from saria.tiers.remote.rows import HEADER_BYTES, RowCodec, SignedRowCodec, crc32c_rows, object_key
from saria.tiers.remote.settings import RemoteSettings, parse_master_url
from saria.tiers.remote.stats import RemoteStats
from saria.tiers.remote.tier import ErrorCode, GetResult, PutResult, RemoteSetupError, RemoteTier

__all__ = [
    "BreakerState", "ErrorCode", "FleetKeys", "GetResult", "Guard", "HEADER_BYTES", "MooncakeMaster",
    "PutResult", "RemoteSettings", "RemoteSetupError", "RemoteStats", "RemoteTier",
    "RemoteUnavailable", "RowCodec", "SignedRowCodec", "client_env", "crc32c_rows", "mooncake_available",
    "object_key", "parse_master_url",
]
