"""``write_output_text``: a file the user named is written whole or not at all, and errors name that file."""

from __future__ import annotations

import pytest

from loadgen.util.errors import LoadgenError
from loadgen.util.outputfile import write_output_text


def test_the_text_lands_whole_and_its_folder_is_made(tmp_path):
    path = tmp_path / "a" / "b" / "out.json"
    assert write_output_text(path, "{}\n") == path
    assert path.read_text() == "{}\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_a_refusing_check_leaves_the_old_file_and_no_partial(tmp_path):
    path = tmp_path / "engine.toml"
    path.write_text("old\n")
    seen = []

    def refuse(partial):
        seen.append(partial.read_text())
        raise LoadgenError("refused")

    with pytest.raises(LoadgenError, match="refused"):
        write_output_text(path, "new\n", check=refuse)
    assert seen == ["new\n"]
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["engine.toml"]


def test_a_folder_is_refused_under_its_own_name_before_anything_is_written(tmp_path):
    with pytest.raises(IsADirectoryError) as caught:
        write_output_text(tmp_path, "x")
    assert caught.value.filename == str(tmp_path) and not list(tmp_path.iterdir())


def test_a_failed_write_names_the_users_file_not_the_partial(tmp_path):
    blocker = tmp_path / "out.json.partial"
    blocker.mkdir()  # the partial cannot be opened as a file
    with pytest.raises(OSError) as caught:
        write_output_text(tmp_path / "out.json", "x")
    assert caught.value.filename == str(tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
