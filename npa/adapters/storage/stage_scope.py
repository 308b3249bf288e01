"""Run-scoped store credentials for a pod's stage library: STS AssumeRole with a session policy.

When a project names a stage role (``npa configure --stage-role-arn``), ``submit`` asks STS for
credentials of that role limited by an inline session policy (:func:`session_policy`). AWS
grants a session the intersection of the role's own policies and the session policy, so
whatever the role may do, the stage library of one run may only do what that run needs:

- read, write and list under the run's prefix (:func:`npa.core.layout.run_prefix`, with the
  ``/`` that ends it: ``runs/wf/run1/`` never reaches ``runs/wf/run10/``);
- read and list the source blobs and trees the workflow's runs share
  (:func:`npa.core.layout.shared_source_key`), which the library restores the run's source from;
- read and list each input the spec declares from outside the run, as the library fetches it:
  the object with exactly its key, and the folder under it.

Nothing else: no delete, no other run's prefix, no other key of the bucket. The policy is pure
(the property tests draw it); :func:`assume_stage_role` is the one STS request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from npa.core.layout import run_prefix, shared_source_key

#: What the library does under the run's prefix: read (GetObject, also HEAD), write (PutObject,
#: also each part of a multipart upload), end a multipart upload it gave up on.
RUN_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload")
READ_ACTIONS = ("s3:GetObject",)
#: The pod's variables a role session replaces; the endpoint and region stay the store Secret's.
SCOPED_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: What STS grants a role session when the role's own maximum cannot be read; every role allows
#: it, and it is the ceiling for a session of a role assumed with another role's credentials.
DEFAULT_SECONDS = 3600
# IAM's literal forms of the characters a resource or condition pattern treats as wildcards.
_LITERAL = {"*": "${*}", "?": "${?}", "$": "${$}"}
_SESSION_NAME = re.compile(r"[^A-Za-z0-9+=,.@_-]")


class StageRoleRefused(Exception):
    """STS or IAM refused the stage role (it is absent, or the caller may not assume it)."""

    def __init__(self, message: str, *, absent: bool) -> None:
        super().__init__(message)
        self.absent = absent


class NoCallerCredentials(StageRoleRefused):
    """boto3 found no credentials to ask STS with."""


@dataclass(frozen=True)
class ScopedCredentials:
    """A role session's keys, as the pod's variables, and how long they last."""

    env: dict[str, str]  # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
    seconds: int
    expires: str  # ISO 8601, UTC


def _bucket_key(uri: str) -> tuple[str, str]:
    """Bucket and key of ``s3://bucket/key``, taken as written (a '?' or '#' is the key's, as
    the AWS CLI takes it, never a query)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _literal(key: str) -> str:
    """``key`` as an IAM pattern that matches exactly it (no wildcard of its own)."""
    return "".join(_LITERAL.get(c, c) for c in key)


def _joined(base: str, key: str) -> str:
    return f"{base.rstrip('/')}/{key}" if base.strip("/") else key


def session_policy(store: str, workflow: str, run_id: str, inputs: list[str]) -> dict[str, Any]:
    """The session policy for one run whose store is ``store`` (``s3://bucket[/prefix]``) and
    whose spec declares the external ``inputs`` (``s3://`` URIs)."""
    bucket, base = _bucket_key(store)
    leaf = run_prefix(workflow, run_id)
    run = _literal(_joined(base, leaf)) + "/"
    source = _literal(_joined(base, shared_source_key(leaf))) + "/"
    reads: list[str] = [f"arn:aws:s3:::{bucket}/{source}*"]
    listed: dict[str, list[str]] = {bucket: [f"{run}*", f"{source}*"]}
    for uri in inputs:
        in_bucket, key = _bucket_key(uri)
        literal = _literal(key)
        # A folder when it ends in "/", else the object with exactly that key, else the folder
        # under it (the library decides when it fetches: npa_fetch).
        folder = literal if key.endswith("/") or not key else literal + "/"
        objects = [f"{folder}*"] if folder == literal else [literal, f"{folder}*"]
        reads += [f"arn:aws:s3:::{in_bucket}/{o}" for o in objects]
        listed.setdefault(in_bucket, []).append(f"{folder}*")
    statements: list[dict[str, Any]] = [
        {
            "Sid": "RunPrefix",
            "Effect": "Allow",
            "Action": list(RUN_ACTIONS),
            "Resource": [f"arn:aws:s3:::{bucket}/{run}*"],
        },
        {
            "Sid": "SourceAndInputs",
            "Effect": "Allow",
            "Action": list(READ_ACTIONS),
            "Resource": sorted(set(reads)),
        },
    ]
    for n, (name, prefixes) in enumerate(sorted(listed.items())):
        statements.append(
            {
                "Sid": f"List{n}",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{name}"],
                "Condition": {"StringLike": {"s3:prefix": sorted(set(prefixes))}},
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def session_name(run_id: str) -> str:
    """The role session's name (what CloudTrail shows): ``npa-<run id>``, IAM's characters and
    length."""
    return _SESSION_NAME.sub("-", f"npa-{run_id}")[:64]


def role_name(role_arn: str) -> str:
    """The role's name (the ARN's last path segment), what ``iam get-role`` takes."""
    return role_arn.rsplit("/", 1)[-1]


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _role_seconds(session: Any, role_arn: str, region: str | None) -> int:
    """The longest session the role allows (its MaxSessionDuration), or :data:`DEFAULT_SECONDS`
    when the caller may not read the role."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        role = session.client("iam", region_name=region).get_role(RoleName=role_name(role_arn))
    except ClientError as exc:
        if _code(exc) == "NoSuchEntity":
            raise StageRoleRefused(f"IAM has no role {role_arn}", absent=True) from None
        return DEFAULT_SECONDS
    except BotoCoreError:
        return DEFAULT_SECONDS
    return int(role["Role"].get("MaxSessionDuration") or DEFAULT_SECONDS)


def assume_stage_role(
    role_arn: str,
    policy: dict[str, Any],
    *,
    run_id: str,
    profile: str | None,
    region: str | None,
) -> ScopedCredentials:
    """Credentials of ``role_arn`` limited by ``policy``, for as long as the role allows, from
    the credentials boto3 resolves (the ones the store Secret would hold). STS's endpoint is
    boto3's (``AWS_ENDPOINT_URL_STS``, or the profile's). Raises :class:`StageRoleRefused`."""
    import boto3
    from botocore.exceptions import ClientError

    session = boto3.Session(profile_name=profile)
    if session.get_credentials() is None:
        raise NoCallerCredentials(
            "no S3 credentials found in the environment, the profile or the default chain to "
            f"assume the stage role {role_arn} with",
            absent=False,
        )
    sts = session.client("sts", region_name=region or session.region_name)
    seconds = _role_seconds(session, role_arn, region or session.region_name)
    document = json.dumps(policy, separators=(",", ":"))
    while True:
        try:
            answer = sts.assume_role(
                RoleArn=role_arn,
                RoleSessionName=session_name(run_id),
                Policy=document,
                DurationSeconds=seconds,
            )
            break
        except ClientError as exc:
            code, said = _code(exc), str(exc)
            if code == "ValidationError" and "Duration" in said and seconds > DEFAULT_SECONDS:
                seconds = DEFAULT_SECONDS  # a chained session: an hour at most
                continue
            absent = "NoSuchEntity" in code or "does not exist" in said
            raise StageRoleRefused(
                f"STS refused to assume {role_arn}: {said}", absent=absent
            ) from None
    keys = answer["Credentials"]
    return ScopedCredentials(
        env=dict(
            zip(
                SCOPED_VARIABLES,
                (keys["AccessKeyId"], keys["SecretAccessKey"], keys["SessionToken"]),
                strict=True,
            )
        ),
        seconds=seconds,
        expires=keys["Expiration"].isoformat(),
    )
