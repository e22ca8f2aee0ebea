"""The deployment files, checked offline (no cluster, no Docker daemon is reachable in CI).

Kubernetes objects against the Kubernetes schemas (kubernetes-validate, strict: unknown fields
fail); the RayJob against the vendored KubeRay CRD schema with unknown fields rejected; every
``robocache`` command line in them against the CLI's own options; the Dockerfile's basics.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from robocache.cli import app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RAYJOB_SCHEMA = DEPLOY / "schemas" / "kuberay-v1.7.0-rayjob-v1.json"
KUBERNETES = "1.33.0"  # backoffLimitPerIndex is GA from 1.33

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def closed(schema):
    """The schema with ``additionalProperties: false`` wherever an object lists its properties
    and does not say otherwise (how the API server prunes unknown fields, as an error)."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def rayjob_validator():
    schema = closed(json.loads(RAYJOB_SCHEMA.read_text()))
    return jsonschema.Draft7Validator(schema)


def test_rayjob_matches_the_kuberay_crd(rayjob_validator):
    (job,) = documents(DEPLOY / "kuberay" / "rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    errors = sorted(rayjob_validator.iter_errors(job), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    spec = job["spec"]
    for key in ("shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                "backoffLimit"):
        assert key in spec
    (worker,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    pod = worker["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    env = {e["name"] for e in spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert {"ROBOCACHE_SOURCE", "ROBOCACHE_DEST", "PROMETHEUS_PUSHGATEWAY"} <= env


def test_unknown_rayjob_fields_are_rejected(rayjob_validator):
    (job,) = documents(DEPLOY / "kuberay" / "rayjob.yaml")
    for where in (("spec",), ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec")):
        bad = copy.deepcopy(job)
        node = bad
        for key in where:
            node = node[key]
        node["shutdownAfterJobFinish"] = True  # a typo
        assert any("shutdownAfterJobFinish" in e.message
                   for e in rayjob_validator.iter_errors(bad))


def test_kubernetes_objects_validate_strictly():
    docs = documents(DEPLOY / "k8s" / "preprocess-job.yaml")
    assert [d["metadata"]["name"] for d in docs] == ["robocache-shards", "robocache-merge"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    shards, merge = docs
    assert shards["spec"]["completionMode"] == "Indexed"
    assert shards["spec"]["completions"] == shards["spec"]["parallelism"]
    env = {e["name"]: e for e in shards["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ROBOCACHE_SHARDS"]["value"] == str(shards["spec"]["completions"])
    assert merge["spec"]["suspend"] is True
    bad = copy.deepcopy(shards)
    bad["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def command_lines() -> list[list[str]]:
    """Every robocache command line in the manifests, as argv after ``robocache``."""
    (job,) = documents(DEPLOY / "kuberay" / "rayjob.yaml")
    lines = [shlex.split(job["spec"]["entrypoint"])]
    for doc in documents(DEPLOY / "k8s" / "preprocess-job.yaml"):
        c = doc["spec"]["template"]["spec"]["containers"][0]
        lines += [shlex.split(c["args"][0])] if c.get("command") else [["robocache", *c["args"]]]
    return [line[1:] for line in lines]


@pytest.mark.parametrize("argv", command_lines(), ids=lambda a: a[0])
def test_manifest_commands_use_real_options(argv):
    import typer.main

    group = typer.main.get_command(app)
    command = group.commands[argv[0]]
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    flags = [a for a in argv[1:] if a.startswith("--")]
    assert flags and set(flags) <= known, set(flags) - known


def test_dockerfile_basics():
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) == 2 and "runtime" in text.split("CUDA_IMAGE=")[1].splitlines()[0]
    assert "USER 10001" in text and 'ENTRYPOINT ["robocache"]' in text
    assert 'CMD ["info"]' in text and "[data,ray,metrics,video]" in text
