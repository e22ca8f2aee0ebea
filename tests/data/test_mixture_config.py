"""A mixture from one YAML file: the common schema, padding, weights and balancing, joint ->
EE conversion, the `robocache mixture` command, and bad files refused before data is read.

References: each source's batch rows equal that cache's own `RobotDataset` windows normalized
with its own statistics (and, for the EE pose, `robocache.kinematics.fk` of its joints);
weights equal the balance computed from the manifests by hand."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mixture_caches import ROBOTS, make_caches
from typer.testing import CliRunner

from robocache.data import MixedDataset, RobotDataset, RobotLoader
from robocache.data.loader import _Sampler
from robocache.data.mixture import resolve
from robocache.errors import DataError
from robocache.kinematics import Chain, asset_path, fk
from robocache.ops.geometry import matrix_to_rot6d


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return make_caches(tmp_path_factory.mktemp("mixture-file"))


def base(caches) -> dict:
    return {"history": 2, "horizon": 3, "pad": {"state": 8, "action": 8},
            "datasets": [
                {"name": "arm", "path": str(caches["arm"]), "weight": 2.0,
                 "cameras": {"primary": "observation.images.top"},
                 "state": "observation.state", "action": "action"},
                {"name": "mobile", "path": str(caches["mobile"]),
                 "state": "observation.state", "action": {"key": "action"}},
                {"name": "hand", "path": str(caches["hand"]), "embodiment": "arm",
                 "cameras": {"primary": "observation.images.wrist"},
                 "state": "observation.state", "action": "action"}]}


def write(tmp_path: Path, config: dict, name: str = "mix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def test_common_schema_padding_and_per_source_stats(caches, tmp_path):
    mixed = MixedDataset.from_config(write(tmp_path, base(caches)))
    assert mixed.names == ["arm", "mobile", "hand"]
    loader = RobotLoader(mixed, 40, device="cpu", seed=3)
    seen = set()
    for batch in loader:
        assert batch["observation.state"].shape == (40, 2, 8)
        assert batch["action"].shape == (40, 3, 8)
        assert batch["observation.images.primary"].shape == (40, 2, 3, 4, 5)
        for i, name in enumerate(mixed.names):
            rows = batch["source"] == i
            if not rows.any():
                continue
            seen.add(i)
            own = RobotDataset(caches[name], history=2, horizon=3)
            want = own.fetch(batch["index"][rows])
            for key in ("observation.state", "action"):
                width = ROBOTS[name][0 if key == "observation.state" else 1]
                st = own.stats[key]
                norm = ((want[key] - st.mean) / st.std.clamp_min(1e-8)).float()
                torch.testing.assert_close(batch[key][rows][..., :width], norm, atol=1e-4,
                                           rtol=1e-4)
                assert not batch[key][rows][..., width:].any()
                mask = batch[f"{key}_dim_mask"][rows]
                assert mask[:, :width].all() and not mask[:, width:].any()
            camera = ROBOTS[name][3]
            cam = batch["observation.images.primary"][rows]
            if camera is None:  # a robot without the role: zeros, padded
                assert not cam.any() and batch["observation.images.primary_is_pad"][rows].all()
            else:
                torch.testing.assert_close(cam, want[camera])
    assert seen == {0, 1, 2}


def test_weights_and_balancing(caches, tmp_path):
    config = base(caches)
    manifests = [json.loads((caches[d["name"]] / "manifest.json").read_text())
                 for d in config["datasets"]]
    frames = np.array([sum(e["rows"] for e in m["episodes"]) for m in manifests], float)
    eps = np.array([len(m["episodes"]) for m in manifests], float)
    given = np.array([2.0, 1.0, 1.0])
    # embodiments: arm and hand share "arm" (half the mass, split by frames), mobile the rest
    emb = np.array([frames[0] / (frames[0] + frames[2]), 1.0, frames[2] / (frames[0] + frames[2])])
    for balance, raw in (("none", given), ("frames", given * frames),
                         ("episodes", given * eps), ("embodiment", given * emb)):
        config["balance"] = balance
        got = [s.weight for s in resolve(write(tmp_path, config)).sources]
        np.testing.assert_allclose(got, raw / raw.sum(), rtol=1e-12)
        table = resolve(write(tmp_path, config)).table()
        assert [r["frames"] for r in table] == frames.tolist()
        assert [r["episodes"] for r in table] == eps.tolist()
    mixed = MixedDataset.from_config(write(tmp_path, config), balance="frames")
    np.testing.assert_allclose(mixed.weights.numpy(),
                               given * frames / (given * frames).sum(), rtol=1e-12)
    counts = np.zeros(3)
    sampler = _Sampler(mixed, 512, True, True, seed=1)
    for b in range(60):
        for i, idx in sampler.mixed_batch(b):
            counts[i] += len(idx)
    np.testing.assert_allclose(counts / counts.sum(), mixed.weights.numpy(), atol=0.01)


def test_joint_to_ee_through_the_urdf(caches, tmp_path):
    config = {"history": 1, "horizon": 2, "datasets": [
        {"name": "panda", "path": str(caches["panda"]),
         "kinematics": {"urdf": asset_path("panda.urdf"), "end_link": "panda_hand",
                        "joint_dims": list(range(7))},
         "state": {"key": "observation.state", "to_ee": True},
         "action": {"key": "action", "to_ee": True}}]}
    mixed = MixedDataset.from_config(write(tmp_path, config))
    src = resolve(write(tmp_path, config)).sources[0]
    assert src.widths == {"observation.state": 9, "action": 10}  # pose, then the gripper
    chain = Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")
    own = RobotDataset(caches["panda"], history=1, horizon=2)
    idx = torch.arange(len(own))
    raw = own.fetch(idx)
    served = mixed.datasets[0].fetch(idx)
    for key, kept in (("observation.state", []), ("action", [7])):
        q = raw[key].double()
        pose = fk(chain, q[..., :7])
        want = torch.cat([pose[..., :3, 3], matrix_to_rot6d(pose[..., :3, :3]),
                          q[..., kept]], -1).float()
        torch.testing.assert_close(served[key], want, atol=1e-5, rtol=1e-5)
        stats = mixed.datasets[0].stats[key]
        flat = want.reshape(-1, want.shape[-1]) if key == "observation.state" else None
        if flat is not None:  # every step once: the statistics of the served pose
            torch.testing.assert_close(stats.mean.float(), flat.mean(0), atol=1e-5, rtol=1e-5)


def test_relative_actions_passed_to_the_dataset(caches, tmp_path, monkeypatch):
    import inspect

    config = base(caches)
    config["datasets"][0] = {"name": "panda", "path": str(caches["panda"]),
                             "state": "observation.state",
                             "action": {"key": "action", "absolute_dims": [7],
                                        "relative": {"mode": "joint",
                                                     "state_dims": list(range(7))}}}
    path = write(tmp_path, config)
    want = {"mode": "joint", "state": "observation.state", "absolute_dims": [7],
            "state_dims": list(range(7))}
    assert resolve(path).sources[0].relative == want
    if "relative_actions" not in inspect.signature(RobotDataset).parameters:
        with pytest.raises(DataError, match="dataset 'panda'.*relative"):
            MixedDataset.from_config(path)
        return
    # fields beyond mode go to RobotDataset as they are; its refusals name the dataset
    config["datasets"][0]["action"]["relative"] = {"mode": "joint", "no_such_field": 1}
    with pytest.raises(DataError, match=r"bad.yaml: dataset 'panda': .*no_such_field"):
        MixedDataset.from_config(write(tmp_path, config, "bad.yaml"))
    given = []
    real = RobotDataset.__init__

    @functools.wraps(real)
    def spy(self, *args, **kw):
        given.append(kw.get("relative_actions"))
        real(self, *args, **kw)

    monkeypatch.setattr(RobotDataset, "__init__", spy)
    MixedDataset.from_config(path)
    assert given[0] == {"action": want}
    assert given[1:] == [None, None]


def _edit(caches, change):
    config = base(caches)
    change(config)
    return config


def _set(path, value):
    def change(config):
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _drop(path):
    def change(config):
        node = config
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return change


BAD = {
    "unknown-top-key": (_set(["horizen"], 3), r"unknown key 'horizen'.*did you mean 'horizon'"),
    "unknown-dataset-key": (_set(["datasets", 1, "camras"], {}),
                            r"dataset 'mobile': unknown key 'camras'.*'cameras'"),
    "unknown-action-key": (_set(["datasets", 2, "action"], {"key": "action", "relatve": "joint"}),
                           r"dataset 'hand': unknown key 'relatve'"),
    "missing-stream": (_set(["datasets", 0, "cameras"], {"wrist": "observation.images.wrist"}),
                       r"dataset 'arm': `cameras.wrist` maps to 'observation.images.wrist', "
                       r"which the cache .* does not have.*observation.images.top"),
    "missing-state": (_set(["datasets", 1, "state"], "observation.joints"),
                      r"dataset 'mobile': `state` maps to 'observation.joints'.*"
                      r"observation.state"),
    "widths-without-pad": (_drop(["pad"]), r"dataset 'mobile': action is 4-D where dataset "
                           r"'arm' is 2-D; add `pad: \{action: 7\}`"),
    "pad-too-narrow": (_set(["pad", "action"], 5), r"dataset 'hand': action is 7-D, wider than "
                       r"`pad.action: 5`; raise `pad.action` to at least 7"),
    "weights-zero": (lambda c: [d.update(weight=0) for d in c["datasets"]],
                     r"the weights sum to 0 .*arm=0.*give at least one dataset"),
    "weight-negative": (_set(["datasets", 2, "weight"], -1.0),
                        r"dataset 'hand': `weight` must be a finite number >= 0"),
    "balance": (_set(["balance"], "size"), r"`balance` must be one of none, frames"),
    "no-cache": (_set(["datasets", 1, "path"], "/nonexistent/cache"),
                 r"dataset 'mobile': no cache at /nonexistent/cache.*fix `path`"),
    "relative-without-state": (
        lambda c: c["datasets"][1].update(action={"key": "action", "relative": "joint"},
                                          state=None),
        r"dataset 'mobile': `action.relative: joint` is relative to the state; map `state`"),
    "urdf-joint-count": (
        lambda c: c["datasets"][1].update(
            kinematics={"urdf": asset_path("panda.urdf"), "end_link": "panda_hand"},
            state={"key": "observation.state", "to_ee": True}),
        r"dataset 'mobile': the URDF .*panda.urdf's chain panda_link0 -> panda_hand has 7 "
        r"joints, but state 'observation.state' has 6 joint dims; use the URDF of this robot"),
    "urdf-joint-dims": (
        lambda c: c["datasets"][2].update(
            kinematics={"urdf": asset_path("panda.urdf"), "end_link": "panda_hand",
                        "joint_dims": [0, 1, 2]},
            action={"key": "action", "to_ee": True}),
        r"dataset 'hand': the URDF .* has 7 joints, but action 'action' has 3 joint dims"),
    "relative-renamed": (
        lambda c: c["datasets"][1].update(action={"key": "observation.state",
                                                  "relative": "joint"}, state="action"),
        r"dataset 'mobile': relative actions are served under the stream names .* rename"),
    "language-not-a-string-stream": (
        _set(["datasets", 0, "language"], {"subtask": "observation.state"}),
        r"dataset 'arm': `language.subtask` maps to 'observation.state', which the cache .* "
        r"does not have; map it to one of its event streams: language.subtask"),
    "language-reserved-key": (_set(["datasets", 0, "language"], {"task": "language.subtask"}),
                              r"dataset 'arm': `language` key 'task' must be a plain name"),
    "urdf-bad-end-link": (
        lambda c: c["datasets"][1].update(
            kinematics={"urdf": asset_path("panda.urdf"), "end_link": "gripper"},
            state={"key": "observation.state", "to_ee": True}),
        r"dataset 'mobile': kinematics: end_link 'gripper' is not a link of robot"),
    "episodes-not-cached": (_set(["datasets", 0, "episodes"], [0, 9]),
                            r"dataset 'arm': `episodes` must list episodes the cache holds"),
    "instructions-missing": (_set(["datasets", 0, "instructions"], "nowhere.json"),
                             r"dataset 'arm': `instructions` names .*nowhere.json, which is not "
                             r"a file; fix the path"),
    "to-ee-without-urdf": (_set(["datasets", 0, "state"], {"key": "observation.state",
                                                            "to_ee": True}),
                           r"dataset 'arm': `state.to_ee` .* add `kinematics"),
    "twice": (_set(["datasets", 1, "name"], "arm"), r"dataset 'arm' is named twice"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_refused_before_data_is_read(caches, tmp_path, monkeypatch, case):
    change, match = BAD[case]
    path = write(tmp_path, _edit(caches, change))

    def no_read(*args, **kw):
        raise AssertionError("data was read before the file was checked")

    monkeypatch.setattr("robocache.data.dataset.open_served", no_read)
    with pytest.raises(DataError, match=match) as err:
        MixedDataset.from_config(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path))
    result = CliRunner().invoke(_app(), ["mixture", str(path), "--check"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}")


def test_bad_yaml_and_overrides(caches, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: [a\n")
    with pytest.raises(DataError, match=r"bad.yaml: not valid YAML"):
        resolve(bad)
    with pytest.raises(DataError, match=r"unknown override 'batch'"):
        MixedDataset.from_config(write(tmp_path, base(caches)), batch=3)
    mixed = MixedDataset.from_config(write(tmp_path, base(caches)), history=1,
                                     pad={"state": 9, "action": 12})
    assert mixed.shapes["observation.state"][0] == (1, 9)
    assert mixed.shapes["action"][0] == (3, 12)


def _app():
    from robocache.cli import app

    return app


def test_check_prints_the_resolved_table(caches, tmp_path, monkeypatch):
    path = write(tmp_path, {**base(caches), "balance": "frames"})
    runner = CliRunner()
    monkeypatch.setattr("robocache.data.dataset.open_served",
                        lambda *a, **k: pytest.fail("--check read data"))
    result = runner.invoke(_app(), ["mixture", str(path), "--check"])
    assert result.exit_code == 0, result.output
    for text in ("arm", "mobile", "hand", "3 -> 8", "4 -> 8", "observation.images.primary <- "
                 "observation.images.top", "balance frames"):
        assert text in result.stdout
    result = runner.invoke(_app(), ["mixture", str(path), "--check", "--json"])
    rows = json.loads(result.stdout)["datasets"]
    assert [r["name"] for r in rows] == ["arm", "mobile", "hand"]
    assert abs(sum(r["weight"] for r in rows) - 1) < 1e-12
    assert rows[1]["widths"] == {"observation.state": 8, "action": 8}
    monkeypatch.undo()
    result = runner.invoke(_app(), ["mixture", str(path), "--json"])
    assert result.exit_code == 0, result.output
    shapes = json.loads(result.stdout)["batch"]
    assert shapes["action"] == [8, 3, 8] and shapes["task"] == [8]


def test_the_docs_example_uses_known_keys():
    from robocache.data import mixture as M

    text = (Path(__file__).parents[2] / "docs" / "mixtures.md").read_text()
    config = yaml.safe_load(text.split("```yaml\n")[1].split("```")[0])
    M._unknown(config, M.TOP_KEYS, "docs", "the file")
    assert len(config["datasets"]) == 3
    for entry in config["datasets"]:
        M._unknown(entry, M.DATASET_KEYS, "docs", "the dataset")
        for slot in ("state", "action"):
            M._stream(entry[slot], slot, "docs")
        M._unknown(entry.get("kinematics", {}), M.KINEMATICS_KEYS, "docs", "kinematics")


def test_epochs_drawn_ahead_equal_epochs_drawn_fresh(caches, tmp_path):
    """The resident loader draws a mixture's next epoch on a thread; each epoch equals the one
    a fresh loader draws for it."""
    mixed = MixedDataset.from_config(write(tmp_path, base(caches)))
    loader = RobotLoader(mixed, 16, device="cpu", seed=2, normalize=None)
    for epoch in range(3):
        got = [(b["source"].clone(), b["index"].clone()) for b in loader]
        fresh = RobotLoader(mixed, 16, device="cpu", seed=2, normalize=None)
        fresh.set_epoch(epoch)
        want = [(b["source"], b["index"]) for b in fresh]
        assert len(got) == len(want) > 0
        for (s1, i1), (s2, i2) in zip(got, want, strict=True):
            assert torch.equal(s1, s2) and torch.equal(i1, i2)
    assert loader._ahead is not None and loader._ahead[0][0] == 3


def test_relative_actions_from_the_file_end_to_end(caches, tmp_path):
    """`robocache mixture FILE --stats` stores the relative chunks' statistics the file's
    relative actions need; the mixture then serves each relative source's chunks as that
    source alone serves them (relative, normalized with those statistics, padded)."""
    if "relative_actions" not in __import__("inspect").signature(RobotDataset).parameters:
        pytest.skip("RobotDataset has no relative actions")
    relative = {"mode": "joint", "state_dims": list(range(7))}
    config = {"history": 2, "horizon": 3, "pad": {"state": 8, "action": 8}, "datasets": [
        {"name": "panda", "path": str(caches["panda"]), "state": "observation.state",
         "action": {"key": "action", "relative": relative, "absolute_dims": [7]}},
        {"name": "mobile", "path": str(caches["mobile"]), "state": "observation.state",
         "action": "action"}]}
    path = write(tmp_path, config)
    with pytest.raises(DataError, match=r"panda holds only its absolute statistics"):
        RobotLoader(MixedDataset.from_config(path), 16, device="cpu")
    result = CliRunner().invoke(_app(), ["mixture", str(path), "--check", "--stats",
                                         "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "panda: statistics of action's relative chunks" in result.stdout
    mixed = MixedDataset.from_config(path)
    spec = {"action": {**relative, "state": "observation.state", "absolute_dims": [7]}}
    alone = RobotLoader(RobotDataset(caches["panda"], history=2, horizon=3,
                                     relative_actions=spec), 4, device="cpu").packed
    seen = 0
    for batch in RobotLoader(mixed, 16, device="cpu", seed=4):
        rows = batch["source"] == 0
        if not rows.any():
            continue
        want = alone.fetch(batch["index"][rows])
        torch.testing.assert_close(batch["action"][rows][..., :8], want["action"])
        torch.testing.assert_close(batch["observation.state"][rows][..., :7],
                                   want["observation.state"])
        assert not batch["observation.state"][rows][..., 7:].any()
        seen += int(rows.sum())
    assert seen > 0


def test_an_episode_subset(caches, tmp_path):
    config = base(caches)
    config["datasets"][1]["episodes"] = [0, 2]
    config["balance"] = "frames"
    path = write(tmp_path, config)
    manifest = json.loads((caches["mobile"] / "manifest.json").read_text())
    rows = {e["index"]: e["rows"] for e in manifest["episodes"]}
    source = resolve(path).sources[1]
    assert (source.episodes, source.frames) == (2, rows[0] + rows[2])
    mixed = MixedDataset.from_config(path)
    assert len(mixed.datasets[1]) == rows[0] + rows[2]
    assert set(mixed.datasets[1].episode_index.tolist()) == {0, 2}


def test_streams_joined_into_one_key(caches, tmp_path):
    """`state: [a, b]` serves the streams side by side as the state, with the statistics of
    the joined values (per dimension, those of each stream)."""
    config = base(caches)
    config["datasets"][2]["state"] = ["observation.state", "observation.gripper"]
    path = write(tmp_path, config)
    source = resolve(path).sources[2]
    assert source.widths["observation.state"] == 3
    assert resolve(path).table()[2]["mapping"]["observation.state"] == \
        "observation.state + observation.gripper"
    mixed = MixedDataset.from_config(path)
    hand = mixed.datasets[2]
    assert "observation.gripper" not in hand.keys
    own = RobotDataset(caches["hand"], history=2, horizon=3)
    idx = torch.arange(len(own))
    raw = own.fetch(idx)
    want = torch.cat([raw["observation.state"], raw["observation.gripper"]], -1)
    torch.testing.assert_close(hand.fetch(idx)["observation.state"], want)
    stats = hand.stats["observation.state"]
    torch.testing.assert_close(stats.mean.float(), torch.cat(
        [own.stats["observation.state"].mean, own.stats["observation.gripper"].mean]).float())
    batch = next(iter(RobotLoader(mixed, 64, device="cpu", seed=1)))
    rows = batch["source"] == 2
    assert rows.any()
    mask = batch["observation.state_dim_mask"][rows]
    assert mask[:, :3].all() and not mask[:, 3:].any()
    config["datasets"][2]["action"] = {"key": "action", "relative": "joint"}
    with pytest.raises(DataError, match=r"dataset 'hand': relative actions are served from one "
                                        r"state and one action stream"):
        resolve(write(tmp_path, config, "rel.yaml"))
