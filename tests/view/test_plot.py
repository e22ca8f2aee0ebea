"""``robocache inspect --plot``: a PNG of one episode, native and aligned, for a cache and a
source; checked for its size and that it is not blank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from data_episodes import SPECS, make_episode
from typer.testing import CliRunner

from robocache.cli import app
from robocache.data.cache import build
from robocache.data.formats.lerobot import write_lerobot

pytest.importorskip("matplotlib", reason="matplotlib (robocache[view]) is not installed")
Image = pytest.importorskip("PIL.Image")


def inspect(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["inspect", *map(str, args)])
    return result.exit_code, result.output


def assert_picture(path: Path, rows: int) -> None:
    """A wide PNG, tall enough for the top lane and ``rows`` stream rows, and drawn on: many
    non-white pixels, several distinct colours (markers, lines, shading)."""
    with Image.open(path) as im:
        assert im.format == "PNG"
        w, h = im.size
        pixels = np.asarray(im.convert("RGB"))
    assert w >= 1600 and h >= 300 + 180 * rows, (w, h)
    ink = (pixels < 245).any(axis=2)
    assert 0.03 < ink.mean() < 0.6, ink.mean()
    colours = np.unique(pixels.reshape(-1, 3)[ink.reshape(-1)], axis=0)
    assert len(colours) > 50


@pytest.fixture
def source(tmp_path) -> Path:
    rng = np.random.default_rng(7)
    episodes = [make_episode(i, rng, duration=3.0) for i in range(2)]
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0, version="v3.0")
    return tmp_path / "src"


def test_plot_of_a_cache_and_of_a_source(tmp_path, source):
    build(source, tmp_path / "cache", rate_hz=40.0, progress=False, device="cpu")
    code, out = inspect(tmp_path / "cache", "--plot", tmp_path / "c.png", "--plot-episode", 1)
    assert code == 0, out
    assert "plot:" in out
    # 3 numeric streams + 1 camera below the lanes
    assert_picture(tmp_path / "c.png", rows=4)
    code, out = inspect(source, "--plot", tmp_path / "s.png", "--plot-rate", 40,
                        "--plot-window", "1.0:1.5")
    assert code == 0, out
    assert_picture(tmp_path / "s.png", rows=4)
    code, out = inspect(source, "--plot", tmp_path / "n.png")  # native only: no grid
    assert code == 0, out
    assert_picture(tmp_path / "n.png", rows=4)


@pytest.mark.parametrize("args, needle", [
    (["--plot", "{tmp}/p.jpg"], "--plot must name a .png file"),
    (["--plot", "{src}/p.png"], "never written"),
    (["--plot", "{tmp}/p.png", "--plot-window", "2"], "--plot-window must be START:END"),
    (["--plot", "{tmp}/p.png", "--plot-window", "2:1"], "END > START"),
    (["--plot", "{tmp}/p.png", "--plot-episode", "5"], "its episodes are 0, 1"),
])
def test_plot_bad_input(tmp_path, source, args, needle):
    code, out = inspect(source, *[a.format(tmp=tmp_path, src=source) for a in args])
    assert code == 2 and needle in out and "Traceback" not in out, out
    assert not list(tmp_path.glob("p.*"))


def test_plot_without_matplotlib_names_the_extra(tmp_path, source, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out = inspect(source, "--plot", tmp_path / "p.png")
    assert code == 2 and "robocache[view]" in out, out
    assert not (tmp_path / "p.png").exists()
