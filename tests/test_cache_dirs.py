"""Every cache a machine keeps follows `$FL_LIGHTNING_DATA` (the datasets' root) unless its own
variable says otherwise; unset, the defaults stay where they were (`~/.cache/fl_lightning/`)."""

from pathlib import Path

from fl_lightning.cli.main import main
from fl_lightning.core.files import cache_dir


def test_precedence_own_variable_then_data_root_then_home(monkeypatch, tmp_path):
    for var in ("FL_LIGHTNING_DATA", "FL_LIGHTNING_TEXT_CACHE", "FL_LIGHTNING_TEACHER_CACHE"):
        monkeypatch.delenv(var, raising=False)
    assert cache_dir("text", "FL_LIGHTNING_TEXT_CACHE") == Path.home() / ".cache/fl_lightning/text"
    monkeypatch.setenv("FL_LIGHTNING_DATA", str(tmp_path / "data"))
    assert cache_dir("teachers", "FL_LIGHTNING_TEACHER_CACHE") == tmp_path / "data/.cache/teachers"
    monkeypatch.setenv("FL_LIGHTNING_TEACHER_CACHE", str(tmp_path / "mine"))
    assert cache_dir("teachers", "FL_LIGHTNING_TEACHER_CACHE") == tmp_path / "mine"


def test_a_run_on_a_moved_data_root_keeps_its_text_features_there(monkeypatch, tmp_path, data_root, capsys):
    """`fl-lightning text` (MiniLM class-text features, cached) with the datasets moved by
    `$FL_LIGHTNING_DATA`: the feature cache lands under the new root, nothing under the old."""
    moved = tmp_path / "disk"
    moved.mkdir()
    (moved / "fashion-mnist").symlink_to(Path(data_root).expanduser() / "fashion-mnist")
    monkeypatch.setenv("FL_LIGHTNING_DATA", str(moved))
    monkeypatch.delenv("FL_LIGHTNING_TEXT_CACHE", raising=False)
    args = ["text", "data=fmnist", "text=minilm", "--templates", "a tiny test photo of a {}.",
            f"--out={tmp_path / 'sim.png'}"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    written = list((moved / ".cache" / "text").rglob("*"))
    assert any(p.is_file() for p in written), written
    from fl_lightning.config import compose

    assert compose([]).data.root == str(moved)  # the datasets moved with it
