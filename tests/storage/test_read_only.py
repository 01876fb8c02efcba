"""Commands that only read (``show``, ``export``, ``report``, ``report --compare``) leave every
byte of the database and write nothing beside it; a refused ``import`` creates nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from dbutil import fill, stormdrop_cli

from stormdrop.storage.database import Database


def _state(d: Path) -> dict[str, str]:
    """Every file of directory ``d``: name -> hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture()
def db_dir(tmp_path: Path, mod, traces) -> Path:
    d = tmp_path / "dbs"
    d.mkdir()
    with Database(d / "t.db") as db:
        fill(db, mod, traces)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_reading_commands_leave_the_database_and_its_directory_as_they_were(tmp_path: Path, db_dir: Path,
                                                                           journal: str) -> None:
    """Also a database in SQLite's rollback-journal mode (another tool's copy), which a
    read-write open would switch to WAL."""
    if journal == "delete":
        with sqlite3.connect(db_dir / "t.db") as con:
            con.execute("PRAGMA journal_mode=DELETE")
        con.close()
    before = _state(db_dir)
    assert list(before) == ["t.db"]  # closed: no -wal or -shm beside it
    path = str(db_dir / "t.db")
    for args in (["show", "--db", path], ["export", "--db", path, "--out", str(tmp_path / "ms")],
                 ["report", "--db", path, "--out", str(tmp_path / "r")],
                 ["report", "--db", path, "--out", str(tmp_path / "r2"), "--compare", path]):
        r = stormdrop_cli(*args)
        assert r.returncode == 0, (args, r.stderr[-400:])
        assert _state(db_dir) == before, args
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["index.html"]  # written whole, renamed in


def test_reading_commands_see_a_live_writers_commits_and_leave_its_files(tmp_path: Path, db_dir: Path, mod,
                                                                          traces) -> None:
    """With a tuner's connection open (its -wal file holding commits not yet in the main file),
    ``show`` reads them, and leaves the database and its -wal as they were (the -shm is the
    writer's shared-memory index, in which every reader takes its read lock)."""
    path = db_dir / "t.db"
    with Database(path) as db:
        wid = db.workloads()[0].workload_id
        n = len(db.records(wid))
        con = sqlite3.connect(path)
        con.execute("PRAGMA wal_autocheckpoint=0")
        con.execute("UPDATE workloads SET name='renamed_live'")
        con.commit()
        assert (db_dir / "t.db-wal").exists()
        before = _state(db_dir)
        r = stormdrop_cli("show", "--db", str(path))
        assert r.returncode == 0 and "renamed_live" in r.stdout, r.stderr[-400:]
        after = _state(db_dir)
        assert set(after) == set(before) and all(after[f] == before[f] for f in ("t.db", "t.db-wal"))
        con.close()
        assert len(db.records(wid)) == n


@pytest.mark.slow
def test_an_old_or_empty_database_is_refused_by_a_reading_command_and_left_as_it_was(tmp_path: Path,
                                                                                    db_dir: Path) -> None:
    path = db_dir / "t.db"
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    con.close()
    empty = db_dir / "empty.db"
    empty.write_bytes(b"")
    before = _state(db_dir)
    for target in (path, empty):
        r = stormdrop_cli("show", "--db", str(target))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-400:]
    assert _state(db_dir) == before


def test_a_refused_import_creates_no_database_or_directory(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dirs" / "x.db"
    r = stormdrop_cli("import", str(tmp_path / "missing"), "--db", str(target))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()


def _read_only_mount_works() -> bool:
    """Whether this process may make a mount namespace with a read-only bind mount (root with
    CAP_SYS_ADMIN, as in most containers run as root; not an unprivileged user)."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind -o ro /tmp /tmp"], capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _read_only_mount_works(), reason="needs a mount namespace (root)")
def test_reading_commands_work_on_a_read_only_mount(tmp_path: Path, db_dir: Path) -> None:
    """The database's directory mounted read-only (EROFS, which root cannot write past either):
    ``show``, ``export``, ``report`` and ``report --compare`` answer as on a writable disk."""
    import shlex
    import subprocess
    import sys

    ro = tmp_path / "ro"
    ro.mkdir()
    path = ro / "t.db"
    calls = [["show", "--db", str(path)], ["export", "--db", str(path), "--out", str(tmp_path / "ms")],
             ["report", "--db", str(path), "--out", str(tmp_path / "r")],
             ["report", "--db", str(path), "--out", str(tmp_path / "r2"), "--compare", str(path)]]
    mount = f"mount --bind -o ro {shlex.quote(str(db_dir))} {shlex.quote(str(ro))}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"{mount} && touch {shlex.quote(str(ro))}/x"], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "Read-only file system" in r.stderr  # the mount refuses writes, even root's
    expected = stormdrop_cli("show", "--db", str(db_dir / "t.db")).stdout.replace(str(db_dir / "t.db"), str(path))
    for args in calls:
        cli = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "stormdrop", *args])
        r = subprocess.run(["unshare", "-m", "sh", "-c", f"{mount} && {cli}"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (args, r.stderr[-400:])
        if args[0] == "show":
            assert r.stdout == expected
    assert (tmp_path / "r" / "index.html").exists() and any((tmp_path / "ms").iterdir())
