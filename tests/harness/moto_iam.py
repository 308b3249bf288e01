"""moto's server with IAM enforced, and a role session limited by its session policy, as AWS does.

moto 5.2.5 enforces IAM once its no-auth allowance is spent (``INITIAL_NO_AUTH_ACTION_COUNT``,
set at run time through ``/moto-api/reset-auth``), and its STS ``AssumeRole`` keeps the session
policy it was given, but its check of an assumed role's request
(``moto.iam.access_control.IAMRequestBase.check_action_permitted`` with
``AssumedRoleAccessKey.collect_policies``) looks at the role's policies alone: the session
policy is ignored. AWS allows a session request only when the role's policies AND the session
policy allow it. This module adds exactly that to moto, in the server process it starts, and
two things the check needs for S3 listings:

- **the intersection**: after moto's own check passes, a request made with an assumed role's
  keys is refused (403) unless the session policy that role session was created with permits
  it, evaluated by moto's own ``IAMPolicy.is_action_permitted``;
- **``s3:prefix``**: a ListBucket request's ``prefix`` (empty when it has none, which AWS treats
  as the key being absent: a ``StringLike`` on it then fails) is given to that evaluation as
  the ``s3:prefix`` condition key;
- **``StringLike``**: moto evaluates ``StringEquals`` only and passes every other operator;
  ``StringLike`` (``*`` any run of characters, ``?`` one) is added to moto's table of condition
  operations, with IAM's literal forms ``${*}``, ``${?}``, ``${$}``;
- **an Allow whose condition fails does not apply**: moto answers DENIED for such a statement
  (its conditions were written for trust policies), which in a policy of several listing
  statements would let one bucket's condition refuse another's; the session policy is read
  statement by statement, with moto's evaluator, and such a statement counts as not applying.

Everything else is moto's: signatures, the role's policies, trust policies, S3 itself.
:func:`session_permits` is the same evaluation for a test that has a policy and no server.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.harness.procs import free_port, port_is_open, wait_until
from tests.harness.s3 import REGION, S3Server

_LITERALS = {"${*}": "\0", "${?}": "\1", "${$}": "$"}


def string_like(expected: list[str] | str, actual: str) -> bool:
    """IAM's ``StringLike``: any pattern of ``expected`` matches all of ``actual``."""
    for pattern in [expected] if isinstance(expected, str) else expected:
        for literal, mark in _LITERALS.items():
            pattern = pattern.replace(literal, mark)
        regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
        regex = regex.replace("\0", r"\*").replace("\1", r"\?")
        if re.fullmatch(regex, actual, re.DOTALL):
            return True
    return False


def _install_string_like() -> None:
    from moto.iam import policy_conditions

    policy_conditions.CONDITION_OPERATIONS["StringLike"] = string_like


def _condition_values(action: str, path: str) -> dict[str, str]:
    if action != "s3:ListBucket":
        return {}
    prefix = parse_qs(urlparse(path).query).get("prefix", [""])[0]
    return {"s3:prefix": prefix}


def session_permits(policy: dict[str, Any], action: str, resource: str, path: str = "") -> bool:
    """Whether a session ``policy`` permits ``action`` on ``resource`` (``path``: the request's
    path and query, for ``s3:prefix``), by moto's evaluator of each statement, with
    ``StringLike`` added and AWS's rule for an Allow whose condition fails: it does not apply
    (moto answers DENIED for it, which would let one bucket's listing condition refuse
    another's)."""
    from moto.iam.access_control import IAMPolicyStatement, PermissionResult

    _install_string_like()
    values = _condition_values(action, path)
    permitted = False
    for statement in policy["Statement"]:
        result = IAMPolicyStatement(statement).is_action_permitted(
            action, resource, incoming_condition_values=values
        )
        if result == PermissionResult.DENIED and statement["Effect"] != "Allow":
            return False
        permitted = permitted or result == PermissionResult.PERMITTED
    return permitted


def _install_session_policies() -> None:
    """Make moto's check of a request end with the session policy's (the intersection)."""
    from moto.iam.access_control import AssumedRoleAccessKey, IAMRequestBase
    from moto.sts.models import sts_backends

    _install_string_like()
    role_check = IAMRequestBase.check_action_permitted

    def check_action_permitted(self: Any, resource: str) -> None:
        role_check(self, resource)
        key = self._access_key
        if not isinstance(key, AssumedRoleAccessKey):
            return
        for role in sts_backends[key.account_id][key.partition].assumed_roles:
            if role.access_key_id != key._access_key_id or not role.policy:
                continue
            if not session_permits(json.loads(role.policy), self._action, resource, self._path):
                self._raise_access_denied()

    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]


def main(port: int) -> None:
    """Serve moto on 127.0.0.1:``port`` with session policies enforced (once IAM is)."""
    from moto.server import ThreadedMotoServer

    _install_session_policies()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    sys.stdin.read()  # until the test closes it
    server.stop()


@contextlib.contextmanager
def moto_iam_server() -> Iterator[S3Server]:
    """moto in a process of its own (its IAM switch is process-wide), IAM not yet enforced:
    set up users, roles and objects, then :func:`enforce`."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.moto_iam", str(port)], stdin=subprocess.PIPE
    )
    try:
        wait_until(lambda: port_is_open(port), f"moto on 127.0.0.1:{port}")
        yield S3Server(endpoint_url=f"http://127.0.0.1:{port}", port=port)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def enforce(server: S3Server) -> None:
    """From now on every request is authenticated and authorized (moto's ``reset-auth``)."""
    req = urllib.request.Request(
        f"{server.endpoint_url}/moto-api/reset-auth",
        data=b"0",
        method="POST",
        headers={"Content-Type": "text/plain"},  # a form body would not reach moto's handler
    )
    with urllib.request.urlopen(req, timeout=10):
        pass


def client(server: S3Server, service: str, keys: dict[str, str]) -> Any:
    """A boto3 client of ``service`` on the server, with ``keys`` (the pod's variable names)."""
    import boto3

    return boto3.client(
        service,
        endpoint_url=server.endpoint_url,
        region_name=REGION,
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=keys.get("AWS_SESSION_TOKEN"),
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
