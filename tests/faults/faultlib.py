"""Small datasets of every format, their faults, and the checks that nothing was lost.

Every fault case records one row (fault → what happened, data lost or silently wrong?, raw
traceback?) in ``ROWS``; ``pytest tests/faults --fault-table docs/reliability.md`` writes them
as the table of docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zarr
from typer.testing import CliRunner

from robocache.cli import app
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats.lerobot import write_lerobot

EPISODES = 6
STEPS = 30  # rows per episode (zarr chunks hold exactly one episode's rows)
FPS = 10.0
RATE = 10.0
SPECS = {"state": StreamSpec("state", "numeric", "float32", (3,), FPS),
         "action": StreamSpec("action", "numeric", "float32", (2,), FPS)}
FORMATS = ("lerobot-v2.1", "lerobot-v3.0", "zarr", "robomimic")


@dataclass
class Row:
    fault: str
    outcome: str
    lost: bool
    traceback: bool


ROWS: list[Row] = []


def record(fault: str, outcome: str, *, lost: bool = False, traceback: bool = False) -> None:
    """One row of the reliability table; the test asserts ``lost`` and ``traceback`` after."""
    ROWS.append(Row(fault, outcome, lost, traceback))


def episode_data(seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"state": rng.normal(size=(STEPS, 3)).astype(np.float32),
             "action": rng.normal(size=(STEPS, 2)).astype(np.float32)}
            for _ in range(EPISODES)]


def write_source(kind: str, root: Path, seed: int) -> Path:
    """Write the dataset of ``kind`` (one of :data:`FORMATS`) under ``root``; returns its path."""
    data = episode_data(seed)
    t = np.arange(STEPS) / FPS
    if kind.startswith("lerobot"):
        eps = [Episode(i, {k: Stream(SPECS[k], t, d[k]) for k in SPECS}, {"tasks": ["pick"]})
               for i, d in enumerate(data)]
        return write_lerobot(root / kind, eps, SPECS, fps=FPS, version=kind.split("-")[1])
    if kind == "zarr":
        g = zarr.open_group(str(root / "rb.zarr"), mode="w", zarr_format=2)
        for k in SPECS:
            g.create_array(f"data/{k}", data=np.concatenate([d[k] for d in data]),
                           chunks=(STEPS, SPECS[k].shape[0]))
        g.create_array("meta/episode_ends", data=np.arange(1, EPISODES + 1) * STEPS)
        return root / "rb.zarr"
    path = root / "demo.hdf5"
    with h5py.File(path, "w") as f:
        for i, d in enumerate(data):
            g = f.create_group(f"data/demo_{i}")
            g.create_dataset("obs/state", data=d["state"], chunks=True, compression="gzip",
                             fletcher32=True)
            g.create_dataset("actions", data=d["action"], chunks=True, compression="gzip",
                             fletcher32=True)
            g.attrs["num_samples"] = STEPS
    return path


def write_camera_source(root: Path, seed: int = 0) -> Path:
    """A LeRobot v3.0 dataset of :data:`EPISODES` episodes with the numeric streams and a 4x4
    RGB camera stored inline (one frame per row)."""
    cam = StreamSpec("cam", "image", "uint8", (4, 4, 3), FPS)
    specs = {**SPECS, "cam": cam}
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS) / FPS
    eps = [Episode(i, {**{k: Stream(SPECS[k], t, d[k]) for k in SPECS},
                       "cam": Stream(cam, t, rng.integers(0, 255, (STEPS, 4, 4, 3), np.uint8))},
                   {"tasks": ["pick"]}) for i, d in enumerate(episode_data(seed))]
    return write_lerobot(root, eps, specs, fps=FPS, version="v3.0")


def same_frames(dest: Path, clean: Path) -> bool:
    """Whether every camera table of ``dest`` holds the clean build's frames, each once."""
    names = sorted(p.name for p in (clean / "frames").glob("*.lance"))
    if names != sorted(p.name for p in (dest / "frames").glob("*.lance")):
        return False
    for name in names:
        got, want = (lance.dataset(str(d / "frames" / name)).to_table()
                     .sort_by([("episode_index", "ascending"), ("frame", "ascending")])
                     for d in (dest, clean))
        if not got.equals(want):
            return False
    return True


def lance_version(uri: Path) -> int:
    """The latest committed version of the Lance dataset at ``uri`` (0: none yet)."""
    try:
        return lance.dataset(str(uri)).version
    except (OSError, ValueError):
        return 0


def tree_hash(path: Path) -> str:
    """sha256 over every file (relative name and bytes) under ``path`` (or of the file)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in files:
        h.update(str(p.relative_to(path.parent)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def load_cache(dest: Path) -> dict[int, pa.Table]:
    """The cache's rows by episode, asserting each episode is there once with steps 0..n-1."""
    table = lance.dataset(str(dest / "data.lance")).to_table()
    out = {}
    for ep in np.unique(table.column("episode_index").to_numpy()):
        rows = table.filter(pa.compute.equal(table.column("episode_index"), ep))
        rows = rows.sort_by("step")
        steps = rows.column("step").to_numpy()
        assert np.array_equal(steps, np.arange(len(steps))), f"episode {ep}: steps {steps}"
        out[int(ep)] = rows
    return out


def same_as_clean(dest: Path, clean: Path, indices) -> bool:
    """Whether ``dest`` holds exactly ``indices``, each once and equal to the clean build."""
    got, want = load_cache(dest), load_cache(clean)
    if sorted(got) != sorted(indices):
        return False
    return all(got[i].equals(want[i]) for i in indices)


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut ``path`` to ``keep`` of its bytes (a file whose copy or write was interrupted)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def edit_episode(src: Path, index: int) -> None:
    """Add 1 to episode ``index``'s actions in a LeRobot v3.0 source (its shared data file)."""
    path = src / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    col = table.schema.get_field_index("action")
    mine = table.column("episode_index").to_numpy() == index
    values = np.stack(table.column(col).to_numpy(zero_copy_only=False))
    values[mine] += 1
    pq.write_table(table.set_column(col, table.schema.field(col),
                                    pa.array(list(values), table.schema.field(col).type)), path)


def copy_source(src: Path, root: Path) -> Path:
    out = root / src.name
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, out)
    return out


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr or "Traceback" in self.stdout

    @property
    def one_line(self) -> bool:
        """stderr is exactly one line ``error: <problem>; <fix>``."""
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        return len(lines) == 1 and lines[0].startswith("error: ") and "; " in lines[0]


def cli(*args: str) -> Result:
    """Run ``robocache <args>`` in this process."""
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Result(r.exit_code, r.stdout, r.stderr)


# Imports first, then the file-size limit (bytes), then the command.
RUNNER = """
import resource, sys
import robocache.cli
fsize = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
sys.argv = ["robocache", *sys.argv[2:]]
robocache.cli.main()
"""


def cli_process(*args: str, fsize: int = -1, timeout: float = 120) -> Result:
    """Run ``robocache <args>`` in a subprocess whose files may not grow past ``fsize`` bytes
    (a full disk; -1: no limit)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", RUNNER, str(fsize), *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


# A writer whose source reads slowly: `build` of every episode, `delay` seconds per read, each
# episode aligned and committed as soon as it is read (one per batch: a commit per episode).
SLOW_BUILD = """
import sys, time
import robocache.data.build.run as run
from robocache.data.cache import build
from robocache.data.formats import open_source
src = open_source(sys.argv[1])
read = src.read
def slow(i):
    time.sleep(float(sys.argv[3]))
    return read(i)
src.read = slow
run.ALIGN_EPISODES = 1
build(src, sys.argv[2], rate_hz=float(sys.argv[4]), progress=False, device="cpu",
      batch_rows=STEPS)
""".replace("STEPS", str(STEPS))


def slow_writer(src: Path, dest: Path, delay: float) -> subprocess.Popen:
    """Start a slow writer of ``dest`` (see :data:`SLOW_BUILD`); return once it holds the lock."""
    from robocache.data.lock import holder

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(src), str(dest), str(delay),
                             str(RATE)], env=env)
    deadline = time.monotonic() + 60
    while holder(dest) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.02)
    return proc


# each episode read slowly and committed as soon as it is written (a build of a few small
# episodes otherwise commits once, at its end, and a signal sent when the first commit shows
# could land after the command is done)
SLOW_CLI = """
import sys, time
import robocache.cli
import robocache.data.build.run as run
import robocache.data.formats as formats
run.COMMIT_SECONDS = 0.0
opened = formats.open_source
def slow_open(*args, **kwargs):
    src = opened(*args, **kwargs)
    read = src.read
    def slow(i):
        time.sleep(0.3)
        return read(i)
    src.read = slow
    return src
formats.open_source = slow_open
sys.argv = ["robocache", *sys.argv[1:]]
robocache.cli.main()
"""


def table_markdown(rows: list[Row]) -> str:
    lines = ["| fault or bad input | what happens | data lost or silently wrong | raw traceback |",
             "|---|---|---|---|"]
    lines += [f"| {r.fault} | {r.outcome} | {'**yes**' if r.lost else 'no'} | "
              f"{'**yes**' if r.traceback else 'no'} |" for r in rows]
    lost, tb = sum(r.lost for r in rows), sum(r.traceback for r in rows)
    lines.append(f"| **{len(rows)} cases** | | **{lost}** | **{tb}** |")
    return "\n".join(lines) + "\n"
