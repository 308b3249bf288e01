"""Run-scoped store credentials, proved with the real parts: STS AssumeRole with npa's session
policy on moto's server with IAM enforced (tests.harness.moto_iam: a role session gets the role's
policies intersected with its session policy, as on AWS), and a stage's real setup and run
scripts (npa.backends.skypilot.tasks, the stage library's AWS CLI calls) run with the scoped
credentials outside a cluster: every request of the run succeeds, and a read or write of a
sibling run (run1 / run10) or of another project's objects is refused with 403.

A stage role STS refuses, or one IAM does not have, stops the launch before anything is written:
the Kubernetes API the backend would write the Secrets to is never reached.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npa.adapters.kube.client import project_namespace
from npa.adapters.kube.secrets import GENERATION_ANNOTATION, STORE_KEY_PREFIX, run_secret_name
from npa.adapters.storage.stage_scope import (
    SCOPED_VARIABLES,
    ScopedCredentials,
    StageRoleRefused,
    assume_stage_role,
    session_policy,
)
from npa.backends import contract
from npa.backends.base import JobSubmission, RunTasks, StageTask, TaskInput, TaskOutput
from npa.backends.skypilot import tasks as sky_tasks
from npa.backends.skypilot.backend import SkyPilotBackend
from npa.core.errors import NpaError
from npa.core.layout import output_key, run_prefix
from npa.core.paths import NpaPaths
from npa.core.templates import templates_dir
from tests.harness import moto_iam
from tests.harness.kube import KubeCluster
from tests.harness.s3 import REGION, S3Server

pytestmark = pytest.mark.integration

ACCOUNT = "123456789012"  # moto's default account
ROLE = f"arn:aws:iam::{ACCOUNT}:role/npa-stage"
STORE = "s3://runs/team"
WORKFLOW, RUN, SIBLING = "wf", "run1", "run10"
INPUT = "s3://datasets/in/"
ALLOW_ALL_S3 = {"Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}  # fmt: skip


def _put(s3: Any, uri: str, body: bytes) -> None:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    s3.put_object(Bucket=bucket, Key=key, Body=body)


def seed(server: S3Server) -> dict[str, str]:
    """Buckets, objects, a submitter and the stage role, while IAM is not enforced; the
    submitter's keys."""
    admin = {"AWS_ACCESS_KEY_ID": "AKIAADMIN", "AWS_SECRET_ACCESS_KEY": "x"}
    s3, iam = moto_iam.client(server, "s3", admin), moto_iam.client(server, "iam", admin)
    for bucket in ("runs", "datasets"):
        s3.create_bucket(Bucket=bucket)
    # The run's committed source (a manifest, its tree, one blob), as submit stages it.
    blob = b"print('hello')\n"
    digest = hashlib.sha256(blob).hexdigest()
    manifest = b'{"files": 1}\n'
    shared = f"{STORE}/{WORKFLOW}/npa-source"
    _put(s3, f"{shared}/blobs/{digest}", blob)
    _put(s3, f"{shared}/trees/{hashlib.sha256(manifest).hexdigest()}.list",
         f"{digest} 644 main.py\n".encode())  # fmt: skip
    for run in (RUN, SIBLING):
        _put(s3, f"{STORE}/{run_prefix(WORKFLOW, run)}/source/manifest.json", manifest)
    _put(s3, f"{INPUT}a.txt", b"input a\n")
    _put(s3, f"{STORE}/{run_prefix(WORKFLOW, SIBLING)}/stages/train/outputs/model/w.txt", b"x")
    _put(s3, f"s3://runs/other-team/{run_prefix(WORKFLOW, RUN)}/source/manifest.json", b"x")
    _put(s3, "s3://datasets/private/secret.txt", b"not this run's")
    keys = {}
    # The submitter, and one who may assume the role but not read it (iam:GetRole).
    for user, actions in (("submitter", ["s3:*", "sts:AssumeRole", "iam:GetRole"]),
                          ("narrow", ["s3:*", "sts:AssumeRole"])):  # fmt: skip
        iam.create_user(UserName=user)
        keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
        iam.put_user_policy(
            UserName=user,
            PolicyName="submit",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": actions, "Resource": "*"}]}),
        )  # fmt: skip
    trust = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "sts:AssumeRole",
        "Principal": {"AWS": [f"arn:aws:iam::{ACCOUNT}:user/{u}" for u in keys]}}]}  # fmt: skip
    iam.create_role(RoleName="npa-stage", AssumeRolePolicyDocument=json.dumps(trust),
                    MaxSessionDuration=7200)  # fmt: skip
    # The role itself may do anything with S3: only the session policy scopes a run's session.
    iam.put_role_policy(RoleName="npa-stage", PolicyName="s3",
                        PolicyDocument=json.dumps(ALLOW_ALL_S3))  # fmt: skip
    nobody = {**trust, "Statement": [{**trust["Statement"][0],
              "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/someone-else"}}]}  # fmt: skip
    iam.create_role(RoleName="not-ours", AssumeRolePolicyDocument=json.dumps(nobody))
    return {f"{u}:{name}": k[field] for u, k in keys.items()
            for name, field in (("AWS_ACCESS_KEY_ID", "AccessKeyId"),
                                ("AWS_SECRET_ACCESS_KEY", "SecretAccessKey"))}  # fmt: skip


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[S3Server, dict[str, str]]]:
    assert shutil.which("aws"), "the AWS CLI is missing from PATH; run: make prepare-test"
    with moto_iam.moto_iam_server() as server:
        users = seed(server)
        moto_iam.enforce(server)
        yield server, users


def _keys(users: dict[str, str], user: str) -> dict[str, str]:
    return {k.split(":", 1)[1]: v for k, v in users.items() if k.startswith(f"{user}:")}


@pytest.fixture
def submitting(
    world: tuple[S3Server, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> tuple[S3Server, dict[str, str]]:
    """The submitting shell: the submitter's keys, STS and IAM at moto (boto3's own variables)."""
    server, users = world
    submitter = _keys(users, "submitter")
    for name, value in {**submitter, "AWS_ENDPOINT_URL_STS": server.endpoint_url,
                        "AWS_ENDPOINT_URL_IAM": server.endpoint_url}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return server, submitter


def _stage() -> tuple[StageTask, RunTasks]:
    prefix = run_prefix(WORKFLOW, RUN)
    task = StageTask(
        stage="train", task_name="t", command="cat $NPA_INPUT_DATA/a.txt > $NPA_OUTPUT_MODEL/w.txt",
        env={}, secrets={}, image="i@sha256:" + "a" * 64, depends_on=[], shards=1, parallel=1,
        waves=1, retries=0, accelerators=None, cpus=None, memory_gib=None, disk_gib=None,
        inputs=[TaskInput(name="data", variable="NPA_INPUT_DATA", uri=INPUT, kind="auto")],
        outputs=[TaskOutput(name="model", variable="NPA_OUTPUT_MODEL", path="model/",
                            kind="prefix", uri=f"{STORE}/{output_key(prefix, 'train', 'model/')}",
                            key=output_key(prefix, "train", "model"))],
        run_as_user=1000, run_as_group=1000, fs_group=1000,
    )  # fmt: skip
    run = RunTasks(workflow=WORKFLOW, run_id=RUN, store=STORE, prefix=prefix,
                   run_root=f"{STORE}/{WORKFLOW}/{RUN}", tasks=[task])  # fmt: skip
    return task, run


def _scoped() -> ScopedCredentials:
    policy = session_policy(STORE, WORKFLOW, RUN, [INPUT])
    return assume_stage_role(ROLE, policy, run_id=RUN, profile=None, region=REGION)


class Node:
    """A task node outside a cluster: the stage library with its fixed folders (/npa, its
    caches) moved under ``tmp``, and the pod's store variables, nothing else of AWS."""

    def __init__(self, tmp: Path, server: S3Server, keys: dict[str, str]) -> None:
        self.tmp = tmp
        (tmp / "home").mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ["PATH"], "HOME": str(tmp / "home"), "TMPDIR": str(tmp),
            "NPA_PHASES": str(tmp / "phases"), "AWS_ENDPOINT_URL_S3": server.endpoint_url,
            "AWS_DEFAULT_REGION": REGION, "NPA_STORE_OUTAGE_SECONDS": "10", **keys,
        }  # fmt: skip

    def moved(self, text: str) -> str:
        """``text`` with the library's folders under ``tmp``: its cache, its own folder
        (/tmp/npa) and the contract's root (/npa, as a path of its own: never the /npa-...
        of a store key)."""
        text = text.replace("/tmp/npa-source", str(self.tmp / "cache"))
        text = text.replace(sky_tasks.LIBRARY_PATH.rsplit("/", 1)[0], str(self.tmp / "lib"))
        return re.sub(rf"(?<![\w.-]){contract.ROOT}(?![\w-])", str(self.tmp / "root"), text)

    def sh(self, script: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", "-c", self.moved(script)], env={**self.env, **env},
                              capture_output=True, text=True, check=False)  # fmt: skip

    def library(self, call: str) -> subprocess.CompletedProcess[str]:
        library = (templates_dir() / sky_tasks.LIBRARY).read_text()
        return self.sh(f"{library}\n{call}")


def _read(node: Node, uri: str) -> subprocess.CompletedProcess[str]:
    return node.library(f"npa_aws s3 cp {uri} -")


def test_a_runs_scoped_session_does_all_its_stage_needs_and_nothing_of_another_run(
    submitting: tuple[S3Server, dict[str, str]], tmp_path: Path
) -> None:
    server, submitter = submitting
    scoped = _scoped()
    assert set(scoped.env) == set(SCOPED_VARIABLES)
    assert scoped.seconds == 7200  # the role's maximum, read with iam:GetRole
    node = Node(tmp_path, server, scoped.env)
    task, run = _stage()
    library = (templates_dir() / sky_tasks.LIBRARY).read_text()
    setup = node.sh(sky_tasks.setup_script(task, run, library))
    assert setup.returncode == 0, setup.stderr
    envs = {k: node.moved(v) for k, v in sky_tasks.wave_envs(task, run, 0).items()}
    ran = node.sh(sky_tasks.run_script(task, run), **envs)
    assert ran.returncode == 0, ran.stderr
    admin = moto_iam.client(server, "s3", submitter)
    out = f"{run_prefix(WORKFLOW, RUN)}/stages/train"
    body = admin.get_object(Bucket="runs", Key=f"team/{out}/outputs/model/w.txt")["Body"].read()
    assert body == b"input a\n"  # fetched the input, ran, uploaded
    listed = admin.list_objects_v2(Bucket="runs", Prefix=f"team/{out}/attempts/")["Contents"]
    assert {o["Key"].rsplit("/", 1)[1] for o in listed} == {
        "wave-0-shard-0", "wave-0-shard-0.attempt-1.json"}  # fmt: skip

    # Beside the run: a sibling run whose id extends this one's, the same run of another
    # project, a dataset the spec does not declare. Each exists (the submitter reads it).
    sibling = f"{STORE}/{run_prefix(WORKFLOW, SIBLING)}"
    elsewhere = [
        f"{sibling}/source/manifest.json",
        f"{sibling}/stages/train/outputs/model/w.txt",
        f"s3://runs/other-team/{run_prefix(WORKFLOW, RUN)}/source/manifest.json",
        "s3://datasets/private/secret.txt",
    ]
    mine = Node(tmp_path / "submitter", server, submitter)
    for uri in elsewhere:
        readable = _read(mine, uri)
        assert readable.returncode == 0, (uri, readable.stderr)
        refused = _read(node, uri)
        assert refused.returncode != 0 and "(403)" in refused.stderr, (uri, refused.stderr)
    local = tmp_path / "x"
    local.write_text("x")
    for uri in [f"{sibling}/stages/train/outputs/model/w.txt", "s3://runs/team/x",
                f"{INPUT}b.txt", f"s3://runs/team/{WORKFLOW}/npa-source/blobs/x"]:  # fmt: skip
        wrote = node.library(f"npa_upload file {local} {uri}")
        assert wrote.returncode == 1 and "AccessDenied" in wrote.stderr, (uri, wrote.stderr)
    # A listing as the library's sync makes it (ListObjectsV2 with a prefix).
    for uri in [f"{sibling}/", f"{STORE}/{WORKFLOW}/", "s3://runs/", "s3://datasets/private/"]:
        listed_elsewhere = node.sh(f"aws s3 ls {uri}")
        assert listed_elsewhere.returncode != 0, uri
        assert "AccessDenied" in listed_elsewhere.stderr, (uri, listed_elsewhere.stderr)
    assert node.sh(f"aws s3 ls {INPUT}").returncode == 0
    deleted = node.library(f"npa_aws s3 rm {STORE}/{out}/outputs/model/w.txt")
    assert "AccessDenied" in deleted.stderr, deleted.stderr  # no delete, even in its own prefix


class _Listener:
    """A TCP port standing in for the Kubernetes API: it counts every connection it gets."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def _backend(tmp: Path, api: _Listener) -> SkyPilotBackend:
    paths = NpaPaths(tmp / ".npa")
    kubeconfig = paths.cluster_kubeconfig("ctx")
    kubeconfig.parent.mkdir(parents=True)
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{api.port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}]}))  # fmt: skip
    return SkyPilotBackend(paths, context="ctx")


@pytest.mark.parametrize(
    ("role", "absent", "fix"),
    [
        (f"arn:aws:iam::{ACCOUNT}:role/not-ours", False,
         "aws iam get-role --role-name not-ours --query Role.AssumeRolePolicyDocument"),
        (f"arn:aws:iam::{ACCOUNT}:role/no-such-role", True,
         "npa configure --project p --stage-role-arn ''"),
    ],
)  # fmt: skip
def test_a_role_sts_refuses_stops_the_launch_before_any_secret_is_written(
    submitting: tuple[S3Server, dict[str, str]], tmp_path: Path, role: str, absent: bool, fix: str
) -> None:
    policy = session_policy(STORE, WORKFLOW, RUN, [INPUT])
    with pytest.raises(StageRoleRefused) as refused:
        assume_stage_role(role, policy, run_id=RUN, profile=None, region=REGION)
    assert refused.value.absent is absent
    api = _Listener()
    submission = JobSubmission(
        job_name="j", project="p", workflow=WORKFLOW, run_id=RUN, store=STORE,
        prefix=run_prefix(WORKFLOW, RUN), order=[], tasks={}, stage_role_arn=role,
        external_inputs=[INPUT], region=REGION,
    )  # fmt: skip
    with pytest.raises(NpaError) as error:
        _backend(tmp_path, api).prepare_launch(submission)
    assert fix in str(error.value.fix), error.value.fix
    assert api.connections == 0  # no Secret, no launch: the API was never asked
    api.sock.close()


def test_a_caller_who_may_not_read_the_role_asks_for_an_hour(
    submitting: tuple[S3Server, dict[str, str]], world: tuple[S3Server, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for name, value in _keys(world[1], "narrow").items():
        monkeypatch.setenv(name, value)
    scoped = _scoped()
    assert scoped.seconds == 3600  # not the role's 7200: iam:GetRole was refused


# --- through a real Kubernetes API: the run's Secret a launch writes ---------------------------

PROJECT = "scoped"
DECLARED = "declared-token-4d9e1b"


def _submission(kube: KubeCluster, generation: int) -> JobSubmission:
    """The run's submission with a stage that declares secret TOKEN (from NPA_TEST_DECLARED)."""
    task, run = _stage()
    task = task.model_copy(update={"secrets": {"TOKEN": "env:NPA_TEST_DECLARED"}})
    run = run.model_copy(update={"tasks": [task]})
    return JobSubmission(
        job_name="j", project=PROJECT, workflow=WORKFLOW, run_id=RUN, store=STORE,
        prefix=run_prefix(WORKFLOW, RUN), order=[task.stage],
        tasks=sky_tasks.encode(run, kube_context=kube.context), stage_role_arn=ROLE,
        external_inputs=[INPUT], region=REGION, generation=generation,
    )  # fmt: skip


def _held(kube: KubeCluster) -> tuple[dict[str, str], str] | None:
    """The run's Secret's values and the launch it was written for; None when there is none."""
    from kubernetes.client.rest import ApiException

    try:
        secret = kube.core().read_namespaced_secret(
            run_secret_name(WORKFLOW, RUN), project_namespace(PROJECT)
        )
    except ApiException as exc:
        assert exc.status == 404, exc
        return None
    values = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
    return values, secret.metadata.annotations[GENERATION_ANNOTATION]


def session_of(values: dict[str, str]) -> dict[str, str]:
    """The role session the run's Secret holds (its ``npa.store.*`` keys), by variable."""
    return {name: values[f"{STORE_KEY_PREFIX}{name}"] for name in SCOPED_VARIABLES}


def scoped_to_the_run(
    server: S3Server, session: dict[str, str], store: str, workflow: str, run: str, other: str
) -> None:
    """``session`` is a session of the stage role for ``run``: on moto_iam it writes under the
    run's prefix of ``store`` and is refused (403) under ``other``'s."""
    from botocore.exceptions import ClientError

    bucket, _, base = store.removeprefix("s3://").partition("/")
    s3 = moto_iam.client(server, "s3", session)
    s3.put_object(Bucket=bucket, Key=f"{base}/{run_prefix(workflow, run)}/x", Body=b"x")
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key=f"{base}/{run_prefix(workflow, other)}/x", Body=b"x")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    # Whose keys they are: the session policy allows no STS call, and the refusal names it.
    with pytest.raises(ClientError) as unnamed:
        moto_iam.client(server, "sts", session).get_caller_identity()
    assert f":assumed-role/npa-stage/npa-{run} is not" in str(unnamed.value), unnamed.value


def test_a_launch_writes_the_runs_session_beside_its_secrets_and_a_resume_a_fresh_one(
    submitting: tuple[S3Server, dict[str, str]], kube: KubeCluster, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """prepare_launch against the kube fixture's API server: the run's Secret holds the declared
    secret and the three ``npa.store.*`` keys of a session of the stage role scoped to the run
    (never the submitter's keys), marked with the launch; a resume's launch (generation 1)
    writes a fresh session; the backend redacts every session value it wrote; the release of
    the resumed launch deletes the Secret."""
    from tests.integration.skypilot_world import ensure_namespace

    server, submitter = submitting
    monkeypatch.setenv("NPA_TEST_DECLARED", DECLARED)
    ensure_namespace(kube, project_namespace(PROJECT))
    paths = NpaPaths(tmp_path / ".npa")
    placed = paths.cluster_kubeconfig(kube.context)
    placed.parent.mkdir(parents=True)
    shutil.copy(kube.kubeconfig, placed)
    sessions = []
    for generation in (0, 1):
        backend = SkyPilotBackend(paths, context=kube.context)
        backend.prepare_launch(_submission(kube, generation))
        held = _held(kube)
        assert held is not None
        values, written_for = held
        assert written_for == str(generation)
        assert set(values) == {"NPA_TEST_DECLARED"} | {
            f"{STORE_KEY_PREFIX}{name}" for name in SCOPED_VARIABLES}  # fmt: skip
        assert values["NPA_TEST_DECLARED"] == DECLARED
        session = session_of(values)
        for earlier in sessions:  # a resume's launch gets a session of its own
            assert all(earlier[name] != session[name] for name in SCOPED_VARIABLES), session
        assert session["AWS_ACCESS_KEY_ID"] != submitter["AWS_ACCESS_KEY_ID"]
        assert submitter["AWS_SECRET_ACCESS_KEY"] not in values.values()
        scoped_to_the_run(server, session, STORE, WORKFLOW, RUN, SIBLING)
        # What SkyPilot says back (an error echoing the pod's environment) loses every value.
        said = backend.redact(" ".join(f"{k}={v}" for k, v in session.items()) + " " +
                              " ".join(session.values()))  # fmt: skip
        for value in session.values():
            assert value not in said, said
        sessions.append(session)
    released = SkyPilotBackend(paths, context=kube.context).release_run(
        PROJECT, WORKFLOW, RUN, 1
    )  # fmt: skip
    assert released == [f"secret/{run_secret_name(WORKFLOW, RUN)}"]
    assert _held(kube) is None
