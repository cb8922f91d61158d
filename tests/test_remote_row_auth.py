"""Signed cluster rows against an attacker on a real ``mooncake_master``.

The attacker is another process, a raw Mooncake client with no saria code
(``remote_attacker_child.py``) that knows the row formats but not the fleet's
key. On 84f5613 (unsigned v1 rows under public names) each of these attacks
succeeds: the forged rows are hits, the honest put is skipped, the victim's
rows are removed by name. Each test here fails there (checked by running it
against that commit's ``saria/tiers/remote``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from saria.tiers.remote import MooncakeMaster, RemoteTier, client_env, mooncake_available

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

HERE = Path(__file__).resolve().parent
BLOCK = 64 << 10
NS = "victim-ns"
sys.path.insert(0, str(HERE))
from remote_node_child import blocks  # noqa: E402


@pytest.fixture(scope="module")
def master():
    client_env()
    with MooncakeMaster() as m:
        yield m


@pytest.fixture()
def victim(master):
    t = RemoteTier(master.settings(segment_bytes=64 << 20, staging_rows=16, deadline_s=2.0,
                                   exist_cache_s=0.0), NS, BLOCK)
    yield t
    t.close()


def attack(master, mode: str, keys: np.ndarray, names: list[str] | None = None) -> str:
    args = [sys.executable, str(HERE / "remote_attacker_child.py"), master.url,
            master.metadata_server, NS, str(BLOCK), mode, ",".join(k.tobytes().hex() for k in keys)]
    if names:
        args.append(",".join(names))
    out = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("done"), out
    return out


def test_forged_rows_for_a_future_prompt_are_misses_and_the_honest_put_lands(master, victim):
    """The attacker puts rows (v1 with valid crc32c, v2 signed with its own
    key) for blocks the victim will compute: the victim sees none of them,
    its honest put is stored (not skipped) and later loads are byte-exact."""
    keys, data = blocks(4, BLOCK, 11)
    attack(master, "forge", keys)
    assert not victim.exists(keys).any()
    out = np.zeros_like(data)
    assert not victim.get(keys, out).ok.any() and not out.any()
    put = victim.put(keys, data)
    assert put.stored.all() and not put.skipped.any()
    assert victim.get(keys, out).ok.all() and np.array_equal(out, data)


def test_a_planted_row_under_a_learned_name_fails_is_removed_and_replaced(master, victim):
    """Names are secret, but say the attacker learned them (enumeration) and
    swapped the victim's rows for forged ones: each is a miss, counted and
    removed; planted again, the victim's next put replaces it rather than
    skipping it; then loads are byte-exact."""
    keys, data = blocks(4, BLOCK, 12)
    assert victim.put(keys, data).stored.all()
    names = [victim.codec.key(k.tobytes()) for k in keys]
    attack(master, "plant", keys, names)
    out = np.zeros_like(data)
    assert not victim.get(keys, out).ok.any() and not out.any()
    c = victim.snapshot()["counters"]
    assert c["verify_failures"] == 4 and c.get("verify_removed", 4) == 4
    attack(master, "plant", keys, names)  # planted again after the removal
    assert not victim.exists(keys).any()  # distrusted until our own put lands
    put = victim.put(keys, data)
    assert put.stored.all() and not put.skipped.any()
    assert victim.get(keys, out).ok.all() and np.array_equal(out, data)
    assert victim.exists(keys).all()


def test_the_attacker_cannot_remove_the_victims_rows_by_name(master, victim):
    """Every name the attacker can derive for the victim's blocks (v1's
    public one, v2's under its own key) names nothing of the victim's."""
    keys, data = blocks(4, BLOCK, 13)
    assert victim.put(keys, data).stored.all()
    attack(master, "remove", keys)
    out = np.zeros_like(data)
    assert victim.get(keys, out).ok.all() and np.array_equal(out, data)


def test_a_rotation_finds_rows_the_old_key_wrote(master):
    """Node A writes with key 1; node B's ring holds 1 and 2 and writes with
    2: B finds and loads A's rows (their old names, in the same lookup call),
    and A's rows are misses for a node whose ring holds only key 2."""
    from saria.tiers.remote import FleetKeys
    from saria.tiers.remote.fleetkey import generate

    k1, k2 = generate(1), generate(2)
    ring = lambda text: FleetKeys.parse(text, source="test")  # noqa: E731
    tiers = [RemoteTier(master.settings(segment_bytes=s, staging_rows=16, deadline_s=2.0,
                                        exist_cache_s=0.0, fleet_keys=ring(text)), NS, BLOCK)
             for s, text in ((64 << 20, k1), (0, f"{k1}\n{k2}"), (0, k2))]
    a, b, c = tiers
    try:
        keys, data = blocks(3, BLOCK, 14)
        assert a.put(keys, data).stored.all()
        assert b.exists(keys).all() and not c.exists(keys).any()
        out = np.zeros_like(data)
        assert b.get(keys, out).ok.all() and np.array_equal(out, data)
        assert not c.get(keys, np.zeros_like(data)).ok.any()
        more, more_data = blocks(2, BLOCK, 15)
        assert b.put(more, more_data).stored.all()  # written with key 2: c reads it, a does not
        assert c.get(more, out[:2]).ok.all() and np.array_equal(out[:2], more_data)
        assert not a.exists(more).any()
    finally:
        for t in tiers:
            t.close()
