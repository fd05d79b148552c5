"""Where the kit's data folder is: $POETLAB_DATA, else the nearest data/ at or above the working directory."""

from __future__ import annotations

from poetlab.core.data import DATA_DIR_ENV, data_dir


def test_the_environment_names_the_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "elsewhere"))
    assert data_dir() == tmp_path / "elsewhere"  # even before it exists: the caller reports its absence


def test_the_nearest_data_folder_above_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "a" / "data").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b" / "c")
    assert data_dir() == tmp_path / "a" / "data"  # the nearest, not the outermost
    monkeypatch.chdir(tmp_path)
    assert data_dir() == tmp_path / "data"


def test_without_a_data_folder_it_is_the_working_directorys(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, "")  # empty: as if unset
    (tmp_path / "w").mkdir()
    monkeypatch.chdir(tmp_path / "w")
    above = [folder / "data" for folder in tmp_path.parents if (folder / "data").is_dir()]
    assert data_dir() == (above[0] if above else tmp_path / "w" / "data")
