"""Storage credentials the way KServe finds them, as the storage initializer's env, volumes and mounts (pure).

KServe's convention (docs/operator.md, "Models on S3"): the predictor's ServiceAccount
(``spec.predictor.serviceAccountName``, else ``default``) lists Secrets; a Secret holding
``AWS_SECRET_ACCESS_KEY`` (or the older ``awsSecretAccessKey``) is an S3 credential. Its keys reach the
init container by reference (``secretKeyRef``: the operator never copies a value into a pod spec), and
its ``serving.kserve.io/s3-*`` annotations become the variables KServe's storage initializer reads, which
ovserve's reads too (server/storage/s3.py). The ServiceAccount's own ``s3-*`` annotations (KServe reads
them beside ``eks.amazonaws.com/role-arn``, IAM roles for service accounts) come first; a Secret's win.

A Secret holding ``gcloud-application-credentials.json`` (and no S3 key) is a GCS service account's key, mounted
read-only at ``/var/secrets/`` in the init container (volume ``user-gcp-sa``) with ``GOOGLE_APPLICATION_CREDENTIALS``
naming the file; one holding ``HF_TOKEN`` (and neither) gives ``HF_TOKEN`` by reference. Each Secret is one kind,
tried in KServe's order (S3, GCS, Hugging Face), whatever the scheme of the storageUri, as KServe's credential
builder does (docs/operator.md, "Models on GCS and the Hugging Face Hub").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .spec import InferenceServiceSpec

PREFIX = "serving.kserve.io/"
#: (access key id, secret access key) key names in a Secret: KServe's shipped configuration, and its older
#: defaults (what its code falls back to without that configuration)
KEY_NAMES = (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), ("awsAccessKeyID", "awsSecretAccessKey"))
#: annotation (after the prefix) -> variable, as KServe's credential builder maps them
ANNOTATIONS = (
    ("s3-verifyssl", "S3_VERIFY_SSL"),
    ("s3-useanoncredential", "awsAnonymousCredential"),
    ("s3-region", "AWS_DEFAULT_REGION"),
    ("s3-usevirtualbucket", "S3_USER_VIRTUAL_BUCKET"),
    ("s3-useaccelerate", "S3_USE_ACCELERATE"),
    ("s3-cabundle", "AWS_CA_BUNDLE"),
)


def annotation_env(annotations: dict[str, Any]) -> list[dict[str, Any]]:
    """The variables ``serving.kserve.io/s3-*`` annotations ask for. ``s3-endpoint`` (host[:port]) gives
    ``S3_ENDPOINT`` and ``AWS_ENDPOINT_URL``, https unless ``s3-usehttps`` is ``"0"``."""
    def get(name: str) -> str | None:
        value = annotations.get(PREFIX + name)
        return None if value is None else str(value)

    env: list[dict[str, Any]] = []
    endpoint, https = get("s3-endpoint"), get("s3-usehttps")
    if endpoint:
        if https is not None:
            env.append({"name": "S3_USE_HTTPS", "value": https})
        env.append({"name": "S3_ENDPOINT", "value": endpoint})
        env.append({"name": "AWS_ENDPOINT_URL", "value": ("http://" if https == "0" else "https://") + endpoint})
    for annotation, variable in ANNOTATIONS:
        value = get(annotation)
        if value:
            env.append({"name": variable, "value": value})
    return env


def secret_env(secret: dict[str, Any]) -> list[dict[str, Any]]:
    """An S3 credential Secret's env (its keys by reference, its annotations' variables); [] for any other."""
    data = secret.get("data") or {}
    name = secret["metadata"]["name"]
    for key_id, key_secret in KEY_NAMES:
        if key_secret in data:
            refs = [{"name": variable, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}
                    for variable, key in (("AWS_ACCESS_KEY_ID", key_id), ("AWS_SECRET_ACCESS_KEY", key_secret))]
            return refs + annotation_env(secret["metadata"].get("annotations") or {})
    return []


def s3_env(service_account: dict[str, Any] | None, secrets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The storage initializer's env for an ``s3://`` model: from the ServiceAccount's annotations, then each
    of its Secrets in the order it lists them; one entry per variable, the last one given winning."""
    merged: dict[str, dict[str, Any]] = {}
    found = annotation_env(((service_account or {}).get("metadata") or {}).get("annotations") or {})
    for secret in secrets:
        found += secret_env(secret)
    for var in found:
        merged.pop(var["name"], None)
        merged[var["name"]] = var
    return list(merged.values())


#: KServe's GCS convention (its credential builder's defaults): the key in the Secret, the volume, where it is mounted
GCS_KEY = "gcloud-application-credentials.json"
GCS_VOLUME = "user-gcp-sa"
GCS_MOUNT = "/var/secrets/"
HF_TOKEN = "HF_TOKEN"


@dataclass(frozen=True)
class StorageAccess:
    """What the predictor's storage initializer gets from its ServiceAccount's Secrets: its ``env`` and
    ``mounts``, and the pod's ``volumes`` they need."""

    env: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()


def storage_access(service_account: dict[str, Any] | None, secrets: list[dict[str, Any]]) -> StorageAccess:
    """The storage initializer's credentials from the ServiceAccount and its Secrets (in the order it lists
    them): S3's as :func:`s3_env`, a GCS key file mounted, a Hugging Face token by reference."""
    env = {var["name"]: var for var in s3_env(service_account, secrets)}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for secret in secrets:
        data, name = secret.get("data") or {}, secret["metadata"]["name"]
        if any(key_secret in data for _, key_secret in KEY_NAMES):
            continue  # an S3 Secret: in s3_env
        if GCS_KEY in data:
            if not volumes:  # one key file, the first Secret's: KServe adds the volume once, by its name
                volumes.append({"name": GCS_VOLUME, "secret": {"secretName": name}})
                mounts.append({"name": GCS_VOLUME, "mountPath": GCS_MOUNT, "readOnly": True})
                env["GOOGLE_APPLICATION_CREDENTIALS"] = {"name": "GOOGLE_APPLICATION_CREDENTIALS",
                                                         "value": GCS_MOUNT + GCS_KEY}
        elif HF_TOKEN in data:
            env.pop(HF_TOKEN, None)
            env[HF_TOKEN] = {"name": HF_TOKEN, "valueFrom": {"secretKeyRef": {"name": name, "key": HF_TOKEN}}}
    return StorageAccess(tuple(env.values()), tuple(volumes), tuple(mounts))


def service_account_name(spec: InferenceServiceSpec) -> str:
    """The predictor's ServiceAccount, as its pods run under it."""
    return spec.predictor.service_account
