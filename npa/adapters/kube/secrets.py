"""The run store's credentials and endpoint, delivered to pods as one Kubernetes Secret.

SkyPilot's jobs controller reads the store (the source a task mounts) and every task pod writes
to it, so both need the store's credentials and, for an S3-compatible store that is not AWS
(MinIO, moto, Nebius), its endpoint. npa never writes those values into a file: it puts them
into a Secret in the project's namespace, straight from the credential source boto3 resolves,
and the pods take them as environment variables (``envFrom``) through SkyPilot's ``pod_config``
(see :mod:`npa.adapters.skypilot.layer`). The task files only name the Secret.

A run whose stages declare ``secrets`` gets a Secret of its own beside it
(:func:`run_secret_name`): ``submit`` fills it from the submitting shell's variables
(:func:`write_run_secret`), the stage's pods take each value by name and key, and it is deleted
when nothing of the run can use it any more (:func:`delete_run_secret`, through
:func:`npa.backends.base.release_ended_run`). Each carries the run it belongs to
(:data:`RUN_ANNOTATION`, :data:`WORKFLOW_ANNOTATION`), so the project's sweep
(:func:`run_secrets`) can ask each one's run for its state, and the launch it was written for
(:data:`GENERATION_ANNOTATION`: 0 for the first submit, N for the N-th resume).

A ``status`` that saw the run final and a ``submit --resume-run`` of the same run may act at
once. The deletion is decided on the Secret as read and made conditional on it
(:func:`delete_run_secret`): a Secret a later launch wrote is kept, and a delete whose Secret
changed after it was read (uid or resourceVersion) is refused by the API server and decided
again on the new one. The write, for its part, creates the Secret again when a release
removed it between its two requests (:func:`write_run_secret`). Whatever the order of the
requests, the Secret a resume wrote survives every release decided on an earlier launch.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npa.adapters.kube.client import REQUEST_TIMEOUT, core_api

SECRET_NAME = "npa-store"
RUN_SECRET_PREFIX = "npa-secrets-"
# Which credential source the Secret was filled from (a source name, never a value).
SOURCE_ANNOTATION = "npa.io/credential-source"
# The run a run's Secret belongs to (its id, never a value): a label where the id is a label
# value, and always the annotations, which hold any id and the run's workflow.
RUN_LABEL = "npa.io/run-id"
RUN_ANNOTATION = "npa.io/run"
WORKFLOW_ANNOTATION = "npa.io/workflow"
GENERATION_ANNOTATION = "npa.io/launch-generation"
#: Where a run's Secret holds the run-scoped store credentials (``npa.store.<VARIABLE>``,
#: :mod:`npa.adapters.storage.stage_scope`): a '.' no variable name has, so no declared
#: secret's key (its source variable's name) is ever one of them.
STORE_KEY_PREFIX = "npa.store."
# A write or delete whose Secret another npa changed between its requests decides again, on
# what it finds then; each change is another launch's, so a few rounds settle it.
_ROUNDS = 5
_MANAGED = {"app.kubernetes.io/managed-by": "npa"}
# A Kubernetes object name (DNS-1123 subdomain) and a label value.
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def run_secret_name(workflow: str, run_id: str) -> str:
    """The name of the Secret that holds one run's declared secrets, in the project's namespace:
    ``npa-secrets-<workflow>-<run id>``, or, when that is no Kubernetes name, the same prefix
    and a digest of both. The one rule: the task files reference it, ``submit`` writes it, the
    run's end and ``cancel`` delete it."""
    name = f"{RUN_SECRET_PREFIX}{workflow}-{run_id}"
    if _OBJECT_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(f"{workflow}/{run_id}".encode()).hexdigest()[:20]
    return f"{RUN_SECRET_PREFIX}{digest}"


@dataclass(frozen=True)
class StoreSecretResult:
    namespace: str
    name: str
    action: str  # created | updated | unchanged
    keys: tuple[str, ...]  # variable names it holds (never their values)
    source: str


class NoStoreCredentials(Exception):
    """boto3 found no credentials for the store."""


def store_environment(
    *, profile: str | None, endpoint_url: str | None, region: str | None
) -> tuple[dict[str, str], str]:
    """The variables a pod needs to reach the store, and the name of their credential source.

    Credentials come from boto3's own chain (environment, the profile, the default files), the
    same one npa itself uses; the values stay in memory.
    """
    import boto3

    session = boto3.Session(profile_name=profile)
    credentials = session.get_credentials()
    if credentials is None:
        raise NoStoreCredentials(
            "no S3 credentials found in the environment, the profile or the default chain"
        )
    frozen = credentials.get_frozen_credentials()
    env = {
        "AWS_ACCESS_KEY_ID": frozen.access_key,
        "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
    }
    if frozen.token:
        env["AWS_SESSION_TOKEN"] = frozen.token
    if endpoint_url:
        # The S3-specific variable: boto3 and the AWS CLI both read it, and it leaves every
        # other AWS service on its default endpoint.
        env["AWS_ENDPOINT_URL_S3"] = endpoint_url
    chosen_region = region or session.region_name
    if chosen_region:
        env["AWS_DEFAULT_REGION"] = chosen_region
        env["AWS_REGION"] = chosen_region
    return env, str(credentials.method)


def _encoded(values: Mapping[str, str]) -> dict[str, str]:
    """A Secret's ``data``: each value base64-encoded, keys in order."""
    return {k: base64.b64encode(v.encode()).decode() for k, v in sorted(values.items())}


def ensure_store_secret(
    kubeconfig: Path,
    context: str,
    namespace: str,
    *,
    profile: str | None,
    endpoint_url: str | None,
    region: str | None,
) -> StoreSecretResult:
    """Create or update the store Secret in ``namespace`` so it holds the current credentials.

    Raises :class:`NoStoreCredentials`, or whatever the Kubernetes client raises (the caller
    reports that with the command that fixes it).
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    env, source = store_environment(profile=profile, endpoint_url=endpoint_url, region=region)
    data = _encoded(env)
    api = core_api(kubeconfig, context)
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=SECRET_NAME,
            namespace=namespace,
            labels=dict(_MANAGED),
            annotations={SOURCE_ANNOTATION: source},
        ),
        type="Opaque",
        data=data,
    )
    try:
        existing: Any = api.read_namespaced_secret(
            SECRET_NAME, namespace, _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        api.create_namespaced_secret(namespace, body, _request_timeout=REQUEST_TIMEOUT)
        action = "created"
    else:
        source_now = (existing.metadata.annotations or {}).get(SOURCE_ANNOTATION)
        if (existing.data or {}) == data and source_now == source:
            action = "unchanged"
        else:
            api.replace_namespaced_secret(
                SECRET_NAME, namespace, body, _request_timeout=REQUEST_TIMEOUT
            )
            action = "updated"
    return StoreSecretResult(namespace, SECRET_NAME, action, tuple(sorted(env)), source)


def write_run_secret(
    kubeconfig: Path,
    context: str,
    namespace: str,
    name: str,
    values: Mapping[str, str],
    *,
    run_id: str,
    workflow: str,
    generation: int,
) -> str:
    """Create or replace the run's Secret ``name`` so it holds exactly ``values`` (key -> value),
    marked with the launch ``generation`` it is written for, in one request each way, so no
    Secret is ever half written; created again when a release deleted it between the two.
    Returns created | updated."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    labels = dict(_MANAGED)
    if _LABEL_VALUE.fullmatch(run_id):
        labels[RUN_LABEL] = run_id
    annotations = {
        RUN_ANNOTATION: run_id,
        WORKFLOW_ANNOTATION: workflow,
        GENERATION_ANNOTATION: str(generation),
    }
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, labels=labels, annotations=annotations
        ),
        type="Opaque",
        data=_encoded(values),
    )
    api = core_api(kubeconfig, context)
    for _ in range(_ROUNDS):
        try:
            api.create_namespaced_secret(namespace, body, _request_timeout=REQUEST_TIMEOUT)
            return "created"
        except ApiException as exc:
            if exc.status != 409:
                raise
        try:
            api.replace_namespaced_secret(name, namespace, body, _request_timeout=REQUEST_TIMEOUT)
            return "updated"
        except ApiException as exc:
            if exc.status != 404:  # deleted since the create found it: create it again
                raise
    raise RuntimeError(f"secret {name} was deleted and created again {_ROUNDS} times meanwhile")


@dataclass(frozen=True)
class RunSecret:
    """A run's Secret as the API server lists it: its name and the run it names (None for a
    Secret written before the annotations, whose id was no label value)."""

    name: str
    run_id: str | None
    workflow: str | None


def run_secrets(kubeconfig: Path, context: str, namespace: str) -> list[RunSecret]:
    """Every run's Secret npa wrote in ``namespace`` (never the store Secret), by name."""
    api = core_api(kubeconfig, context)
    listed: Any = api.list_namespaced_secret(
        namespace,
        label_selector=",".join(f"{k}={v}" for k, v in _MANAGED.items()),
        _request_timeout=REQUEST_TIMEOUT,
    )
    out = []
    for item in listed.items:
        meta = item.metadata
        if not meta.name.startswith(RUN_SECRET_PREFIX):
            continue
        notes, labels = meta.annotations or {}, meta.labels or {}
        run_id = notes.get(RUN_ANNOTATION) or labels.get(RUN_LABEL)
        out.append(RunSecret(meta.name, run_id, notes.get(WORKFLOW_ANNOTATION)))
    return sorted(out, key=lambda r: r.name)


def secret_generation(annotations: Mapping[str, str] | None) -> int:
    """The launch a run's Secret was written for; 0 for one written before npa recorded it."""
    value = (annotations or {}).get(GENERATION_ANNOTATION, "0")
    return int(value) if value.isdigit() else 0


def delete_run_secret(
    kubeconfig: Path, context: str, namespace: str, name: str, generation: int
) -> bool:
    """Delete the run's Secret ``name`` if it was written for launch ``generation`` or an earlier
    one, exactly as read (preconditions on its uid and resourceVersion: one a later launch
    wrote meanwhile is decided again, and kept). True when it was deleted; False when it was
    already gone (deleting twice is no error) or belongs to a later launch."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = core_api(kubeconfig, context)
    for _ in range(_ROUNDS):
        try:
            meta = api.read_namespaced_secret(
                name, namespace, _request_timeout=REQUEST_TIMEOUT
            ).metadata
            if secret_generation(meta.annotations) > generation:
                return False  # a later launch's: it may be in use
            exactly = client.V1Preconditions(uid=meta.uid, resource_version=meta.resource_version)
            api.delete_namespaced_secret(
                name,
                namespace,
                body=client.V1DeleteOptions(preconditions=exactly),
                _request_timeout=REQUEST_TIMEOUT,
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status != 409:  # 409: changed since it was read; decide on the new one
                raise
    raise RuntimeError(f"secret {name} changed {_ROUNDS} times while npa decided on it")
