"""Credential-shaped text is redacted by its shape, on a machine that never held the value.

Each class is generated (names, values, quoting, separators, surrounding text) rather than
listed, because independent testers try forms this file does not name. What must survive is
generated too: image digests, git commit ids, names that only resemble secret names.
"""

from __future__ import annotations

import base64
import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from npa.core.redaction import known_secrets, redact_shapes, secret_name
from npa.insights.scan import RunFacts, StageFacts, redact_facts
from tests.tiers import examples

pytestmark = pytest.mark.unit

SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# What a password may hold (no white space: an unquoted value ends at one).
PASSWORD_CHARS = string.ascii_letters + string.digits + "!@#%^*()_+-=.,/:;?~[]{}|<>"
SECRET_WORDS = ["PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "TOKEN", "API_KEY", "AUTH",
                "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIALS", "SECRET_KEY", "PWD"]  # fmt: skip
PREFIX_WORDS = ["", "REG", "DB", "CI_DEPLOY", "GITHUB", "HF", "MY_APP", "AWS", "X", "NPA"]


@st.composite
def secret_names(draw: st.DrawFn) -> str:
    """A secret-holding name in one of the spellings programs use."""
    prefix = draw(st.sampled_from(PREFIX_WORDS))
    word = draw(st.sampled_from(SECRET_WORDS))
    words = [w for w in prefix.split("_") + word.split("_") if w]
    style = draw(st.sampled_from(["UPPER_SNAKE", "lower_snake", "kebab", "camel", "dotted"]))
    if style == "UPPER_SNAKE":
        return "_".join(words)
    if style == "lower_snake":
        return "_".join(words).lower()
    if style == "kebab":
        return "-".join(words).lower()
    if style == "dotted":
        return ".".join(words).lower()
    first, *rest = [w.lower() for w in words]
    return first + "".join(w.capitalize() for w in rest)


@st.composite
def secret_values(draw: st.DrawFn, alphabet: str = PASSWORD_CHARS) -> str:
    """A value that is a credential: long enough, with a letter and a digit."""
    body = draw(st.text(alphabet=alphabet, min_size=6, max_size=40))
    value = draw(st.sampled_from(string.ascii_letters)) + body + draw(st.sampled_from("0123456789"))
    assume(not value.startswith(("[REDACTED", "$")))
    return value


def assignment(name: str, value: str, form: str) -> str:
    """``name`` set to ``value`` in the syntax of one kind of file or command line."""
    forms = {
        "env": f"{name}={value}",
        "export-dq": f'export {name}="{value}"',
        "export-sq": f"export {name}='{value}'",
        "yaml": f"{name}: {value}",
        "yaml-dq": f'{name}: "{value}"',
        "ini": f"{name} = {value}",
        "json": json.dumps({name: value, "image": "r/i"}),
        "json-compact": json.dumps({name: value}, separators=(",", ":")),
        "python": repr({name: value, "n": 3}),
        "flag-eq": f"--{name}={value}",
        "flag-space": f"--{name} {value}",
        "docker-env": f"docker run -e {name}={value} img",
        "header": f"{name}: {value}",
        "kube-env": f"env:\n- name: {name}\n  value: {value}",
        "kube-env-json": json.dumps({"name": name, "value": value}),
        "dockerfile": f"ENV {name} {value}",
        "aws-configure": f"aws configure set {name} {value}",
        "declare": f'declare -x {name}="{value}"',
    }
    return forms[form]


FORMS = ["env", "export-dq", "export-sq", "yaml", "yaml-dq", "ini", "json", "json-compact",
         "python", "flag-eq", "flag-space", "docker-env", "header", "kube-env",
         "kube-env-json", "dockerfile", "aws-configure", "declare"]  # fmt: skip
# Forms whose syntax cannot carry every character: a double-quoted value holds no " or \.
QUOTE_SAFE = {"export-dq": '"\\', "yaml-dq": '"\\', "export-sq": "'", "declare": '"\\'}


@SETTINGS
@given(
    name=secret_names(),
    value=secret_values(),
    form=st.sampled_from(FORMS),
    before=st.sampled_from(["", "+ ", "debug: ", "[stage total] ", "2026-12-03T10:00:00Z "]),
    after=st.sampled_from(["", "\n", " # set by CI", "\nnext line"]),
)
def test_a_value_assigned_to_a_secret_name_is_redacted_in_every_syntax(
    name: str, value: str, form: str, before: str, after: str
) -> None:
    assume(not any(c in value for c in QUOTE_SAFE.get(form, "")))
    text = before + assignment(name, value, form) + after
    assume(text.count(value) == 1)
    out = redact_shapes(text)
    assert value not in out, out
    assert "[REDACTED:" in out
    assert name in out  # what was there is still said
    assert redact_shapes(out) == out  # a second pass changes nothing


@SETTINGS
@given(
    key_id=st.text(alphabet=string.ascii_uppercase + string.digits, min_size=16, max_size=16),
    prefix=st.sampled_from(["AKIA", "ASIA"]),
    secret=st.text(alphabet=string.ascii_letters + string.digits + "/+", min_size=40, max_size=40),
    around=st.sampled_from([("", ""), ("key ", " used"), ("(", ")"), ('"', '"'), ("=", ";")]),
)
def test_aws_keys_are_redacted_standing_alone(
    key_id: str, prefix: str, secret: str, around: tuple[str, str]
) -> None:
    assume(any(c.isupper() for c in secret) and any(c.islower() for c in secret))
    assume(any(c.isdigit() for c in secret) and secret.count("/") <= 3)
    left, right = around
    text = f"{left}{prefix}{key_id}{right} and {left}{secret}{right}"
    out = redact_shapes(text)
    assert prefix + key_id not in out and secret not in out, out


# The fixed first bytes of STS session tokens: the current format's ("!\n\torigin" and a region
# tag follow), the earlier ones' (moto's STS hands out the "\x15\n\x06er/aws" form).
TOKEN_STARTS = [
    b"!\n\torigin",
    b"\x02\n\torigin",
    b"\x17\n\x06er/aws",
    b"\x15\n\x06er/aws",
    b"\x01\n\x03aws",
]


@SETTINGS
@given(
    start=st.sampled_from(TOKEN_STARTS),
    body=st.binary(min_size=60, max_size=700),
    around=st.sampled_from([("", ""), ("token ", " expired"), ("(", ")"), ('"', '"'), (" ", ".")]),
)
def test_an_sts_session_token_is_redacted_where_nothing_names_it(
    start: bytes, body: bytes, around: tuple[str, str]
) -> None:
    """A stage role's session (docs/spec.md "Store credentials") is held by submit, not by every
    process that later reads what SkyPilot says: its token must go by its shape alone."""
    token = base64.b64encode(start + body).decode()
    left, right = around
    out = redact_shapes(f"An error occurred: {left}{token}{right}")
    assert token not in out and token[:40] not in out and "[REDACTED:aws-session-token]" in out


HEADER_FORMS = ["Authorization: {s} {t}", "authorization={s} {t}", '-H "Authorization: {s} {t}"',
                '{{"Authorization": "{s} {t}"}}', "using {s} {t} now",
                "Proxy-Authorization: {s} {t}"]  # fmt: skip
TOKEN_CHARS = string.ascii_letters + string.digits + "-._~+/"


@SETTINGS
@given(
    token=st.text(alphabet=TOKEN_CHARS, min_size=8, max_size=80),
    scheme=st.sampled_from(["Bearer", "bearer", "Basic", "BEARER"]),
    form=st.sampled_from(HEADER_FORMS),
)
def test_authorization_values_and_bearer_tokens_are_redacted(
    token: str, scheme: str, form: str
) -> None:
    assume(len(token) >= 20 or any(c.isdigit() or c in "+/=.~" for c in token))
    text = form.format(s=scheme, t=token)
    assume(text.count(token) == 1)
    out = redact_shapes(text)
    assert token not in out, out
    assert scheme in out


@SETTINGS
@given(
    user=st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=12),
    password=secret_values(string.ascii_letters + string.digits + "!$%^*()_+-=.,;~"),
    scheme=st.sampled_from(["https", "http", "postgres", "s3", "git+https", "redis"]),
    host=st.sampled_from(["reg.example.com", "10.0.0.7:5000", "db.internal:5432/app"]),
)
def test_urls_lose_their_password(user: str, password: str, scheme: str, host: str) -> None:
    text = f"pushing to {scheme}://{user}:{password}@{host}/v2/ now"
    assume(text.count(password) == 1)
    out = redact_shapes(text)
    assert password not in out, out
    assert f"{scheme}://{user}:" in out and host in out


@SETTINGS
@given(
    user=st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=12),
    password=secret_values(),
    host=st.sampled_from(["ghcr.io", "registry.example.com:5000", "docker.io"]),
    compact=st.booleans(),
)
def test_docker_auth_strings_are_redacted(
    user: str, password: str, host: str, compact: bool
) -> None:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {host: {"auth": auth, "identitytoken": password}}}
    text = json.dumps(config, separators=(",", ":") if compact else None)
    out = redact_shapes(text)
    assert auth not in out and password not in out, out
    assert json.loads(out)["auths"][host]  # the structure is still readable


@SETTINGS
@given(
    label=st.sampled_from(["RSA ", "EC ", "OPENSSH ", "ENCRYPTED ", ""]),
    body=st.lists(
        st.text(alphabet=string.ascii_letters + string.digits + "+/", min_size=8, max_size=64),
        min_size=1,
        max_size=6,
    ),
    cut=st.booleans(),
)
def test_private_key_blocks_are_redacted_even_when_cut(
    label: str, body: list[str], cut: bool
) -> None:
    end = "" if cut else f"\n-----END {label}PRIVATE KEY-----\nafter"
    text = f"before\n-----BEGIN {label}PRIVATE KEY-----\n" + "\n".join(body) + end
    out = redact_shapes(text)
    for line in body:
        assert line not in out
    assert out.startswith("before\n")
    assert out.endswith("" if cut else "after")


@SETTINGS
@given(
    header=st.sampled_from(['{"alg":"HS256","typ":"JWT"}', '{"alg":"RS256"}']),
    claims=st.dictionaries(
        st.sampled_from(["sub", "iss", "exp", "aud"]), st.text(min_size=1, max_size=20)
    ),
    signature=st.binary(min_size=16, max_size=64),
)
def test_jwts_are_redacted(header: str, claims: dict[str, str], signature: bytes) -> None:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    jwt = ".".join([part(header.encode()), part(json.dumps(claims).encode()), part(signature)])
    out = redact_shapes(f"token={jwt}&x=1 and bare {jwt}")
    assert jwt not in out and jwt.split(".")[2] not in out


ORDINARY_WORDS = ["the", "stage", "failed", "token", "secret", "password", "authentication",
                  "bearer", "wave", "retry", "key", "sort", "object", "Basic", "Bearer",
                  "max_tokens", "author"]  # fmt: skip


@SETTINGS
@given(
    hexdigits=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    commit=st.text(alphabet="0123456789abcdef", min_size=40, max_size=40),
    words=st.lists(st.sampled_from(ORDINARY_WORDS), min_size=1, max_size=12),
)
def test_digests_commit_ids_and_ordinary_words_are_kept(
    hexdigits: str, commit: str, words: list[str]
) -> None:
    text = (
        f"image ghcr.io/org/train@sha256:{hexdigits} digest: sha256:{hexdigits}\n"
        f"commit {commit} built\n" + " ".join(words) + "\n"
        "max_tokens: 512 secret_name: npa-store secret_ref: npa-store object key: stages/a.bin "
        "author: Ada token_count: 12 password_file: /run/secrets/pw "
        "--registry-auth ghcr.io=env:GHCR_IO_AUTH credential_source: env:GHCR_IO_AUTH "
        "public_key: ssh-ed25519 https://example.com/v2/ s3://bucket/prefix/npa-workflow"
    )
    assert redact_shapes(text) == text


@SETTINGS
@given(
    password=secret_values(string.ascii_letters + string.digits + "!%^*()_+-=.,;~@#"),
    tool=st.sampled_from(["docker", "podman", "helm registry", "oras"]),
    user=st.sampled_from(["-u robot ", "--username robot ", ""]),
    form=st.sampled_from(["-p {p}", "-p={p}", "--password {p}", "--password={p}",
                          "-p '{p}'", '--password "{p}"']),
)  # fmt: skip
def test_login_passwords_on_a_command_line_are_redacted(
    password: str, tool: str, user: str, form: str
) -> None:
    text = f"+ {tool} login {user}{form.format(p=password)} registry.example.com"
    out = redact_shapes(text)
    assert password not in out, out
    assert out.endswith(" registry.example.com")


def test_a_netrc_password_is_redacted() -> None:
    text = "machine registry.example.com login robot password s3cr3t-netrc-pw\n"
    assert redact_shapes(text) == (
        "machine registry.example.com login robot password [REDACTED:secret-assignment]\n"
    )


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("REG_PASSWORD", True), ("api-token", True), ("secretKey", True), ("SSH_KEY", True),
        ("client-key-data", True), ("aws_secret_access_key", True), ("AWS_ACCESS_KEY_ID", True),
        ("identitytoken", True), ("PULUMI_CONFIG_PASSPHRASE", True), ("REG_AUTH", True),
        ("X-Auth-Token", True), ("MYSQL_PWD", True),
        ("max_tokens", False), ("secret_name", False), ("sort_key", False), ("public_key", False),
        ("author", False), ("monkey", False), ("key", False), ("token_count", False),
        ("password_file", False), ("auth_type", False),
    ],
)  # fmt: skip
def test_names_that_hold_secrets(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


def test_insights_redact_shapes_when_the_ingesting_machine_holds_no_credential() -> None:
    """The registry password a stage printed is not in this machine's environment or files:
    its shape alone takes it out of every text insights keeps."""
    leaked = (
        "export REG_PASSWORD='hunter2-Registry-pw'\n"
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJyb2JvdCJ9.c2lnbmF0dXJl\n"
        "aws_access_key_id=AKIAIOSFODNN7EXAMPLE\n"
        "https://robot:pat-9f3a1c77@registry.example.com/v2/\n"
        "image ghcr.io/o/i@sha256:" + "ab" * 32
    )
    facts = RunFacts(
        "wf", "r", "p", "local", "FAILED", "", "", "file:///x", "h",
        {"attempts": [{"detail": leaked}]},
        [StageFacts("one", 0, "FAILED", None, leaked, None, None, None, 1, 1, 0, None, None, 0,
                    log_tails={"k": leaked})],
        {"logs/supervisor.log": leaked},
    )  # fmt: skip
    clean = redact_facts(facts, known_secrets({}))
    for text in (
        clean.stages[0].detail,
        clean.stages[0].log_tails["k"],
        clean.supervisor["attempts"][0]["detail"],
        clean.run_logs["logs/supervisor.log"],
    ):
        assert text is not None
        for secret in ("hunter2-Registry-pw", "c2lnbmF0dXJl", "AKIAIOSFODNN7EXAMPLE",
                       "pat-9f3a1c77"):  # fmt: skip
            assert secret not in text, text
        assert text.endswith("sha256:" + "ab" * 32)


def test_a_passphrase_file_and_a_passphrase_variable_are_known_values(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    passphrase = tmp_path / "passphrase"
    passphrase.write_text("correct horse battery\n")
    env = {
        "HOME": str(tmp_path),
        "PULUMI_CONFIG_PASSPHRASE_FILE": str(passphrase),
        "OTHER_PASSPHRASE": "staple-gun-99",
    }
    found = known_secrets(env)
    out = found.redact("said correct horse battery and staple-gun-99")
    assert out == (
        "said [REDACTED:file:PULUMI_CONFIG_PASSPHRASE_FILE] and [REDACTED:env:OTHER_PASSPHRASE]"
    )


def test_the_supervisor_keeps_no_credential_a_failure_quoted() -> None:
    # A failure detail is copied into the run's manifest in the store; two failures that differ
    # only in the secret they quote still count as the same failure.
    from npa.core.faults import Classification
    from npa.launch.supervision import Policy, count_startup_failure, record
    from npa.runs.manifest import SupervisorRecord

    sup = SupervisorRecord()
    policy = Policy(startup_failure_threshold=2, max_infrastructure_recoveries=3, retries=0)
    for token in ("ghp_" + "a" * 36, "ghp_" + "b" * 36):
        count_startup_failure(
            sup, what="pod", failure=f"pull https://u:{token}@r.example/x", detail=token,
            policy=policy,
        )  # fmt: skip
    record(sup, what="launch", failure="AKIAABCDEFGHIJKLMNOP", detail="Bearer abc.def.ghi",
           classification=Classification.TRANSIENT_INFRASTRUCTURE, policy=policy)  # fmt: skip
    kept = sup.model_dump_json()
    assert "ghp_" not in kept and "AKIAABCDEFGHIJKLMNOP" not in kept and "abc.def.ghi" not in kept
    assert sup.attempts[1].recovery == "stopped"  # the second identical failure hit threshold 2


# Forms beyond NAME=VALUE in which programs print a credential: white space between name and
# value, a linking word, XML, a YAML scalar on the next line, percent-encoded separators.
SPACED_FORMS = ["{n}\t{v}", "{n} {v}", "{n} is {v}", "the {n}: {v}", "<{n}>{v}</{n}>",
                '<{n} type="x">{v}</{n}>', "{n}:\n  {v}\n", "{n}: |\n  {v}", "?{n}%3D{v}&x=1",
                "{n} = ${{X:-{v}}}"]  # fmt: skip
CREDENTIAL_CHARS = string.ascii_letters + string.digits + "!#%^*()_+-=.,;~@"


@st.composite
def credential_like(draw: st.DrawFn) -> str:
    """A value that reads as a credential (letters and digits, at least 8 characters)."""
    body = draw(st.text(alphabet=CREDENTIAL_CHARS, min_size=6, max_size=40))
    value = draw(st.sampled_from(string.ascii_letters)) + body + draw(st.sampled_from("0123456789"))
    assume(not value.endswith((":", ",", ".")) and not value.startswith("[REDACTED"))
    return value


@SETTINGS
@given(name=secret_names(), value=credential_like(), form=st.sampled_from(SPACED_FORMS))
def test_a_credential_after_a_secret_name_goes_in_other_layouts_too(
    name: str, value: str, form: str
) -> None:
    assume("{" not in value and "}" not in value and "<" not in value)
    text = "[stage total] " + form.format(n=name, v=value)
    assume(text.count(value) == 1)
    out = redact_shapes(text)
    assert value not in out, out
    assert redact_shapes(out) == out


@SETTINGS
@given(
    user=st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=12),
    password=credential_like(),
    layout=st.sampled_from(["bare", "json", "yaml", "header", "k8s-secret"]),
)
def test_base64_that_hides_a_credential_goes_whatever_field_holds_it(
    user: str, password: str, layout: str
) -> None:
    """A docker auth string (base64 of user:password) and a .dockerconfigjson (base64 of a
    config holding one) are found by decoding, not by the field's name."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = base64.b64encode(json.dumps({"auths": {"r.example": {"auth": auth}}}).encode())
    blob = {"bare": auth, "json": auth, "yaml": auth, "header": auth, "k8s-secret": config.decode()}
    text = {
        "bare": f"creds {auth} sent",
        "json": json.dumps({"registry": "r.example", "blob": auth}),
        "yaml": f"data:\n  value: {auth}\n",
        "header": f"X-Registry-Auth: {auth}",
        "k8s-secret": f"data:\n  .dockerconfigjson: {config.decode()}\n",
    }[layout]
    out = redact_shapes(text)
    assert blob[layout] not in out and password not in out, out


@SETTINGS
@given(
    password=credential_like(),
    form=st.sampled_from(["mysql -u root -p{p} db", "sshpass -p {p} ssh host",
                          "curl -u robot:{p} https://r.example/v2/", "curl --user robot:{p} x",
                          "https://{p}@github.com/o/r.git", "redis-cli -h h -a {p} ping"]),
)  # fmt: skip
def test_tools_that_take_a_password_on_their_command_line(password: str, form: str) -> None:
    assume("'" not in password and '"' not in password and "@" not in password)
    text = "+ " + form.format(p=password)
    out = redact_shapes(text)
    assert password not in out, out


@SETTINGS
@given(
    run_id=st.builds(
        lambda d, t, h: f"{d}-{t}-{h}",
        st.text(alphabet=string.digits, min_size=8, max_size=8),
        st.text(alphabet=string.digits, min_size=6, max_size=6),
        st.text(alphabet="0123456789abcdef", min_size=6, max_size=6),
    ),
    parts=st.lists(
        st.text(alphabet=string.ascii_lowercase + string.digits + "_-.", min_size=1, max_size=12),
        min_size=1,
        max_size=6,
    ),
    hexdigits=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    count=st.integers(min_value=0, max_value=10**9),
)
def test_run_ids_paths_digests_and_counts_are_not_mangled(
    run_id: str, parts: list[str], hexdigits: str, count: int
) -> None:
    path = "/" + "/".join(parts)
    text = (
        f"run {run_id} wrote s3://bucket/npa/{run_id}/stages/total/outputs{path}\n"
        f"reading {path} ({count} bytes) key: stages/total/logs/wave-0-shard-1.log\n"
        f"pulled ghcr.io/org/img@sha256:{hexdigits} token_count={count} tokens {count}\n"
        f"password reset required; uses Bearer authentication; auth ok for {run_id}\n"
    )
    assert redact_shapes(text) == text


def test_cached_aws_credentials_and_a_pgpass_are_known_values(tmp_path: object) -> None:
    """A store's profile may hold no key in the shared files (an assumed role, SSO): the
    credentials the AWS CLI cached for it are known values too, as is a .pgpass password."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    cache = tmp_path / ".aws/cli/cache"
    cache.mkdir(parents=True)
    (cache / "role.json").write_text(json.dumps({"Credentials": {
        "AccessKeyId": "ASIAEXAMPLEROLE00001", "SecretAccessKey": "plain words role secret",
        "SessionToken": "session-token-value-77"}}))  # fmt: skip
    (tmp_path / ".pgpass").write_text("db.internal:5432:runs:npa:pg pass phrase 9\n")
    found = known_secrets({"HOME": str(tmp_path)})
    out = found.redact("said plain words role secret, session-token-value-77, pg pass phrase 9")
    assert "role secret" not in out and "session-token" not in out and "phrase 9" not in out


def test_an_error_shown_to_the_user_quotes_no_credential(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error may quote the command line to run again or a tool's answer: what it shows
    and what --json prints hold no credential, and the hint's placeholders stay."""
    import io

    monkeypatch.setenv("HOME", str(tmp_path))  # no credential helper of the user's is asked
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)

    from npa.core.emit import emit_error
    from npa.core.errors import InvalidInput

    error = InvalidInput(
        "pip install --index-url https://robot:Zq9vK2mPw7Lx@pypi.example/simple failed",
        fix="export GHCR_IO_AUTH=USER:PASSWORD  # then npa ... --registry-auth ghcr.io=env:X",
        details={"command": "curl -H 'Authorization: Bearer Zq9vK2mPw7Lx' x"},
    )
    for as_json in (False, True):
        out = io.StringIO()
        emit_error(error, as_json=as_json, stream=out)
        assert "Zq9vK2mPw7Lx" not in out.getvalue(), out.getvalue()
        assert "USER:PASSWORD" in out.getvalue() and "env:X" in out.getvalue()
    assert "Zq9vK2mPw7Lx" in error.message  # the error itself is left as it was raised
