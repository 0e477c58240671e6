"""evotrainer/atomic.py: whole-file writes through a temp file, fsynced, replaced."""

import json
import os
import stat

import pytest

from evotrainer import atomic


def test_write_bytes_text_and_json_give_exactly_the_content(tmp_path):
  atomic.write_bytes(tmp_path / "a.bin", b"\x00\xffab")
  atomic.write_text(tmp_path / "b.txt", "é\n")
  atomic.write_json(tmp_path / "c.json", {"b": 1, "a": [2]}, indent=1, sort_keys=True)
  assert (tmp_path / "a.bin").read_bytes() == b"\x00\xffab"
  assert (tmp_path / "b.txt").read_bytes() == b"\xc3\xa9\n"
  assert (tmp_path / "c.json").read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.txt", "c.json"]


def test_replacing_leaves_no_temp_file_and_an_ordinary_mode(tmp_path):
  path = tmp_path / "f.json"
  path.write_text("old")
  atomic.write_json(str(path), {"x": 1})  # a str path too
  assert json.loads(path.read_text()) == {"x": 1}
  assert os.listdir(tmp_path) == ["f.json"]
  umask = os.umask(0)
  os.umask(umask)
  assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_an_error_mid_write_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
  path = tmp_path / "f.txt"
  path.write_text("old")

  def fail(fd):
    raise OSError("disk full")

  monkeypatch.setattr(os, "fsync", fail)
  with pytest.raises(OSError, match="disk full"):
    atomic.write_text(path, "new")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["f.txt"]


def test_unserializable_json_touches_nothing(tmp_path):
  path = tmp_path / "f.json"
  path.write_text("old")
  with pytest.raises(TypeError):
    atomic.write_json(path, {"x": object()})
  assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.json"]


def test_fsyncs_the_file_then_its_directory(tmp_path, monkeypatch):
  synced = []  # the inode of every fsynced descriptor, in order
  real_fsync = os.fsync

  def fsync(fd):
    synced.append(os.fstat(fd).st_ino)
    real_fsync(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  atomic.write_bytes(tmp_path / "f", b"x")
  assert synced == [(tmp_path / "f").stat().st_ino, tmp_path.stat().st_ino]
  synced.clear()
  atomic.fsync_dir(tmp_path)
  assert synced == [tmp_path.stat().st_ino]


def test_missing_directory_is_an_error_naming_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope"):
    atomic.write_text(tmp_path / "nope" / "f.txt", "x")
