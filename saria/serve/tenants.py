"""Tenants: whose blocks a peer may see.

Each peer the gate lets in has a name (``uid:N`` over IPC, ``key:NAME`` over
CURVE, ``tcp:insecure`` with ``--insecure-tcp``). The tenants file maps names
to tenants and tenants to sharing groups (JSON)::

    {"tenants": {"alice": ["key:alice-a", "key:alice-b"], "bob": ["uid:1001"]},
     "groups":  {"team": ["alice", "carol"]},
     "node":    ["key:ops"]}

A peer no file names is a tenant of its own, except the server's own uid and
``tcp:insecure``, which are the *default tenant* ``""`` (a single-user node:
the key space of a server without tenants, unchanged). ``node`` lists other
peers of the default tenant (an operator's ``saria status`` over CURVE).

Key spaces. The default tenant's block keys are the engines' keys. Every other
tenant (or its group) has its own space: the index key is
``BLAKE2b(key, key=SHA256(space))``, computed by the server from the
credential, never by the client. So a tenant cannot name another's block: it
cannot read it, learn that it exists (``lookup``), touch it, evict it by name
or store over it -- finding a key of another space is a hash preimage.
Tenants in one group share one space on purpose (shared system prompts).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from saria.errors import ConfigError

DEFAULT = ""


class Tenants:
    def __init__(self, members: dict[str, str] | None = None,
                 groups: dict[str, str] | None = None) -> None:
        self.members = members or {}   # peer name -> tenant
        self.groups = groups or {}     # tenant -> its group
        self._spaces: dict[str, bytes] = {}

    @classmethod
    def from_file(cls, path: str | None) -> Tenants:
        if path is None:
            return cls()
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError("tenants", f"{path}: {e}") from None
        if not isinstance(raw, dict) or set(raw) - {"tenants", "groups", "node"}:
            raise ConfigError("tenants", f"{path}: expected {{\"tenants\": ..., \"groups\": "
                              "..., \"node\": ...}}")
        members: dict[str, str] = {}
        node = raw.get("node", [])
        if not isinstance(node, list) or not all(isinstance(p, str) for p in node):
            raise ConfigError("tenants", f"{path}: 'node' must be a list of peers")
        members.update((p, DEFAULT) for p in node)
        for tenant, peers in raw.get("tenants", {}).items():
            if not tenant or not isinstance(peers, list):
                raise ConfigError("tenants", f"{path}: tenant {tenant!r} needs a list of peers")
            for p in peers:
                if not isinstance(p, str) or p in members:
                    raise ConfigError("tenants", f"{path}: peer {p!r} is not a string or is "
                                      "named twice")
                members[p] = tenant
        groups: dict[str, str] = {}
        for group, tenants in raw.get("groups", {}).items():
            if not isinstance(tenants, list):
                raise ConfigError("tenants", f"{path}: group {group!r} needs a list of tenants")
            for t in tenants:
                if t in groups:
                    raise ConfigError("tenants", f"{path}: tenant {t!r} is in two groups")
                groups[t] = group
        return cls(members, groups)

    def tenant_of(self, peer: str) -> str:
        if peer in self.members:
            return self.members[peer]
        if peer in (f"uid:{os.getuid()}", "tcp:insecure", ""):
            return DEFAULT
        return peer

    def space(self, tenant: str) -> bytes | None:
        """The key of `tenant`'s space (None: the default tenant's, keys unchanged)."""
        if tenant == DEFAULT:
            return None
        if tenant not in self._spaces:
            name = f"group:{self.groups[tenant]}" if tenant in self.groups else f"tenant:{tenant}"
            self._spaces[tenant] = hashlib.sha256(b"saria-tenant-space\0" + name.encode()).digest()
        return self._spaces[tenant]


def map_keys(space: bytes | None, keys: np.ndarray) -> np.ndarray:
    """`keys` (n, 32) in `space` (the identity for the default tenant); ~0.4 µs
    a key (a keyed hasher copied per key: keying costs a BLAKE2b block)."""
    if space is None:
        return keys
    base = hashlib.blake2b(digest_size=32, key=space)
    buf = keys.tobytes()

    def one(i: int) -> bytes:
        h = base.copy()
        h.update(buf[i:i + 32])
        return h.digest()

    out = b"".join([one(i) for i in range(0, len(buf), 32)])
    return np.frombuffer(out, np.uint8).reshape(-1, 32).copy()
