"""`kevin cache`'s errors: every usage error is one `kevin: error: ...` line with exit 2 and no
traceback; an archive that cannot be imported is named with what is wrong; nothing to clear is
not an error (CPU only)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from kevin_backend.cache import KernelCache
from kevin_backend.cli.main import main
from kevin_backend.config import override
from test_cache import make_entry


@pytest.fixture(autouse=True)
def _no_home_cache(tmp_path: Path):
    with override(KEVIN_CACHE_DIR=tmp_path / "default-cache"):
        yield


@pytest.fixture
def opts(tmp_path: Path) -> list[str]:
    """A user cache with two entries, no seed."""
    cache = KernelCache(tmp_path / "cache", seed_dir=None)
    cache.put(make_entry(0))
    cache.put(make_entry(1))
    return ["--cache-dir", str(cache.cache_dir), "--no-seed"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    """The single `kevin: error:` line of stderr (fails on anything else, a traceback above all)."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kevin: error: "), err
    return lines[0]


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# -- export ----------------------------------------------------------------------------------------


def test_export_into_a_missing_folder_is_one_usage_line(tmp_path: Path, capsys, opts) -> None:
    target = tmp_path / "no-such-folder" / "kernels.tar.gz"
    code, out, err = run(capsys, "cache", "export", str(target), *opts)
    line = one_error_line(err)
    assert code == 2 and out == ""
    assert str(target) in line and f"the folder {target.parent} does not exist" in line
    assert not target.parent.exists()


def test_export_onto_a_folder_is_one_usage_line(tmp_path: Path, capsys, opts) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    code, _, err = run(capsys, "cache", "export", str(folder), *opts)
    line = one_error_line(err)
    assert code == 2 and "it is a folder" in line and "kernels.tar.gz" in line
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_export_into_a_read_only_folder_fails_in_one_line(tmp_path: Path, capsys, opts) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, _, err = run(capsys, "cache", "export", str(folder / "k.tar.gz"), *opts)
    finally:
        folder.chmod(0o755)
    line = one_error_line(err)
    assert code == 1 and f"cannot write {folder / 'k.tar.gz'}" in line and "Permission denied" in line


# -- import ----------------------------------------------------------------------------------------


def _exported(tmp_path: Path, capsys, opts) -> Path:
    archive = tmp_path / "good.tar.gz"
    assert run(capsys, "cache", "export", str(archive), *opts)[0] == 0
    return archive


@pytest.mark.parametrize(
    "name, make, says",
    [
        ("missing.tar.gz", None, "no such file"),
        ("notes.txt", lambda p: p.write_text("these are notes\n"), "not a .tar.gz made by `kevin cache export` (it is text)"),
        ("empty.tar.gz", lambda p: p.write_bytes(b""), "the file is empty"),
        ("noise.bin", lambda p: p.write_bytes(bytes(range(256)) * 4), "no gzip, bzip2, xz or tar header"),
        ("text.gz", lambda p: p.write_bytes(gzip.compress(b"not a tar\n" * 100)), "gzip data that is not a tar archive"),
        ("folder.tar.gz", lambda p: p.mkdir(), "it is a folder"),
        ("other.tar.gz", lambda p: p.write_bytes(tar_gz({"docs/readme.txt": b"hello"})), "it holds no cache entries"),
    ],
)
def test_import_of_what_is_not_an_archive_names_the_file(tmp_path: Path, capsys, name, make, says) -> None:
    path = tmp_path / name
    if make is not None:
        make(path)
    fresh = ["--cache-dir", str(tmp_path / "fresh"), "--no-seed"]
    code, out, err = run(capsys, "cache", "import", str(path), *fresh)
    line = one_error_line(err)
    assert code == 2 and out == ""
    assert f"cannot import {path}: " in line and says in line
    assert not (tmp_path / "fresh" / "entries").exists()  # nothing imported


def test_import_of_a_truncated_or_damaged_archive_names_the_file(tmp_path: Path, capsys, opts) -> None:
    good = _exported(tmp_path, capsys, opts)
    data = good.read_bytes()
    fresh = ["--cache-dir", str(tmp_path / "fresh"), "--no-seed"]

    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(data[: len(data) // 2])
    code, _, err = run(capsys, "cache", "import", str(truncated), *fresh)
    line = one_error_line(err)
    assert code == 2 and f"cannot import {truncated}: the archive is truncated" in line

    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(data[:20] + bytes(64) + data[84:])
    code, _, err = run(capsys, "cache", "import", str(damaged), *fresh)
    line = one_error_line(err)
    assert code == 2 and f"cannot import {damaged}: " in line and ("damaged" in line or "truncated" in line)
    assert KernelCache(tmp_path / "fresh", seed_dir=None).entries() == []

    code, out, err = run(capsys, "cache", "import", str(good), *fresh)  # the good one still imports
    assert code == 0 and "imported 2 entries" in out and err == ""


def test_an_unsafe_archive_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(tar_gz({"../escape.py": b"x"}))
    code, _, err = run(capsys, "cache", "import", str(evil), "--cache-dir", str(tmp_path / "c"), "--no-seed")
    line = one_error_line(err)
    assert code == 1 and f"refusing {evil}" in line and "outside the archive" in line


# -- clear and the command group -------------------------------------------------------------------


@pytest.mark.parametrize("confirm", [[], ["--yes"]])
def test_clear_with_nothing_to_clear_is_not_an_error(tmp_path: Path, capsys, confirm: list[str]) -> None:
    for cache_dir in (tmp_path / "never-made", tmp_path / "emptied"):
        if cache_dir.name == "emptied":
            cache = KernelCache(cache_dir, seed_dir=None)
            cache.put(make_entry(3))
            assert cache.clear() == 1
        code, out, err = run(capsys, "cache", "clear", *confirm, "--cache-dir", str(cache_dir), "--no-seed")
        assert code == 0 and err == ""
        assert out.strip() == f"nothing to clear: no user entries in {cache_dir}"


def test_clear_without_yes_is_still_a_usage_error_when_there_is_something(tmp_path: Path, capsys, opts) -> None:
    code, _, err = run(capsys, "cache", "clear", *opts)
    assert code == 2 and "this would remove 2 user entries" in one_error_line(err)


def test_cache_without_an_action_is_one_usage_line(tmp_path: Path, capsys, opts) -> None:
    code, out, err = run(capsys, "cache", *opts)
    line = one_error_line(err)
    assert code == 2 and out == "" and "needs an action" in line and "prune" in line


def test_prefix_errors_are_one_usage_line(capsys, opts) -> None:
    code, _, err = run(capsys, "cache", "show", "zz", *opts)
    assert code == 2 and "not a digest prefix" in one_error_line(err)
    code, _, err = run(capsys, "cache", "rm", "0" * 31 + "g", *opts)
    assert code == 2 and one_error_line(err)
