"""Where throwaway servers keep their data: tmpfs when it has room (dev.process.ram_backed_dir), and
the pytest plugin's shardctl_data_dir setting."""

from __future__ import annotations

import os

import pytest

from shardctl.dev import process
from shardctl.dev.process import ram_backed_dir
from shardctl.testing import RAM_DIR_NEED_GB, data_dir

HAS_SHM = os.path.isdir(process.RAM_DIR) and os.access(process.RAM_DIR, os.W_OK)


class Config:
    """What data_dir reads of a pytest config: the option, then the ini key."""

    def __init__(self, option: str | None, ini: str):
        self.option, self.ini = option, ini

    def getoption(self, name: str) -> str | None:
        assert name == "--shardctl-data-dir"
        return self.option

    def getini(self, name: str) -> str:
        assert name == "shardctl_data_dir"
        return self.ini


@pytest.mark.skipif(not HAS_SHM, reason="no writable /dev/shm on this machine")
def test_dev_shm_when_it_has_room_and_none_when_it_has_not():
    assert ram_backed_dir(0) == process.RAM_DIR
    assert ram_backed_dir(1 << 20) is None  # a mebi-gibibyte: more than any machine has


def test_no_ram_backed_dir_is_no_error(monkeypatch):
    monkeypatch.setattr(process, "RAM_DIR", "/nonexistent/shm")
    assert ram_backed_dir(0) is None


def test_an_explicit_directory_wins_the_option_over_the_ini_key(tmp_path):
    assert data_dir(Config(None, str(tmp_path))) == str(tmp_path)
    assert data_dir(Config(str(tmp_path / "cli"), str(tmp_path))) == str(tmp_path / "cli")


def test_auto_is_tmpfs_when_it_has_room():
    assert data_dir(Config(None, "auto")) == ram_backed_dir(RAM_DIR_NEED_GB)
    assert data_dir(Config("auto", "")) == ram_backed_dir(RAM_DIR_NEED_GB)
