"""The fleet key: the secret every node of a fleet shares to sign and name rows.

The Mooncake master authenticates nobody: any client that reaches it can
put, get and remove any object. saria therefore trusts no object it did not
sign: each row carries a keyed MAC (``rows.SignedRowCodec``) and lives under
a name derived with the key, so a client without the key can neither forge a
row a node accepts nor name (probe, overwrite or remove by name) a node's rows.

A keyring is one or more keys, each with an id (1 .. 2**32 - 1)::

    # saria fleet keys: one "ID:HEX" per line (HEX: 32 random bytes)
    2:6f1c...e9
    1:03aa...41

A node writes with one key (``write_id``: the configured ``fleet_key_id``,
else the highest id) and accepts rows signed with any key of its ring, so a
rotation is: add the new key to every node's ring, then move the write id,
then drop the old key. The ring comes from a file (``fleet_key_file``: owned
by this user, mode 0600 or stricter -- anything looser is refused) or from an
environment variable (``fleet_key_env``: its value in the same format, lines
or ``,`` between keys). ``generate()`` makes a key line.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass

from saria.errors import ConfigError

__all__ = ["FleetKeys", "KEY_BYTES", "generate"]

KEY_BYTES = 32
MAX_ID = (1 << 32) - 1


def generate(key_id: int = 1) -> str:
    """A new key line ``ID:HEX`` (32 bytes from the OS's CSPRNG)."""
    return f"{int(key_id)}:{secrets.token_hex(KEY_BYTES)}"


@dataclass(frozen=True, slots=True, eq=False)
class FleetKeys:
    """A keyring (see the module docstring); ``keys`` maps id -> 32 bytes."""

    keys: dict[int, bytes]
    write_id: int
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("remote.fleet_key_file", f"{self.source}: holds no key")
        if self.write_id not in self.keys:
            raise ConfigError("remote.fleet_key_id", f"{self.write_id} is not in {self.source} "
                              f"(ids: {', '.join(map(str, sorted(self.keys)))})")

    def __repr__(self) -> str:  # never the key bytes
        return f"FleetKeys(ids={sorted(self.keys)}, write_id={self.write_id}, source={self.source!r})"

    @property
    def write_key(self) -> bytes:
        return self.keys[self.write_id]

    @classmethod
    def parse(cls, text: str, *, source: str, write_id: int | None = None,
              key: str = "remote.fleet_key_file") -> "FleetKeys":
        """A ring from ``ID:HEX`` entries (lines or commas; ``#`` comments)."""
        keys: dict[int, bytes] = {}
        entries = [e.strip() for line in text.splitlines()
                   for e in line.split("#", 1)[0].split(",")]
        for n, entry in enumerate(e for e in entries if e):
            kid, sep, hexkey = entry.partition(":")
            where = f"{source}: entry {n + 1}"
            try:
                kid_i = int(kid)
                raw = bytes.fromhex(hexkey.strip())
            except ValueError:
                raise ConfigError(key, f"{where}: expected ID:HEX (saria fleet-key makes one)") from None
            if not sep or not 0 < kid_i <= MAX_ID or len(raw) != KEY_BYTES:
                raise ConfigError(key, f"{where}: expected ID (1..{MAX_ID}):{KEY_BYTES * 2} hex digits")
            if kid_i in keys:
                raise ConfigError(key, f"{where}: id {kid_i} given twice")
            keys[kid_i] = raw
        if not keys:
            raise ConfigError(key, f"{source}: holds no key (saria fleet-key makes one)")
        return cls(keys, max(keys) if write_id is None else int(write_id), source)

    @classmethod
    def from_file(cls, path: str, *, write_id: int | None = None) -> "FleetKeys":
        """The ring in ``path``; refused unless a regular file of this user
        that no group or other user may read or write."""
        where = "remote.fleet_key_file"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise ConfigError(where, f"{path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(where, f"{path}: not a regular file")
            if st.st_uid != os.geteuid():
                raise ConfigError(where, f"{path}: owned by uid {st.st_uid}, not this user "
                                  f"({os.geteuid()})")
            if st.st_mode & 0o077:
                raise ConfigError(where, f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other "
                                  f"users at the key; chmod 600 {path}")
            text = os.read(fd, 1 << 16).decode("ascii", "replace")
        finally:
            os.close(fd)
        return cls.parse(text, source=path, write_id=write_id)

    @classmethod
    def from_env(cls, name: str, *, write_id: int | None = None) -> "FleetKeys":
        text = os.environ.get(name)
        if not text:
            raise ConfigError("remote.fleet_key_env", f"${name} is not set or empty")
        return cls.parse(text, source=f"${name}", write_id=write_id, key="remote.fleet_key_env")
