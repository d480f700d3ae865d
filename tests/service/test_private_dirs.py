"""``mkdir -p -m 0700``, one for the daemon and the client (capsule_client.kit.paths)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from capsule_client.kit.paths import make_private_dirs
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.trace import SessionStart, append_event
from capsuled.rpc.sockets import prepare_socket_directory
from capsuled.service.home_setup import ensure_home


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """A umask that would give new directories 0755 (and new files 0644)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_level_made_is_0700_and_existing_ones_are_left_alone(
    tmp_path: Path, loose_umask: None
) -> None:
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    target = existing / "a" / "b" / "c"

    make_private_dirs(target)

    assert [mode(level) for level in (existing / "a", existing / "a" / "b", target)] == [0o700] * 3
    assert mode(existing) == 0o755
    make_private_dirs(target)  # all there: nothing to do, nothing raised
    assert mode(target) == 0o700


def test_a_umask_that_takes_the_owner_bits_is_undone(tmp_path: Path) -> None:
    old = os.umask(0o377)  # mkdir(0o700) alone would give 0o400: not even searchable
    try:
        make_private_dirs(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == 0o700


def test_a_symbolic_link_to_a_directory_is_followed(tmp_path: Path, loose_umask: None) -> None:
    # docs/design.md §2, §6: the home and the records root may each be configured as a link.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)

    make_private_dirs(tmp_path / "link" / "sessions")

    assert mode(real / "sessions") == 0o700
    assert (tmp_path / "link").is_symlink()


def test_a_dangling_symbolic_link_is_refused_and_nothing_is_made_through_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "link").symlink_to(target)

    with pytest.raises(OSError) as refused:
        make_private_dirs(tmp_path / "link" / "sessions")

    assert refused.value.errno == errno.ELOOP
    assert refused.value.filename == str(tmp_path / "link")
    assert not target.exists()  # the link's target was not created
    with pytest.raises(OSError) as refused_last:
        make_private_dirs(tmp_path / "link")
    assert refused_last.value.errno == errno.ELOOP


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError) as refused:
        make_private_dirs(tmp_path / "file" / "below")
    assert refused.value.errno == errno.ENOTDIR
    assert refused.value.filename == str(tmp_path / "file")


def test_the_daemon_and_the_client_make_their_directories_through_it(
    short_dir: Path, loose_umask: None
) -> None:
    home = short_dir / "state" / "capsule"
    ensure_home(home)
    assert mode(short_dir / "state") == mode(home) == 0o700

    socket_path = short_dir / "run" / "user" / "s.sock"
    prepare_socket_directory(socket_path)
    assert mode(short_dir / "run") == mode(socket_path.parent) == 0o700

    receipt = write_exec_receipt(home, "exec_1", os.getpid())
    made = [level for level in receipt.parents if level.is_relative_to(home) and level != home]
    assert made and all(mode(level) == 0o700 for level in made)

    records = short_dir / "records" / "sessions"
    append_event(records, SessionStart(event_id="evt_1", session_id="ses_a", timestamp=1))
    assert mode(short_dir / "records") == mode(records) == mode(records / "ses_a") == 0o700
