"""Caches in an object store, against a real S3-protocol server (moto's server mode, started
by the tests on 127.0.0.1): built and published, served bit-identical to the local cache,
read through Lance's object store, and each failure of the store said in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from robocache.data import RobotDataset
from robocache.data.cache import build
from robocache.data.location import Location, store_error
from robocache.errors import DataError

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "panda_multirate"


@pytest.fixture(scope="module")
def published(s3_server, tmp_path_factory):
    """The sample built at 50 Hz straight to s3://BUCKET/panda (its staging directory)."""
    home = tmp_path_factory.mktemp("home")
    uri = f"s3://{s3_server.bucket()}/caches/panda"
    m = build(SAMPLE, uri, rate_hz=50.0, progress=False, device="cpu",
              storage_options=s3_server.options(), staging=home / "staging")
    return uri, Path(m["staging"]), m


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_build_publishes_the_staged_cache_and_again_only_what_is_new(published, s3_server):
    uri, staging, m = published
    assert m["uri"] == uri and m["published"]["skipped"] == 0
    assert Location(uri, s3_server.options()).exists("manifest.json")
    again = build(SAMPLE, uri, rate_hz=50.0, progress=False, device="cpu",
                  storage_options=s3_server.options(), staging=staging)
    assert again["counts"]["skipped"] == again["counts"]["cached"]  # resumed: nothing new
    assert again["published"]["files"] == 2  # the stats and the manifest, written again
    with pytest.raises(DataError, match="does not continue"):  # another staging directory
        build(SAMPLE, uri, rate_hz=50.0, progress=False, device="cpu",
              storage_options=s3_server.options(), staging=staging.parent / "elsewhere")


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_remote_cache_serves_the_local_caches_items(published, s3_server, in_memory):
    uri, staging, _ = published
    remote = RobotDataset(uri, history=2, horizon=4, storage_options=s3_server.options(),
                          in_memory=in_memory)
    local = RobotDataset(staging, history=2, horizon=4)
    assert len(remote) == len(local) and remote.image_keys
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        idx = torch.randint(len(local), (24,), generator=g)
        assert same(remote[idx], local[idx])


def test_spawn_workers_read_the_remote_frames(published, s3_server):
    uri, staging, _ = published
    remote = RobotDataset(uri, history=2, storage_options=s3_server.options())
    local = RobotDataset(staging, history=2)
    loader = torch.utils.data.DataLoader(remote, batch_size=8, num_workers=2,
                                         multiprocessing_context="spawn",
                                         sampler=range(0, len(remote), 37))
    for b, idx in zip(loader, torch.arange(0, len(remote), 37).split(8), strict=True):
        assert same(b, torch.utils.data.default_collate([local[int(i)] for i in idx]))


def test_the_cli_builds_to_a_uri_with_credentials_from_the_environment(s3_server, tmp_path,
                                                                      monkeypatch):
    bucket = s3_server.bucket()
    creds = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
             "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
             "ROBOCACHE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "robocache.cli", "ingest", str(SAMPLE), f"s3://{bucket}/p",
           "--rate", "25", "--json", "--no-progress"]
    r = subprocess.run(cmd, env={**os.environ, **creds}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["uri"] == f"s3://{bucket}/p" and m["published"]["files"] > 2
    assert Path(m["staging"]).is_relative_to(tmp_path / "staging")
    ds = RobotDataset(f"s3://{bucket}/p", keys=["action"], storage_options=s3_server.options())
    assert len(ds) == m["counts"]["rows"]
    # the refusals in this process, with the same environment (a process each cost 4-5 s)
    from typer.testing import CliRunner

    from robocache.cli import app

    for name, value in creds.items():
        monkeypatch.setenv(name, value)
    for args, match in [(["s3://no-such-bucket-rc/p"], "bucket 'no-such-bucket-rc' does not "
                                                       "exist"),
                        ([f"s3://{bucket}/p", "--storage-option", "nokey"], "KEY=VALUE")]:
        r = CliRunner().invoke(app, ["ingest", str(SAMPLE), *args, "--rate", "25"])
        assert r.exit_code == 2 and match in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_missing_bucket_prefix_or_object_is_named(published, s3_server):
    opts = s3_server.options()
    with pytest.raises(DataError, match="bucket 'rc-none-x' does not exist"):
        RobotDataset("s3://rc-none-x/c", storage_options=opts)
    uri = f"s3://{published[0].split('/')[2]}/nothing/here"
    with pytest.raises(FileNotFoundError, match=f"{uri} is not a RoboCache cache"):
        RobotDataset(uri, storage_options=opts)
    with pytest.raises(DataError, match="unknown storage scheme 'ftp'"):
        RobotDataset("ftp://host/c")
    with pytest.raises(DataError, match="names no bucket"):
        RobotDataset("s3:///c", storage_options=opts)


def test_refused_credentials_are_said(tmp_path):
    """A server that checks signatures (moto with IAM on after its first actions): the
    cache's objects with keys it does not know are one line about the credentials."""
    pytest.importorskip("moto", reason="needs moto's server: pip install 'moto[server]'")
    import boto3
    from s3server import S3Server

    # read by the server started next: its readiness probe and the 3 IAM calls go unchecked
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"
    try:
        server = S3Server(tmp_path / "moto.log")
    finally:
        del os.environ["INITIAL_NO_AUTH_ACTION_COUNT"]
    try:
        iam = boto3.client("iam", endpoint_url=server.endpoint, aws_access_key_id="a",
                           aws_secret_access_key="a", region_name="us-east-1")
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        good = {**server.options(), "aws_access_key_id": key["AccessKeyId"],
                "aws_secret_access_key": key["SecretAccessKey"]}
        s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=good["aws_access_key_id"],
                          aws_secret_access_key=good["aws_secret_access_key"])
        s3.create_bucket(Bucket="locked")
        s3.put_object(Bucket="locked", Key="c/manifest.json", Body=b"{}")
        assert Location("s3://locked/c", good).read_text("manifest.json") == "{}"
        for bad in ({**good, "aws_secret_access_key": "wrong"},
                    {**good, "aws_access_key_id": "AKIAUNKNOWN"}):
            with pytest.raises(DataError, match="s3://locked/c.*refused the credentials"):
                RobotDataset("s3://locked/c", storage_options=bad)
    finally:
        server.stop()


def test_a_store_that_stops_mid_epoch_is_one_error_not_a_hang(tmp_path):
    """The server stops after the dataset opened: the next batch's frames are retried with
    backoff (the options' short retry budget here), then one error names the URI."""
    from s3server import S3Server

    from robocache.data.publish import publish

    server = S3Server(tmp_path / "moto.log")
    try:
        staged = tmp_path / "c"
        build(SAMPLE, staged, rate_hz=10.0, progress=False, device="cpu")
        uri = f"s3://{server.bucket()}/c"
        opts = {**server.options(), "client_max_retries": "2", "client_retry_timeout": "5",
                "connect_timeout": "1s", "timeout": "5s"}
        publish(staged, Location(uri, opts))
        ds = RobotDataset(uri, keys=["observation.images.front"], storage_options=opts)
        ds[torch.arange(4)]
    finally:
        server.stop()
    t0 = time.monotonic()
    with pytest.raises(DataError, match=f"{uri}/frames/observation.images.front.lance.*"
                                        "did not answer"):
        ds[torch.arange(len(ds) - 8, len(ds))]
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("text,why", [
    ("AWS Error ACCESS_DENIED during HeadObject operation", "refused the credentials"),
    ("<Code>SignatureDoesNotMatch</Code>", "refused the credentials"),
    ("<Code>PermanentRedirect</Code> The bucket you are attempting to access must be "
     "addressed using the specified endpoint", "another region"),
    ("<Code>AuthorizationHeaderMalformed</Code> the region 'us-east-1' is wrong; expecting "
     "'eu-west-1'", "another region"),
    ("<Code>NoSuchBucket</Code>", "bucket does not exist"),
    ("error sending request for url (http://127.0.0.1:1/b): connection refused",
     "did not answer"),
])
def test_store_failures_map_to_one_line_by_cause(text, why):
    """The store's own words for each cause (as S3, MinIO and the AWS SDK word them), to one
    line naming the URI and the fix (a wrong region cannot be produced by the test server,
    which serves every region)."""
    err = store_error("s3://b/c", OSError(text))
    assert str(err).startswith("s3://b/c: ") and why in str(err) and "\n" not in str(err)
