"""The server's upload spool is private on disk: 0700 directory, 0600 file created exclusively,
no symlinks followed, and removed on close."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from fedgat.crypto import SlotLayout, encrypt_rows
from fedgat.crypto.spool import CiphertextSpool, InsecureSpoolError


@pytest.fixture
def layout(server):
    return SlotLayout.for_dimension(8, server.slots)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _put_one(holder, spool, layout) -> None:
    row = np.ones((1, 8)) / np.sqrt(8)
    for chunk, blob in enumerate(encrypt_rows(holder, row, layout)):
        spool.put(0, chunk, blob)


def test_default_spool_is_private_and_removed(holder, server, layout):
    old = os.umask(0o022)
    try:
        spool = CiphertextSpool(server, layout)
    finally:
        os.umask(old)
    _put_one(holder, spool, layout)
    assert _mode(spool.path.parent) == 0o700
    assert _mode(spool.path) == 0o600
    folder, path = spool.path.parent, spool.path
    spool.close()
    assert not path.exists() and not folder.exists()


def test_given_missing_directory_is_created_private_and_removed(holder, server, layout, tmp_path):
    folder = tmp_path / "sub" / "spool"
    old = os.umask(0o000)
    try:
        spool = CiphertextSpool(server, layout, directory=folder)
    finally:
        os.umask(old)
    _put_one(holder, spool, layout)
    assert _mode(folder) == 0o700 and _mode(spool.path) == 0o600
    assert len(spool.get(0)) == layout.chunks
    spool.close()
    assert not folder.exists()
    spool.close()  # idempotent


def test_given_existing_private_directory_keeps_it_and_deletes_the_file(holder, server, layout, tmp_path):
    folder = tmp_path / "spool"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    (folder / "other.txt").write_text("someone else's")
    spool = CiphertextSpool(server, layout, directory=folder)
    _put_one(holder, spool, layout)
    path = spool.path
    assert path.parent == folder and path.exists()
    spool.close()
    assert not path.exists()
    assert folder.is_dir() and (folder / "other.txt").exists()  # not ours: left alone


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o707, 0o777, 0o701])
def test_group_or_world_accessible_directory_is_refused(server, layout, tmp_path, mode):
    folder = tmp_path / "spool"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(InsecureSpoolError, match="chmod 700"):
        CiphertextSpool(server, layout, directory=folder)
    assert list(folder.iterdir()) == []  # nothing created


def test_symlinked_directory_is_refused(server, layout, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o700)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(InsecureSpoolError, match="symlink"):
        CiphertextSpool(server, layout, directory=link)
    assert list(real.iterdir()) == []


def test_spool_file_is_created_exclusively(server, layout, tmp_path, monkeypatch):
    """A file or symlink planted at the spool's name is never opened (O_EXCL | O_NOFOLLOW)."""
    folder = tmp_path / "spool"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    monkeypatch.setattr("fedgat.crypto.spool.secrets.token_hex", lambda n: "planted")
    (folder / "uploads-planted.bin").symlink_to(target)
    with pytest.raises(FileExistsError):
        CiphertextSpool(server, layout, directory=folder)
    assert target.read_bytes() == b"keep"


def test_reader_does_not_follow_symlinks(holder, server, layout, tmp_path):
    spool = CiphertextSpool(server, layout)
    _put_one(holder, spool, layout)
    path, index = spool.snapshot()
    reader = CiphertextSpool.reader(server, layout, path, index)
    assert len(reader.get(0)) == layout.chunks
    reader.close()
    assert os.path.exists(path)  # a reader never deletes the writer's file
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    with pytest.raises(OSError):
        CiphertextSpool.reader(server, layout, str(link), index)
    spool.close()
    assert not os.path.exists(path)


def test_spool_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, fedgat.crypto.spool; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
