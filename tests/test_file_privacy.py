"""Files that hold cached KV are this user's only: SSD folders 0700, their
files 0600, the shared DRAM pool created with O_EXCL and never another
user's. The attacks run as another uid (``setpriv`` to ``nobody``); they are
skipped where this process cannot change uid. On 84f5613 the read and the
planted pool succeed (SSD files were 0644 in 0755 folders, the pool was
opened with O_CREAT and no owner check): each test here fails there.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile

import pytest

from saria.tiers.dram import DramPool, DramPoolError, private_dir
from saria.tiers.ssd import SsdStore

BLOCK = 4096
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
_CAN_SWITCH = os.geteuid() == 0 and shutil.which("setpriv") is not None
as_other_user = pytest.mark.skipif(not _CAN_SWITCH, reason="needs root and setpriv to act as "
                                   "another user (nobody)")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture()
def shared_base():
    """A folder every user may traverse (pytest's own tmp folders are 0700,
    which would hide a loose file from other users by accident)."""
    d = tempfile.mkdtemp(prefix="saria-privacy-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _store(path, **kw) -> SsdStore:
    return SsdStore(str(path), 16 * BLOCK * 64, BLOCK, direct=False, **kw)


def test_a_new_store_is_private(shared_base):
    d = os.path.join(shared_base, "ssd")
    _store(d).close()
    assert _mode(d) == 0o700
    names = sorted(os.listdir(d))
    assert {"saria-ssd.data", "saria-ssd.owner", "saria-ssd.journal"} <= set(names)
    assert all(_mode(os.path.join(d, n)) == 0o600 for n in names), [(n, oct(_mode(os.path.join(d, n)))) for n in names]


@as_other_user
def test_another_user_cannot_read_the_ssd_data_file(shared_base):
    d = os.path.join(shared_base, "ssd")
    s = _store(d)
    try:
        r = subprocess.run([*NOBODY, "head", "-c", "64", os.path.join(d, "saria-ssd.data")],
                           capture_output=True, timeout=30)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, r
    finally:
        s.close()


def test_an_older_stores_loose_modes_are_tightened(shared_base):
    d = os.path.join(shared_base, "ssd")
    _store(d).close()
    os.chmod(d, 0o755)
    for n in os.listdir(d):
        os.chmod(os.path.join(d, n), 0o644)
    _store(d).close()
    assert _mode(d) == 0o700
    assert all(_mode(os.path.join(d, n)) == 0o600 for n in os.listdir(d))


@as_other_user
def test_a_store_file_or_folder_of_another_user_is_refused(shared_base):
    d = os.path.join(shared_base, "ssd")
    _store(d).close()
    data = os.path.join(d, "saria-ssd.data")
    os.chown(data, 65534, 65534)
    with pytest.raises(OSError, match="saria-ssd.data is owned by uid 65534, not this user"):
        _store(d)
    other = os.path.join(shared_base, "theirs")
    os.mkdir(other, 0o700)
    os.chown(other, 65534, 65534)
    with pytest.raises(OSError, match="theirs is owned by uid 65534"):
        _store(other)


def test_a_folder_every_user_may_write_to_is_refused(shared_base):
    d = os.path.join(shared_base, "scratch")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    with pytest.raises(OSError, match="a folder every user may write to .*folder of its own"):
        _store(d)
    assert _mode(d) == 0o1777  # never chmod-ed


@as_other_user
def test_a_pool_file_planted_by_another_user_is_refused(shared_base):
    """/dev/shm is shared (mode 1777): another user creates the pool's file
    first. Mapping it would hand that user every page of KV."""
    shm = os.path.join(shared_base, "shm")
    os.mkdir(shm)
    os.chmod(shm, 0o1777)
    path = os.path.join(shm, "saria-pool-engine0")
    subprocess.run([*NOBODY, "sh", "-c", f"umask 0; : > {path}"], check=True, timeout=30)
    with pytest.raises(DramPoolError, match="refusing to map it .owner uid 65534"):
        DramPool(4, BLOCK, pin=False, shared=path)
    own = os.path.join(private_dir(shm), "saria-pool-engine0")
    pool = DramPool(4, BLOCK, pin=False, shared=own)
    try:
        assert _mode(own) == 0o600 and _mode(os.path.dirname(own)) == 0o700
        other = DramPool(4, BLOCK, pin=False, shared=own)  # the engine's other side attaches
        other.array[1] = 7
        assert (pool.array[1] == 7).all()
        other.close()
    finally:
        pool.close()


@as_other_user
def test_a_private_folder_made_by_another_user_is_refused(shared_base):
    shm = os.path.join(shared_base, "shm")
    os.mkdir(shm)
    os.chmod(shm, 0o1777)
    subprocess.run([*NOBODY, "mkdir", "-m", "0777", os.path.join(shm, f"saria-{os.geteuid()}")],
                   check=True, timeout=30)
    with pytest.raises(DramPoolError, match="not a private folder of this user .owner uid 65534"):
        private_dir(shm)


def test_a_loose_pool_file_of_ours_is_refused(shared_base):
    path = os.path.join(private_dir(shared_base), "saria-pool-loose")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    os.fchmod(fd, 0o644)
    os.close(fd)
    with pytest.raises(DramPoolError, match="mode 0644"):
        DramPool(4, BLOCK, pin=False, shared=path)
