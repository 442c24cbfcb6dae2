"""Storage credentials as KServe finds them (operator/credentials.py), and the init container they land on: pure.

The ServiceAccount and Secrets here are what `kubectl get -o json` returns for KServe's documented ones
(a Secret's ``stringData`` is ``data`` once stored); the variables are those KServe's credential builder
sets, which ovserve's storage initializer reads (tests/test_storage_s3.py drives it with them).
"""
from __future__ import annotations

import kubernetes_validate
import pytest

from ovserve.operator import credentials, manifests, pods
from ovserve.operator.config import Config
from ovserve.operator.validation import Invalid, validate

from .test_operator_manifests import load

CFG = Config(image="registry.example.com/ovserve:0.1.0")
S3_SECRET = {
    "metadata": {"name": "s3creds", "annotations": {
        "serving.kserve.io/s3-endpoint": "minio.store.svc:9000",
        "serving.kserve.io/s3-usehttps": "0",
        "serving.kserve.io/s3-region": "eu-west-1",
        "serving.kserve.io/s3-verifyssl": "0",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
    }},
    "type": "Opaque",
    "data": {"AWS_ACCESS_KEY_ID": "WFhYWA==", "AWS_SECRET_ACCESS_KEY": "WFhYWFhYWFg="},
}
TOKEN_SECRET = {"metadata": {"name": "sa-token"}, "type": "kubernetes.io/service-account-token",
                "data": {"token": "dA==", "ca.crt": "Yw=="}}


def ref(name: str, secret: str, key: str) -> dict:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def test_a_kserve_s3_secret_becomes_kserves_variables() -> None:
    env = credentials.s3_env({"metadata": {"name": "sa"}, "secrets": [{"name": "s3creds"}]}, [TOKEN_SECRET, S3_SECRET])
    assert env == [
        ref("AWS_ACCESS_KEY_ID", "s3creds", "AWS_ACCESS_KEY_ID"),
        ref("AWS_SECRET_ACCESS_KEY", "s3creds", "AWS_SECRET_ACCESS_KEY"),
        {"name": "S3_USE_HTTPS", "value": "0"},
        {"name": "S3_ENDPOINT", "value": "minio.store.svc:9000"},
        {"name": "AWS_ENDPOINT_URL", "value": "http://minio.store.svc:9000"},
        {"name": "S3_VERIFY_SSL", "value": "0"},
        {"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"},
    ]
    assert "WFhY" not in repr(env)  # values stay in the Secret: the pod refers to them


def test_https_by_default_older_key_names_and_the_secret_winning_over_the_account() -> None:
    account = {"metadata": {"name": "sa", "annotations": {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/s3access",
        "serving.kserve.io/s3-endpoint": "s3.amazonaws.com", "serving.kserve.io/s3-region": "us-east-2",
        "serving.kserve.io/s3-useanoncredential": "false"}}}
    assert credentials.s3_env(account, []) == [
        {"name": "S3_ENDPOINT", "value": "s3.amazonaws.com"},
        {"name": "AWS_ENDPOINT_URL", "value": "https://s3.amazonaws.com"},
        {"name": "awsAnonymousCredential", "value": "false"},
        {"name": "AWS_DEFAULT_REGION", "value": "us-east-2"},
    ]
    older = {"metadata": {"name": "old", "annotations": {"serving.kserve.io/s3-region": "ap-south-1",
                                                          "serving.kserve.io/s3-cabundle": "/etc/ca/bundle.crt"}},
             "data": {"awsAccessKeyID": "eA==", "awsSecretAccessKey": "eQ=="}}
    env = {v["name"]: v for v in credentials.s3_env(account, [older])}
    assert env["AWS_ACCESS_KEY_ID"] == ref("AWS_ACCESS_KEY_ID", "old", "awsAccessKeyID")
    assert env["AWS_SECRET_ACCESS_KEY"] == ref("AWS_SECRET_ACCESS_KEY", "old", "awsSecretAccessKey")
    assert env["AWS_DEFAULT_REGION"]["value"] == "ap-south-1"  # the Secret's
    assert env["AWS_ENDPOINT_URL"]["value"] == "https://s3.amazonaws.com"  # the account's, the Secret has none
    assert env["AWS_CA_BUNDLE"]["value"] == "/etc/ca/bundle.crt"


@pytest.mark.parametrize("account,secrets", [(None, []), ({"metadata": {"name": "default"}}, [TOKEN_SECRET])])
def test_nothing_to_find_is_no_env(account: dict | None, secrets: list[dict]) -> None:
    assert credentials.s3_env(account, secrets) == []


def s3_isvc(account: str | None = "models-reader") -> dict:
    isvc = load("predictor")
    isvc["spec"]["predictor"]["model"]["storageUri"] = "s3://models/resnet"
    if account:
        isvc["spec"]["predictor"]["serviceAccountName"] = account
    return isvc


def test_the_init_container_carries_the_env_and_the_pod_the_account() -> None:
    isvc = s3_isvc()
    spec = validate(isvc)
    assert pods.needs_credentials(spec) and credentials.service_account_name(spec) == "models-reader"
    assert credentials.service_account_name(validate(s3_isvc(None))) == "default"
    env = credentials.s3_env(None, [S3_SECRET])
    children = manifests.children(spec, CFG, storage_access=credentials.storage_access(None, [S3_SECRET]))
    deployment = next(c for c in children if c["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["command"] == ["ovserve", "storage-initializer", "s3://models/resnet", "/mnt/models"]
    assert init["env"] == env and pod["serviceAccountName"] == "models-reader"
    assert "AWS_ACCESS_KEY_ID" not in str(pod["containers"])  # the server never holds the credentials
    kubernetes_validate.validate(deployment, "1.31", strict=True)


def test_other_storage_needs_no_credentials() -> None:
    assert not pods.needs_credentials(validate(load("predictor")))  # https://
    assert not pods.needs_credentials(validate(load("explainer")))  # pvc://
    assert not pods.needs_credentials(validate(load("custom")))  # the user's containers


# -- GCS and the Hugging Face Hub -------------------------------------------------------------

#: KServe's documented GCS Secret (`kubectl create secret generic gcscreds
#: --from-file=gcloud-application-credentials.json=...`) and a Hugging Face token's, as stored
GCS_SECRET = {"metadata": {"name": "gcscreds"}, "type": "Opaque",
              "data": {"gcloud-application-credentials.json": "eyJ0eXBlIjogInNlcnZpY2VfYWNjb3VudCJ9"}}
HF_SECRET = {"metadata": {"name": "hf-secret"}, "type": "Opaque", "data": {"HF_TOKEN": "aGZfeHh4"}}


def isvc_with(uri: str) -> dict:
    isvc = s3_isvc()
    isvc["spec"]["predictor"]["model"]["storageUri"] = uri
    return isvc


def test_a_gcs_key_is_mounted_on_the_init_container_alone_as_kserve_does() -> None:
    """KServe's credential builder: the Secret as volume user-gcp-sa, mounted read-only at /var/secrets/, and
    GOOGLE_APPLICATION_CREDENTIALS naming the key file in it."""
    spec = validate(isvc_with("gs://models/resnet"))
    assert pods.needs_credentials(spec)
    account = {"metadata": {"name": "models-reader"}, "secrets": [{"name": "gcscreds"}]}
    access = credentials.storage_access(account, [TOKEN_SECRET, GCS_SECRET])
    deployment = next(c for c in manifests.children(spec, CFG, storage_access=access) if c["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["command"] == ["ovserve", "storage-initializer", "gs://models/resnet", "/mnt/models"]
    assert init["env"] == [{"name": "GOOGLE_APPLICATION_CREDENTIALS",
                            "value": "/var/secrets/gcloud-application-credentials.json"}]
    assert {"name": "user-gcp-sa", "mountPath": "/var/secrets/", "readOnly": True} in init["volumeMounts"]
    assert {"name": "user-gcp-sa", "secret": {"secretName": "gcscreds"}} in pod["volumes"]
    assert "user-gcp-sa" not in str(pod["containers"])  # the server never holds the key
    assert "eyJ0" not in str(deployment)
    kubernetes_validate.validate(deployment, "1.31", strict=True)


def test_every_kind_of_secret_in_kserves_order_and_one_gcs_key() -> None:
    """An S3 Secret, two GCS keys (the first mounted) and a token: what KServe's builder gives for them,
    whatever the scheme; a Secret holding S3 keys and a GCS key file is an S3 one."""
    both = {"metadata": {"name": "both"}, "data": {"AWS_ACCESS_KEY_ID": "eA==", "AWS_SECRET_ACCESS_KEY": "eQ==",
                                                    "gcloud-application-credentials.json": "e30="}}
    second = {**GCS_SECRET, "metadata": {"name": "gcscreds-2"}}
    access = credentials.storage_access(None, [both, GCS_SECRET, second, HF_SECRET])
    assert [v["name"] for v in access.env] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                               "GOOGLE_APPLICATION_CREDENTIALS", "HF_TOKEN"]
    assert access.volumes == ({"name": "user-gcp-sa", "secret": {"secretName": "gcscreds"}},)
    assert len(access.mounts) == 1
    assert access.env[-1] == ref("HF_TOKEN", "hf-secret", "HF_TOKEN")


def test_a_hugging_face_token_reaches_the_init_container_by_reference() -> None:
    spec = validate(isvc_with("hf://OpenVINO/resnet-ov:main"))
    assert pods.needs_credentials(spec)
    access = credentials.storage_access({"metadata": {"name": "sa"}, "secrets": [{"name": "hf-secret"}]},
                                        [HF_SECRET])
    deployment = next(c for c in manifests.children(spec, CFG, storage_access=access) if c["kind"] == "Deployment")
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"] == ["ovserve", "storage-initializer", "hf://OpenVINO/resnet-ov:main", "/mnt/models"]
    assert init["env"] == [ref("HF_TOKEN", "hf-secret", "HF_TOKEN")]
    kubernetes_validate.validate(deployment, "1.31", strict=True)


def test_the_gcs_volume_name_is_reserved() -> None:
    isvc = isvc_with("gs://models/resnet")
    isvc["spec"]["predictor"]["volumes"] = [{"name": "user-gcp-sa", "emptyDir": {}}]
    with pytest.raises(Invalid, match="reserved by the operator"):
        validate(isvc)
