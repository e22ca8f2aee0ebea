"""A real S3-protocol server for the tests: moto's server mode on 127.0.0.1."""

from __future__ import annotations

import secrets

import pytest


class S3Server:
    """A real S3-protocol server (moto's server mode) on 127.0.0.1, started by the tests."""

    def __init__(self, log_path):
        import socket
        import subprocess
        import sys

        pytest.importorskip("moto", reason="the S3 tests need moto's server: pip install "
                                           "'moto[server]'")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H",
                                          "127.0.0.1", "-p", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT)
        import time
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).read()
                break
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start (see {log_path})") from e
                time.sleep(0.1)

    def options(self) -> dict[str, str]:
        """Storage options (Lance's names) for this server."""
        return {"aws_endpoint": self.endpoint, "allow_http": "true",
                "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                "aws_region": "us-east-1"}

    def bucket(self) -> str:
        """A new, empty bucket's name."""
        import boto3

        name = f"rc-{secrets.token_hex(6)}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
