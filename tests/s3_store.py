"""moto's S3 server on 127.0.0.1 for the tests (test_storage_s3.py, and test_run.py's s3:// run), filled with
a real OpenVINO IR by boto3, then with IAM authentication on: signature v4 checked against the users it holds.
The fixtures ``s3`` and ``ir`` (tests/conftest.py) start it once per session."""
from __future__ import annotations

import io
import logging
import os
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest

from .models import add_one, put_version
from .storage_tools import tar_of

BUCKET = "models"
#: objects under a key with a `..` part; S3 takes any key, the storage initializer must not follow it
EVIL_KEY = "evil/1/../../escape.txt"
BIG = 12 << 20  # over the 8 MiB at which objects come in ranged GETs


def build_ir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    base = tmp_path_factory.mktemp("ir") / "add-one"
    put_version(add_one(), base, 1)
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


class S3:
    """moto's server, its endpoint and the credentials the tests use."""

    def __init__(self, endpoint: str, keys: dict[str, tuple[str, str]]) -> None:
        self.endpoint, self.keys = endpoint, keys
        self.port = int(endpoint.rsplit(":", 1)[1])

    def env(self, user: str = "reader", **extra: str) -> dict[str, str]:
        key, secret = self.keys[user]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_")) and "proxy" not in k.lower()}
        return {**env, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true", **extra}


def start(ir: dict[str, bytes]) -> Iterator[S3]:
    """moto's server, filled; one per test session (its backends are the process's): the conftest fixture.
    Skips the tests that use it where moto (the test extra) is missing."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    setup = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "setup",
             "aws_secret_access_key": "setup"}
    iam = boto3.client("iam", **setup)
    keys = {}
    for user, policy in (("reader", ('{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
                                    '"Action": "s3:*", "Resource": "*"}]}')), ("nobody", None)):
        iam.create_user(UserName=user)
        if policy:
            iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=policy)
        made = iam.create_access_key(UserName=user)["AccessKey"]
        keys[user] = (made["AccessKeyId"], made["SecretAccessKey"])
    keys["wrong-secret"] = (keys["reader"][0], "not-the-secret")
    keys["unknown"] = ("AKIAUNKNOWNUNKNOWN00", "whatever")
    client = boto3.client("s3", **setup)
    client.create_bucket(Bucket=BUCKET)
    for rel, data in ir.items():
        client.put_object(Bucket=BUCKET, Key=f"add-one/{rel}", Body=data)
        client.put_object(Bucket=BUCKET, Key=f"add-one-2/{rel}", Body=data)  # a sibling the prefix must not take
    client.put_object(Bucket=BUCKET, Key="add-one/", Body=b"")  # a folder marker, as consoles make
    client.put_object(Bucket=BUCKET, Key="archives/add-one.tar.gz", Body=tar_of(ir))
    client.put_object(Bucket=BUCKET, Key=EVIL_KEY, Body=b"x")
    client.put_object(Bucket=BUCKET, Key="evil/1/model.xml", Body=b"<net/>")
    big = np.random.default_rng(0).integers(0, 256, BIG, dtype=np.uint8).tobytes()
    from boto3.s3.transfer import TransferConfig
    client.upload_fileobj(io.BytesIO(big), BUCKET, "big/1/model.bin",  # multipart: 3 parts of 5 MiB at most
                          Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    # from here on moto authenticates and authorizes every request (signature v4 against IAM's keys)
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                                  headers={"Content-Type": "text/plain"}))
    yield S3(endpoint, keys)
    server.stop()
