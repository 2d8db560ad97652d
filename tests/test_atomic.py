"""Atomic writes publish files and folders with the permissions a plain write would give."""
import os

from bertforge.atomic import staging_folder, write_text


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
        with staging_folder(target) as staging:
            (staging / "config.json").write_text("{}")
            os.rename(staging, target)
        assert target.stat().st_mode & 0o777 == 0o755  # mkdtemp alone leaves 0700
    finally:
        os.umask(umask)
