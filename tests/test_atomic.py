"""The one atomic writer (runtime/atomic.py) under attack, crash and reuse; real files, real processes.

The attack is the reported one: in a shared, world-writable checkpoint folder another user plants
symbolic links at every name the writer could predict, pointing at the trainer's own files.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from dpmigrate.runtime.atomic import atomic_write

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a file owned by another user needs root")


def write_bytes(data: bytes):
    return lambda f: f.write(data)


@pytest.fixture
def shared(tmp_path):
    """A world-writable folder (sticky, like /tmp) and a file of the trainer's outside it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    victim = tmp_path / "home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_bytes(b"export PATH=$HOME/bin:$PATH\n")
    victim.chmod(0o644)
    return folder, victim


def test_links_planted_at_predictable_names_are_never_written_through(shared):
    folder, victim = shared
    target = folder / "ckpt.pt"
    planted = [folder / f".ckpt.pt.{os.getpid()}.dpmigrate-tmp"]  # the name the old writer used
    planted += [folder / f".ckpt.pt.{os.getpid()}@{os.uname().nodename}.dpmigrate-tmp"]
    for link in planted:
        link.symlink_to(victim)
    atomic_write(target, write_bytes(b"checkpoint"))
    assert victim.read_bytes() == b"export PATH=$HOME/bin:$PATH\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert target.read_bytes() == b"checkpoint" and not target.is_symlink()
    assert all(link.is_symlink() and os.readlink(link) == str(victim) for link in planted)


def test_a_link_planted_at_the_target_is_replaced_not_followed(shared):
    folder, victim = shared
    target = folder / "ckpt.pt"
    target.symlink_to(victim)
    atomic_write(target, write_bytes(b"checkpoint"))
    assert victim.read_bytes() == b"export PATH=$HOME/bin:$PATH\n"
    assert not target.is_symlink() and target.read_bytes() == b"checkpoint"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~current_umask()


def test_the_temporary_is_private_randomly_named_and_tagged_with_its_owner(tmp_path):
    seen = []

    def write(f):
        (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".dpmigrate-tmp")]
        seen.append((name, stat.S_IMODE(os.fstat(f.fileno()).st_mode)))
        f.write(b"x")

    atomic_write(tmp_path / "ckpt.pt", write)
    atomic_write(tmp_path / "ckpt.pt", write)
    (first, first_mode), (second, second_mode) = seen
    host = re.sub(r"[^A-Za-z0-9-]", "-", os.uname().nodename)
    pattern = rf"\.ckpt\.pt\.{os.getpid()}@{re.escape(host)}\.[a-z0-9_]{{8}}\.dpmigrate-tmp"
    assert re.fullmatch(pattern, first) and re.fullmatch(pattern, second)
    assert first != second
    assert first_mode == second_mode == 0o600  # nobody else can read a checkpoint half written
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_the_users_own_file_keeps_its_mode_and_a_new_file_gets_the_umask_mode(tmp_path):
    own = tmp_path / "own.pt"
    own.write_bytes(b"old")
    own.chmod(0o640)
    atomic_write(own, write_bytes(b"new"))
    assert (own.read_bytes(), stat.S_IMODE(own.stat().st_mode)) == (b"new", 0o640)
    previous = os.umask(0o027)
    try:
        atomic_write(tmp_path / "new.pt", write_bytes(b"new"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.pt").stat().st_mode) == 0o640


@needs_root
def test_root_saving_over_another_users_file_neither_keeps_its_mode_nor_gives_it_away(tmp_path):
    """The runtime's save: a world-writable file another user planted must not make our checkpoint theirs."""
    planted = tmp_path / "ckpt.pt"
    planted.write_bytes(b"planted")
    planted.chmod(0o666)
    os.chown(planted, NOBODY, NOBODY)
    atomic_write(planted, write_bytes(b"checkpoint"))
    st = planted.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o666 & ~current_umask())


@needs_root
def test_keep_owner_gives_a_users_file_back_with_its_mode(tmp_path):
    """The converter run by root on a user's script: the script stays the user's, mode and all."""
    script = tmp_path / "train.py"
    script.write_bytes(b"old")
    script.chmod(0o750)
    os.chown(script, NOBODY, NOBODY)
    atomic_write(script, write_bytes(b"new"), keep_owner=True)
    st = script.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o750)


def test_follow_symlinks_rewrites_the_links_destination_and_keeps_the_link(tmp_path):
    real = tmp_path / "src" / "train.py"
    real.parent.mkdir()
    real.write_bytes(b"old")
    link = tmp_path / "train.py"
    link.symlink_to(real)
    atomic_write(link, write_bytes(b"new"), follow_symlinks=True)
    assert link.is_symlink() and real.read_bytes() == b"new"


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk full, say")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, fail)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_only_our_dead_processes_regular_temporaries_are_cleaned(tmp_path):
    """A real killed writer's temporary is removed by the next write; look-alikes that are not ours stay."""
    target = tmp_path / "ckpt.pt"
    crash = textwrap.dedent(f"""
        import os, signal
        from dpmigrate.runtime.atomic import atomic_write
        def die(f):
            f.write(b"half")
            os.kill(os.getpid(), signal.SIGKILL)
        atomic_write({str(target)!r}, die)
    """)
    proc = subprocess.run([sys.executable, "-c", crash], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (dead_tmp,) = [n for n in os.listdir(tmp_path) if n.endswith(".dpmigrate-tmp")]
    dead_pid = re.match(r"\.ckpt\.pt\.(\d+)@", dead_tmp).group(1)
    keep = {
        "link": dead_tmp.replace(".dpmigrate-tmp", "l.dpmigrate-tmp"),  # same dead owner, but a symlink
        "alive": f".ckpt.pt.{os.getpid()}@{dead_tmp.split('@')[1]}",  # this process's: a writer in progress
        "elsewhere": f".ckpt.pt.{dead_pid}@another-host.abcd1234.dpmigrate-tmp",  # pid of another machine
        "other name": f".ckpt.pt.old.{dead_tmp[len('.ckpt.pt.'):]}",  # a temporary of ckpt.pt.old
    }
    os.symlink(tmp_path / "outside", tmp_path / keep["link"])
    (tmp_path / "outside").write_bytes(b"not ours to delete")
    for what in ("alive", "elsewhere", "other name"):
        (tmp_path / keep[what]).write_bytes(b"in use")
    if os.geteuid() == 0:
        keep["another user's"] = dead_tmp.replace(".dpmigrate-tmp", "u.dpmigrate-tmp")
        (tmp_path / keep["another user's"]).write_bytes(b"theirs")
        os.chown(tmp_path / keep["another user's"], NOBODY, NOBODY)
    atomic_write(target, write_bytes(b"new"))
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.pt", "outside", *keep.values()])
    assert (tmp_path / "outside").read_bytes() == b"not ours to delete"


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
