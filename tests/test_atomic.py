"""Atomic writes publish files and folders whole, with the permissions a plain write would give."""
import os

import numpy as np
import pytest

from bertforge.atomic import append_array, flush_folder, published_folder, write_array, write_text


def test_a_new_file_gets_the_umasks_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    umask = os.umask(0o022)
    try:
        fresh = write_text(tmp_path / "report.md", "new")
        assert fresh.stat().st_mode & 0o777 == 0o644  # mkstemp alone leaves 0600: owner-only reports and cards
        kept = tmp_path / "private.json"
        kept.write_text("old")
        kept.chmod(0o640)
        write_text(kept, "new")
        assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_text() == "new"
    finally:
        os.umask(umask)


def test_a_published_staging_folder_gets_the_umasks_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        target = tmp_path / "model"
        with published_folder(target, existing="refuse") as staging:
            (staging / "config.json").write_text("{}")
        assert target.stat().st_mode & 0o777 == 0o755  # mkdtemp alone leaves 0700
    finally:
        os.umask(umask)


# ---- published_folder: one way to publish a folder, with the caller's rule for an existing one

def snapshot(folder):
    """Every file under `folder` with its bytes, to compare a folder before and after."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def old_model(tmp_path):
    folder = tmp_path / "model"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "config.json").write_text("old config")
    (folder / "1_Pooling" / "config.json").write_text("old pooling")
    (folder / "README.md").write_text("the user's card")
    return folder


def write_new(staging):
    (staging / "config.json").write_text("new config")
    (staging / "1_Pooling").mkdir()
    (staging / "1_Pooling" / "config.json").write_text("new pooling")


def test_a_new_folder_appears_whole(tmp_path):
    with published_folder(tmp_path / "deep" / "model", existing="merge") as staging:
        write_new(staging)
        assert not (tmp_path / "deep" / "model").exists()  # nothing under the name until the body is done
    assert snapshot(tmp_path / "deep" / "model") == {"config.json": b"new config",
                                                    "1_Pooling/config.json": b"new pooling"}
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["model"]  # no temp folder left


def test_replace_swaps_the_whole_folder_and_keeps_its_mode(tmp_path):
    folder = old_model(tmp_path)
    folder.chmod(0o750)
    with published_folder(folder, existing="replace") as staging:
        write_new(staging)
    assert snapshot(folder) == {"config.json": b"new config", "1_Pooling/config.json": b"new pooling"}
    assert folder.stat().st_mode & 0o777 == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the old folder, renamed aside, is gone too


def test_merge_replaces_the_files_written_and_keeps_the_users(tmp_path):
    folder = old_model(tmp_path)
    (folder / "config.json").chmod(0o640)
    with published_folder(folder, existing="merge") as staging:
        write_new(staging)
    assert snapshot(folder) == {"README.md": b"the user's card", "config.json": b"new config",
                                "1_Pooling/config.json": b"new pooling"}
    assert (folder / "config.json").stat().st_mode & 0o777 == 0o640  # a replaced file keeps its mode
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_refuse_publishes_over_an_empty_folder_only(tmp_path):
    (tmp_path / "empty").mkdir()
    with published_folder(tmp_path / "empty", existing="refuse") as staging:
        write_new(staging)
    assert (tmp_path / "empty" / "config.json").read_text() == "new config"
    folder = old_model(tmp_path)
    before = snapshot(folder)
    with pytest.raises(OSError):
        with published_folder(folder, existing="refuse") as staging:
            write_new(staging)
    assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "model"]


@pytest.mark.parametrize("existing", ["replace", "merge", "refuse"])
def test_a_failure_mid_write_leaves_the_old_folder_byte_identical(tmp_path, existing):
    folder = old_model(tmp_path)
    before = snapshot(folder)
    with pytest.raises(RuntimeError, match="disk full"):
        with published_folder(folder, existing=existing) as staging:
            (staging / "config.json").write_text("half")
            raise RuntimeError("disk full")
    assert snapshot(folder) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temp folder behind


@pytest.mark.parametrize("destination", ["notes.txt", "notes.txt/model"])
def test_a_file_in_the_way_is_one_clear_error_before_any_work(tmp_path, destination):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NotADirectoryError, match="notes.txt is a file, not a folder"):
        with published_folder(tmp_path / destination, existing="replace"):
            pytest.fail("the body ran")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_destination_is_one_clear_error_before_any_work(tmp_path):
    folder = old_model(tmp_path)
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match="model is not writable"):
            with published_folder(folder, existing="merge"):
                pytest.fail("the body ran")
    finally:
        folder.chmod(0o755)


def test_an_unwritable_parent_is_one_clear_error_before_any_work(tmp_path, monkeypatch):
    # Root writes anywhere, so the refusal os.access would give a user is played here.
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != os.fspath(tmp_path))
    with pytest.raises(PermissionError, match=f"{tmp_path} is not writable"):
        with published_folder(tmp_path / "model", existing="merge"):
            pytest.fail("the body ran")
    assert list(tmp_path.iterdir()) == []


def test_every_file_is_flushed_before_it_is_published(tmp_path, monkeypatch):
    import bertforge.atomic as atomic

    flushed = []
    monkeypatch.setattr(atomic, "flush_to_disk", lambda path: flushed.append(path.name))  # files
    monkeypatch.setattr(atomic, "flush_folder", lambda path: flushed.append(path.name))  # folders
    with published_folder(tmp_path / "model", existing="merge") as staging:
        write_new(staging)
    assert {"config.json", "1_Pooling"} <= set(flushed) and flushed.count("config.json") == 2


@pytest.mark.parametrize("existing, before", [("refuse", "none"), ("refuse", "empty"), ("replace", "model"),
                                              ("merge", "model")])
def test_the_folders_a_rename_changed_are_flushed_after_it(tmp_path, monkeypatch, existing, before):
    """A rename is an entry of a folder: until that folder is fsynced, a power cut can undo the publishing."""
    folder = old_model(tmp_path) if before == "model" else tmp_path / "model"
    if before == "empty":
        folder.mkdir()
    flushed_after, real_fsync = set(), os.fsync
    new = {"config.json": b"new config", "1_Pooling/config.json": b"new pooling"}

    def fsync(descriptor):
        if new.items() <= snapshot(folder).items():  # every file is in place: the renames are done
            flushed_after.add(os.fstat(descriptor).st_ino)
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    with published_folder(folder, existing=existing) as staging:
        write_new(staging)
    assert tmp_path.stat().st_ino in flushed_after  # the folder holding `model`: new, swapped in, or renamed over
    if existing == "merge":  # each file was renamed into a folder of its own
        assert {folder.stat().st_ino, (folder / "1_Pooling").stat().st_ino} <= flushed_after


def test_a_replaced_file_s_folder_is_flushed_after_the_rename(tmp_path, monkeypatch):
    target = tmp_path / "notes.txt"
    target.write_text("old", encoding="utf-8")
    flushed_after, real_fsync = set(), os.fsync

    def fsync(descriptor):
        if target.read_text(encoding="utf-8") == "new":  # the rename is done
            flushed_after.add(os.fstat(descriptor).st_ino)
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    write_text(target, "new")
    assert tmp_path.stat().st_ino in flushed_after


def test_a_folder_that_cannot_be_opened_is_left_unflushed_without_an_error(tmp_path, monkeypatch):
    def refuse(path, flags, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))  # as Windows answers os.open of a folder

    monkeypatch.setattr(os, "open", refuse)
    monkeypatch.setattr(os, "fsync", lambda descriptor: pytest.fail("nothing was opened to flush"))
    flush_folder(tmp_path)


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(5, dtype=np.int64),
                                   np.zeros((0, 384), dtype=np.float32), np.arange(6.0).reshape(2, 3).T],
                         ids=["float32 rows", "int64", "no rows", "transposed"])
def test_write_array_reads_back_as_np_save_writes_it(tmp_path, array):
    """The same bytes as np.save for a C-ordered array (a transposed one is stored C-ordered: the same values)."""
    write_array(tmp_path / "ours.bin", array)
    np.save(tmp_path / "numpy.npy", np.ascontiguousarray(array))
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "numpy.npy").read_bytes()
    assert np.array_equal(np.load(tmp_path / "ours.bin"), array)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_append_array_writes_what_tofile_writes(tmp_path):
    arrays = [np.zeros(1, np.int64), np.arange(7, dtype=np.uint16), np.arange(3, dtype=np.int64)[::-1]]
    with open(tmp_path / "ours.bin", "wb") as file:
        for array in arrays:
            append_array(file, array)
    assert (tmp_path / "ours.bin").read_bytes() == b"".join(a.tobytes() for a in arrays)
