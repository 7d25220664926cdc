"""nestplan.outputs, the one writer: links refused, whole or nothing, no chmod of what exists."""

import os
import stat

import pytest

from nestplan import outputs
from nestplan.errors import ConfigError
from nestplan.export.common import Export, ExportFile


def test_a_link_at_the_target_is_refused_and_its_file_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("theirs")
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link") as info:
        outputs.write_text(link, "ours", "--report")
    assert "\n" not in str(info.value) and victim.read_text() == "theirs" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "victim.txt"]


def test_a_failure_while_writing_leaves_nothing(tmp_path):
    target = tmp_path / "out.csv"
    with pytest.raises(RuntimeError):
        with outputs.replaced(target, "--csv") as partial:
            partial.write_text("half")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_a_special_file_is_written_through():
    outputs.write_text(os.devnull, "x", "--out")


def _export(*files) -> Export:
    return Export("test", tuple(files), ())


def test_a_failure_mid_export_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "job"
    export = _export(ExportFile("launch.sh", "echo hi\n", True), ExportFile("config.yaml", "a: 1\n"))
    original = outputs._settle
    calls = []

    def failing(path, executable):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        original(path, executable)

    monkeypatch.setattr(outputs, "_settle", failing)
    with pytest.raises(OSError):
        export.write(out)
    assert list(tmp_path.iterdir()) == []


def test_export_into_a_folder_of_others_files_chmods_nothing_and_refuses_links(tmp_path):
    out = tmp_path / "shared"
    out.mkdir(mode=0o777)
    os.chmod(out, 0o777)
    theirs = out / "notes.txt"
    theirs.write_text("theirs")
    os.chmod(theirs, 0o600)
    export = _export(ExportFile("launch.sh", "echo hi\n", True), ExportFile("config.yaml", "a: 1\n"))
    paths = export.write(out)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o777 and stat.S_IMODE(os.stat(theirs).st_mode) == 0o600
    assert os.access(paths[0], os.X_OK) and paths[1].read_text() == "a: 1\n"
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    os.chmod(victim, 0o600)
    paths[1].unlink()
    paths[1].symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        export.write(out)
    assert victim.read_text() == "theirs" and stat.S_IMODE(os.stat(victim).st_mode) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "launch.sh", "notes.txt"]
