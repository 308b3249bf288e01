"""Credentials taken out of text npa copies from a run, whoever does the copying.

Two kinds of redaction, applied by :meth:`KnownSecrets.redact` to every text npa stores out of a
run (an insights log tail, a failure detail, a supervisor record):

1. **Known values**: every credential value this machine holds (:func:`known_secrets`), replaced
   by the name of where it came from, ``[REDACTED:env:VAR]``. Only a machine holding the value
   can find it.
2. **Credential shapes** (:func:`redact_shapes`): what looks like a credential wherever it is
   read, so a password a stage printed is gone even when the machine that copies the text never
   held it: private key blocks, URLs with a password, JWTs, well-known token formats, AWS access
   key ids and secret keys, ``Authorization``/``Bearer``/``Basic`` values, and the value of any
   assignment whose name says it holds a secret (``X_TOKEN=v``, ``export X_PASSWORD="v"``,
   ``x_secret: v``, ``"api_key": "v"``, ``--password v``, ``- name: X_TOKEN / value: v``). Such
   a value becomes ``[REDACTED:<shape>]``; the name stays, so a reader still sees what was there.

Image digests (``sha256:<64 hex>``), git commit ids and ordinary words are not credential-shaped
and are kept.
"""

from __future__ import annotations

import base64
import binascii
import configparser
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npa.core.paths import docker_config_path

# Variables whose values are credentials. Their names may be written; their values never.
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "NPA_REGISTRY_PASSWORD",
    "DOCKER_PASSWORD",
    "PULUMI_CONFIG_PASSPHRASE",
    "PULUMI_ACCESS_TOKEN",
    "PGPASSWORD",
)
# Any other variable whose name says it holds a secret.
SECRET_NAME = re.compile(
    r"PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|CREDENTIAL|AUTH|API_?KEY|ACCESS_KEY|PRIVATE_KEY|"
    r"SESSION",
    re.IGNORECASE,
)
# Shorter values would match ordinary text by accident.
MIN_LENGTH = 6
# A credential file named by a variable (PULUMI_CONFIG_PASSPHRASE_FILE, POSTGRES_PASSWORD_FILE)
# is read up to this size; a larger file is not a secret value.
SECRET_FILE_LIMIT = 4096
_AWS_KEYS = ("aws_secret_access_key", "aws_session_token", "aws_access_key_id")
_KUBE_KEYS = ("token", "password", "client-key-data")
_DOCKER_KEYS = ("identitytoken", "registrytoken", "password")


# --- credential shapes ------------------------------------------------------------------------

# The last word of a name that holds a secret (words split at _ - . and camelCase).
_SECRET_WORDS = frozenset(
    [
        "password",
        "passwd",
        "passphrase",
        "pass",
        "pwd",
        "pw",
        "secret",
        "secrets",
        "token",
        "auth",
        "credential",
        "credentials",
        "apikey",
        "cookie",
        "signature",
    ]
)
# The end of a name (its words joined) that holds a secret.
_SECRET_ENDINGS = (
    "password", "passwd", "passphrase", "secret", "token", "apikey", "secretkey", "accesskey",
    "privatekey", "accesskeyid", "keydata", "tokendata", "credential", "credentials", "auth",
)  # fmt: skip
# "<word> key" names that are not secrets (a store's object key, a sort key...).
_PLAIN_KEYS = frozenset(
    [
        "object",
        "s3",
        "cache",
        "sort",
        "partition",
        "primary",
        "foreign",
        "public",
        "hash",
        "row",
        "index",
        "idempotency",
        "dedup",
        "routing",
        "label",
        "metric",
        "lookup",
        "storage",
        "state",
        "group",
        "dict",
        "map",
    ]
)
# Values an assignment to a secret name holds that are no secret themselves.
_NOT_SECRET_VALUES = frozenset(
    [
        "null",
        "none",
        "nil",
        "true",
        "false",
        "undefined",
        "redacted",
        "<redacted>",
        "~",
        "yes",
        "no",
        "required",
        "optional",
    ]
)
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def secret_name(name: str) -> bool:
    """Whether a variable, key, field or flag called ``name`` holds a credential by its name:
    ``REG_PASSWORD``, ``api-token``, ``secretKey``, ``client-key-data``, ``SSH_KEY``; not
    ``max_tokens``, ``secret_name``, ``sort_key``, ``public_key`` or ``author``."""
    words = [w.lower() for w in _NAME_WORDS.findall(name)]
    if not words or "public" in words:
        return False
    last = words[-1]
    if last in _SECRET_WORDS:
        return True
    if last == "key":
        return len(words) > 1 and words[-2] not in _PLAIN_KEYS
    joined = "".join(words)
    return joined.endswith(_SECRET_ENDINGS)


def _secret_value(value: str) -> bool:
    """Whether a value assigned to a secret name is worth hiding (not empty, not a reference to
    a variable or source, not a placeholder or a mark this module left)."""
    bare = value.strip()
    if not bare or bare.lower() in _NOT_SECRET_VALUES or bare.startswith("[REDACTED"):
        return False
    if re.fullmatch(r"\$(?:\w+|\{\w+\})", bare):  # a reference ($X, ${X}); ${X:-v} holds v
        return False
    if set(bare) <= set("*xX.<>-_"):  # a mask or a placeholder: ****, <none>, xxx
        return False
    if re.fullmatch(r"[|>][-+0-9]*", bare):  # a YAML block scalar's header: the value follows
        return False
    if re.fullmatch(r"[A-Z][A-Z_]*(?::[A-Z][A-Z_]*)?", bare) and len(bare) < 40:
        return False  # a placeholder in a hint: PASSWORD, USER:PASSWORD, YOUR_TOKEN
    if bare.isdigit() and len(bare) < 6:  # a count, a port, a flag value
        return False
    # A credential's source by name (env:VAR, file:/path, HOST=env:VAR), as npa itself prints.
    return not re.match(r"(?:[\w.\-:]+=)?(?:env|file):\S", bare)


def _mark(kind: str) -> str:
    return f"[REDACTED:{kind}]"


# A quoted value ("..." with escapes, or '...'), else an unquoted run up to a space, quote, &
# (a shell's or a URL query's separator) or backquote.
_VALUE = r"""(?:"(?P<dq>(?:\\.|[^"\\\n])*)"|'(?P<sq>[^'\n]*)'|(?P<uq>[^\s'"&`]+))"""
# NAME = VALUE, NAME: VALUE, "NAME": "VALUE", 'NAME': 'VALUE', --NAME=VALUE, NAME := VALUE.
_ASSIGNMENT = re.compile(
    r"""(?P<pre>(?<![\w.\-])(?P<kq>["']?)-{0,2}(?P<name>[A-Za-z_][\w.\-]*)(?P=kq)"""
    rf"""[ \t]*(?::=|=>|[:=]|%3[DdAa])[ \t]*){_VALUE}"""
)
# --NAME VALUE (a flag and its value as separate words).
_FLAG = re.compile(rf"(?P<pre>(?<![\w\-])--(?P<name>[A-Za-z][\w.\-]*)[ \t]+)(?!-){_VALUE}")
# NAME VALUE after a word that sets a variable: a Dockerfile's ENV, csh's setenv, `aws configure
# set`; and a .netrc's ``password VALUE``.
_SET_WORDS = re.compile(
    r"(?P<pre>(?:\b(?:ENV|setenv|set|export|declare -x)[ \t]+(?P<name>[A-Za-z_][\w.\-]*)"
    rf"|\blogin[ \t]+\S+[ \t]+(?P<name2>password))[ \t]+)(?!#){_VALUE}"
)
# ``docker login -p VALUE`` and the like (-p is a password there only).
_LOGIN_P = re.compile(rf"(?P<pre>\blogin\b[^\n]*?[ \t]-p[ \t]*){_VALUE}")
# A Kubernetes-style environment entry: name: X_TOKEN / value: V (YAML or JSON).
_NAME_VALUE = re.compile(
    r"""(?P<pre>["']?name["']?[ \t]*[:=][ \t]*["']?(?P<name>[A-Za-z_][\w.\-]*)["']?[ \t]*"""
    rf"""(?:,|\n)[ \t]*-?[ \t]*["']?value["']?[ \t]*[:=][ \t]*){_VALUE}"""
)


# NAME VALUE with white space only, or a few words between (``PASSWORD<TAB>v``, ``token v``,
# ``password is v``): prose follows such names too, so the value must look like a credential
# (see _credential_like).
# The name must hold a fragment of a secret name (_NAME_HINTS): most words of a log are passed
# over by the regex itself, not one by one.
_SPACED = re.compile(
    r"(?P<pre>(?<![\w.\-])(?P<name>(?=[A-Za-z_])(?i:[\w.\-]*?"
    r"(?:pass|secret|token|key|auth|cred|pw|cookie|signature)[\w.\-]*))"
    r"(?:[ \t]+(?:is|was|of|for|set to|now))?[ \t]+)(?P<uq>[^\s'\"`<>]{8,})"
)
# <NAME>VALUE</NAME> (XML, a Maven settings file), and an HTML-ish <NAME>VALUE.
_XML = re.compile(r"(?P<pre><(?P<name>[A-Za-z_][\w.\-]*)(?:\s[^<>]*)?>)(?P<uq>[^<\s]+)")
# A YAML key whose scalar is on the next, indented line (``password:\n  v``, ``token: |\n  v``).
_YAML_NEXT = re.compile(
    r"(?P<pre>(?<![\w.\-])[\"']?(?P<name>[A-Za-z_][\w.\-]*)[\"']?:[ \t]*[|>]?[-+]?[ \t]*\n"
    r"[ \t]+)(?![-#])(?P<uq>[^\s:'\"]+(?=[ \t]*(?:\n|$)))"
)
# A password given with a short flag by the tools that take one so: ``mysql -pV``, ``sshpass -p
# V``; and ``curl -u USER:PASSWORD`` / ``--user USER:PASSWORD`` (the password after the colon).
_SHORT_P = re.compile(
    r"(?P<pre>\b(?:(?:mysql\w*|mariadb\w*|sshpass|mongo\w*)\b[^\n]*?[ \t]-p"
    r"|redis-cli\b[^\n]*?[ \t]-a)[ \t]*)(?!-)" + _VALUE
)
_USER_PASS = re.compile(
    r"(?P<pre>(?<![\w\-])(?:-u|--user|--proxy-user)(?:[ \t]+|=)[\"']?[^\s:\"'@/]+:)"
    r"(?P<uq>[^\s\"']+)"
)
# base64 long enough to hide a credential: decoded and redacted when it holds one (a docker auth
# string "user:password", a .dockerconfigjson, an encoded env file or header).
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/]{12,}={0,2}(?![A-Za-z0-9+/=_\-])")


def _credential_like(value: str) -> bool:
    """A word that reads as a credential, not prose or a path: 8 characters or more, with a
    letter and a digit, and not a path, a URL or a number with a unit."""
    return (
        len(value) >= 8
        and any(c.isalpha() for c in value)
        and any(c.isdigit() for c in value)
        and "/" not in value
        and not value.endswith((":", ",", "."))
        and not re.fullmatch(r"[\d.]+[A-Za-z]{0,3}", value)
    )


def _spaced(text: str) -> str:
    """NAME VALUE with only white space (or a linking word) between: the value goes when the
    name holds a secret and the value reads as a credential; any other name is passed over up to
    its value, which may itself be a name (``export token v``)."""
    out: list[str] = []
    pos = 0
    while (m := _SPACED.search(text, pos)) is not None:
        value = m.group("uq")
        if (
            secret_name(m.group("name"))
            and _credential_like(value)
            and _secret_value(value)
            and not _in_mark(text, m.start())
        ):
            out += [text[pos : m.start("uq")], _mark("secret-value")]
            pos = m.end("uq")
        else:
            out.append(text[pos : m.end("pre")])
            pos = m.end("pre")
    out.append(text[pos:])
    return "".join(out)


def _decoded(blob: str) -> str | None:
    """``blob`` decoded from base64 when it is printable UTF-8 text; None otherwise."""
    try:
        raw = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return text if text.isprintable() or text.replace("\n", "").isprintable() else None


def _base64(m: re.Match[str]) -> str:
    blob = m.group(0)
    if not any(c.isdigit() or c.isupper() for c in blob) or not any(c.islower() for c in blob):
        return blob  # a word, a hex digest: not base64 worth decoding
    text = _decoded(blob)
    if text is None or len(text) < MIN_LENGTH:
        return blob
    user, colon, secret = text.partition(":")
    if colon and re.fullmatch(r"[\w.@+\-]+", user) and " " not in text and _secret_value(secret):
        return _mark("basic-auth")  # user:password, as a docker auth field or Basic header holds
    return _mark("encoded-secret") if redact_shapes(text) != text else blob


def _in_mark(text: str, at: int) -> bool:
    """Whether ``at`` is inside a mark this module left (``[REDACTED:secret:NAME]``)."""
    opened = text.rfind("[REDACTED", 0, at + 1)
    return opened >= 0 and text.find("]", opened) >= at


def _value_of(m: re.Match[str]) -> tuple[str, int, int]:
    found = m.groupdict()
    for group in ("dq", "sq", "uq"):
        if found.get(group) is not None:
            return m.group(group), m.start(group), m.end(group)
    raise AssertionError("a value group always matches")  # pragma: no cover


def _named(pattern: re.Pattern[str], kind: str, check_name: bool = True) -> Callable[[str], str]:
    """Redact the values ``pattern`` finds when its name holds a secret. A name that does not
    is passed over up to its separator only: its value may itself be an assignment
    (``debug: X_TOKEN=v``)."""

    def apply(text: str) -> str:
        out: list[str] = []
        pos = 0
        while (m := pattern.search(text, pos)) is not None:
            value, start, end = _value_of(m)
            found = m.groupdict()
            name = found.get("name") or found.get("name2") or ""
            if (
                (check_name and not secret_name(name))
                or not _secret_value(value)
                or _in_mark(text, m.start())
            ):
                out.append(text[pos : m.end("pre")])
                pos = m.end("pre")
                continue
            out += [text[pos:start], _mark(kind)]
            pos = end
        out.append(text[pos:])
        return "".join(out)

    return apply


_PEM = re.compile(
    r"-----BEGIN (?P<label>[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----"
    r"[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"
)
# base64 of a PEM block (a kubeconfig's client-key-data): "-----BEGIN" encodes to LS0tLS1CRUdJTi.
_PEM_B64 = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/]{16,}={0,2}")
_URL_PASSWORD = re.compile(r"(?i)\b(?P<pre>[a-z][a-z0-9+.\-]*://[^\s/@:'\"\[]*:)[^\s/'\"]+(?=@)")
_URL_TOKEN = re.compile(r"(?i)\b(?P<pre>[a-z][a-z0-9+.\-]*://)(?P<v>[^\s/@:'\"\[]{8,})(?=@)")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{2,}\.[A-Za-z0-9_\-]*")
_TOKEN_FORMATS = re.compile(
    r"(?<![\w\-])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}|glpat-[\w\-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|AIza[\w\-]{35}|hf_[A-Za-z0-9]{30,}"
    r"|sk-(?:proj-|ant-)?[\w\-]{20,}|[sr]k_live_[A-Za-z0-9]{20,}|npm_[A-Za-z0-9]{36}"
    r"|pypi-[\w\-]{50,}|dckr_pat_[\w\-]{20,})"
)
_AWS_KEY_ID = re.compile(
    r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z0-9]{16}"
    r"(?![A-Z0-9])"
)
# An STS session token (AWS_SESSION_TOKEN): base64 of a binary blob whose first bytes are
# fixed by the token's format ("!\n\torigin..." today, "\x17\n\x06er/aws..." before), so it is
# found by its start even where nothing names it (a log echoing the session of a stage role).
_AWS_SESSION_TOKEN = re.compile(
    r"(?<![A-Za-z0-9+/=])(?:IQoJb3JpZ2lu|AgoJb3JpZ2lu|FwoGZXIvYXdz|FQoGZXIvYXdz|AQoDYXdz)"
    r"[A-Za-z0-9+/]{60,}={0,2}"
)
# An AWS secret access key on its own: 40 characters of base64 with upper and lower case and a
# digit (a git commit id is lower-case hex; a path has many slashes).
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AUTHORIZATION = re.compile(
    r"(?i)(?P<pre>\b(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:(?:bearer|basic|token|digest|negotiate|aws4-hmac-sha256)[ \t]+)?)[^\s\"',]+"
)
_SCHEME_TOKEN = re.compile(r"(?i)(?P<pre>\b(?:bearer|basic)[ \t]+)(?P<v>[\w\-.~+/]{8,}=*)")


def _url_token(m: re.Match[str]) -> str:
    """A URL's user part alone is a token when long or credential-like (``https://TOKEN@host``);
    a plain user name (``https://robot@host``) stays."""
    value = m.group("v")
    if len(value) >= 16 or _credential_like(value):
        return m.group("pre") + _mark("url-token")
    return m.group(0)


def _aws_secret(m: re.Match[str]) -> str:
    text = m.group(0)
    shaped = (
        any(c.isupper() for c in text)
        and any(c.islower() for c in text)
        and any(c.isdigit() for c in text)
        and text.count("/") <= 3
    )
    return _mark("aws-secret-key") if shaped else text


def _pem_b64(m: re.Match[str]) -> str:
    text = m.group(0)[:64]
    try:
        head = base64.b64decode(text[: len(text) // 4 * 4])
    except (binascii.Error, ValueError):
        return m.group(0)
    return _mark("private-key") if b"PRIVATE KEY" in head else m.group(0)


def _scheme_token(m: re.Match[str]) -> str:
    value = m.group("v")
    # A token has a digit, base64's or a JWT's punctuation, or length; prose ("Bearer
    # authentication", "Basic max_tokens") has none of them.
    tokenish = len(value) >= 20 or any(c.isdigit() or c in "+/=.~" for c in value)
    if not tokenish or value.startswith("[REDACTED"):
        return m.group(0)
    return m.group("pre") + _mark("authorization")


def _authorization(m: re.Match[str]) -> str:
    value = m.group(0)[len(m.group("pre")) :]
    if value.startswith("[REDACTED"):
        return m.group(0)
    return m.group("pre") + _mark("authorization")


def _sub(
    pattern: re.Pattern[str], replacement: Callable[[re.Match[str]], str]
) -> Callable[[str], str]:
    return lambda text: pattern.sub(replacement, text)


def _when(hints: tuple[str, ...], shape: Callable[[str], str]) -> Callable[[str], str]:
    """``shape``, run only on a text holding one of ``hints`` (lower case): a quick look that
    keeps most log lines away from the slower patterns."""

    def apply(text: str) -> str:
        lower = text.lower()
        return shape(text) if any(h in lower for h in hints) else text

    return apply


_PASSWORD_TOOLS = ("mysql", "mariadb", "sshpass", "mongo", "redis-cli")
# Fragments of every name secret_name accepts.
_NAME_HINTS = ("pass", "secret", "token", "key", "auth", "cred", "pw", "cookie", "signature")

# In order: multi-line blocks first, then shapes that stand alone, then named values (whose
# names a later rule must still see), then AWS secrets (a named value's mark is no secret).
_SHAPES: tuple[Callable[[str], str], ...] = (
    _when(("private key",), _sub(_PEM, lambda m: _mark("private-key"))),
    _when(("ls0tls1crudjti",), _sub(_PEM_B64, _pem_b64)),
    _when(("://",), _sub(_URL_PASSWORD, lambda m: m.group("pre") + _mark("url-password"))),
    _when(("://",), _sub(_URL_TOKEN, _url_token)),
    _when(("eyj",), _sub(_JWT, lambda m: _mark("jwt"))),
    _when(("_", "-"), _sub(_TOKEN_FORMATS, lambda m: _mark("token"))),
    _sub(_AWS_SESSION_TOKEN, lambda m: _mark("aws-session-token")),
    lambda text: _BASE64.sub(_base64, text),
    _sub(_AWS_KEY_ID, lambda m: _mark("aws-access-key-id")),
    _when(("authorization",), _sub(_AUTHORIZATION, _authorization)),
    _when(("bearer", "basic"), _sub(_SCHEME_TOKEN, _scheme_token)),
    _when(("value",), _named(_NAME_VALUE, "secret-variable")),
    _when(("login",), _named(_LOGIN_P, "password", check_name=False)),
    _when(_NAME_HINTS, _named(_FLAG, "secret-flag")),
    _when(_NAME_HINTS, _named(_SET_WORDS, "secret-assignment")),
    _when(_NAME_HINTS, _named(_ASSIGNMENT, "secret-assignment")),
    _when(_NAME_HINTS, _named(_XML, "secret-element")),
    _when(_NAME_HINTS, _named(_YAML_NEXT, "secret-assignment")),
    _when(_NAME_HINTS, _spaced),
    _when(_PASSWORD_TOOLS, _named(_SHORT_P, "password", check_name=False)),
    _when(
        ("-u", "--user", "--proxy-user"),
        _sub(_USER_PASS, lambda m: m.group("pre") + _mark("password")),
    ),
    _sub(_AWS_SECRET, _aws_secret),
)


def redact_shapes(text: str) -> str:
    """``text`` with every credential-shaped value replaced by ``[REDACTED:<shape>]``; base64
    that decodes to a credential (a docker auth string, an encoded config) goes whole."""
    for shape in _SHAPES:
        text = shape(text)
    return text


# --- known values ---------------------------------------------------------------------------


@dataclass
class KnownSecrets:
    """Credential values by the source they came from (``env:VAR``, ``docker-config:...``)."""

    values: dict[str, str] = field(default_factory=dict)
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)

    def add(self, value: Any, source: str) -> None:
        if isinstance(value, str) and len(value.strip()) >= MIN_LENGTH:
            self.values.setdefault(value.strip(), source)
            self._pattern = None

    def add_login(self, user: str, secret: str, source: str) -> None:
        """A user:password pair, also in the base64 form a Basic header or auth field holds."""
        self.add(secret, source)
        if user and secret:
            self.add(base64.b64encode(f"{user}:{secret}".encode()).decode(), source)

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.values.values()))

    def redact(self, text: str) -> str:
        """``text`` with every known value replaced by ``[REDACTED:<source>]``, then every
        credential-shaped value by ``[REDACTED:<shape>]`` (:func:`redact_shapes`)."""
        if not text:
            return text
        if self.values:
            if self._pattern is None:
                ordered = sorted(self.values, key=len, reverse=True)  # longest first: no partial
                self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
            text = self._pattern.sub(lambda m: f"[REDACTED:{self.values[m.group(0)]}]", text)
        return redact_shapes(text)


def _secret_file(found: KnownSecrets, name: str, value: str) -> None:
    """``NAME_FILE=/path`` where NAME holds a secret: the file's content is the credential."""
    path = Path(value)
    try:
        if path.is_file() and path.stat().st_size <= SECRET_FILE_LIMIT:
            found.add(path.read_text("utf-8", errors="replace"), f"file:{name}")
    except OSError:
        return


def _env_secrets(found: KnownSecrets, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if name.endswith("_FILE") and SECRET_NAME.search(name.removesuffix("_FILE")):
            _secret_file(found, name, value)
            continue
        if name in CREDENTIAL_VARIABLES or SECRET_NAME.search(name):
            found.add(value, f"env:{name}")
            user, colon, secret = value.partition(":")
            if colon:  # USER:PASSWORD, as --registry-auth HOST=env:VAR reads it
                found.add_login(user, secret, f"env:{name}")


def _docker_config(found: KnownSecrets, path: Path) -> None:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(data, dict):
        return
    auths = data.get("auths")
    if not isinstance(auths, dict):
        auths = {}
    source = f"docker-config:{path}"
    for entry in auths.values():
        if not isinstance(entry, dict):
            continue
        for key in _DOCKER_KEYS:
            found.add(entry.get(key), source)
        encoded = entry.get("auth")
        found.add(encoded, source)
        if isinstance(encoded, str):
            try:
                user, _, secret = base64.b64decode(encoded).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            found.add_login(user, secret, source)
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            found.add_login(entry["username"], entry["password"], source)
    _docker_helpers(found, data, path)


# A credential helper asked while redacting answers within this many seconds or adds nothing.
HELPER_TIMEOUT = 10.0
_helper_answers: dict[tuple[str, str], tuple[str, str] | None] = {}


def _ask_helper(helper: str, server: str) -> tuple[str, str] | None:
    """(username, secret) ``docker-credential-<helper>`` holds for ``server``, asked the way
    docker asks it (once per process); None when it is not installed or holds nothing."""
    key = (helper, server)
    if key in _helper_answers:
        return _helper_answers[key]
    import shutil
    import subprocess

    from npa.core.procs import run_child

    answer = None
    program = shutil.which(f"docker-credential-{helper}")
    if program is not None:
        try:
            proc = run_child([program, "get"], input=server, timeout=HELPER_TIMEOUT)
            data = json.loads(proc.stdout) if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("Secret"), str):
            answer = (str(data.get("Username") or ""), data["Secret"])
    _helper_answers[key] = answer
    return answer


def _docker_helpers(found: KnownSecrets, data: dict[str, Any], path: Path) -> None:
    """What the credential helpers the Docker config names hold for the hosts it names: a
    ``credHelpers`` host asks its helper, every host under ``auths`` asks ``credsStore``."""
    helpers = data.get("credHelpers")
    asks = [(h, s) for s, h in helpers.items()] if isinstance(helpers, dict) else []
    store, auths = data.get("credsStore"), data.get("auths")
    if isinstance(store, str) and store and isinstance(auths, dict):
        asks += [(store, s) for s in auths]
    for helper, server in asks:
        if isinstance(helper, str) and helper and isinstance(server, str):
            got = _ask_helper(helper, server)
            if got is not None:
                found.add_login(got[0], got[1], f"docker-credential-{helper}:{path}")


def _aws_caches(found: KnownSecrets, home: Path) -> None:
    """Credentials the AWS CLI cached for a profile (assumed roles, SSO): ``~/.aws/cli/cache``
    and ``~/.aws/sso/cache``."""
    for folder in (home / ".aws/cli/cache", home / ".aws/sso/cache"):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                data = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            creds = data.get("Credentials")
            for holder in (data, creds if isinstance(creds, dict) else {}):
                for key in ("SecretAccessKey", "SessionToken", "accessToken", "refreshToken",
                            "clientSecret", "AccessKeyId"):  # fmt: skip
                    found.add(holder.get(key), f"aws-cache:{path}")


def _pgpass(found: KnownSecrets, path: Path) -> None:
    """The passwords of a ``.pgpass`` (host:port:db:user:password per line)."""
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return
    for line in lines:
        if line and not line.startswith("#"):
            found.add(re.split(r"(?<!\\):", line, maxsplit=4)[-1], f"pgpass:{path}")


def _aws_files(found: KnownSecrets, paths: Iterable[Path]) -> None:
    for path in paths:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in parser.sections():
            for key in _AWS_KEYS:
                if parser.has_option(section, key):
                    found.add(parser.get(section, key), f"aws-config:{path}")


def _kubeconfigs(found: KnownSecrets, paths: Iterable[Path]) -> None:
    import yaml

    for path in paths:
        try:
            data = yaml.safe_load(path.read_text("utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            continue
        users = data.get("users") if isinstance(data, dict) else None
        for user in users if isinstance(users, list) else []:
            body = user.get("user") if isinstance(user, dict) else None
            if isinstance(body, dict):
                for key in _KUBE_KEYS:
                    found.add(body.get(key), f"kubeconfig:{path}")


def known_secrets(
    env: Mapping[str, str] | None = None, *, npa_home: Path | None = None
) -> KnownSecrets:
    """Every credential value npa can know of here: secret-named environment variables (and
    USER:PASSWORD pairs in them; a secret-named ``*_FILE`` variable's file, such as
    PULUMI_CONFIG_PASSPHRASE_FILE), the Docker config's registry auths and what the credential
    helpers it names (credHelpers, credsStore) hold for its hosts, the AWS shared credentials
    and config files and the CLI's cached role and SSO credentials (a store's profile), a
    .pgpass, and the tokens and keys of kubeconfigs ($KUBECONFIG, ~/.kube/config, the ones
    provisioning placed under NPA_HOME). Files that cannot be read add nothing."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    found = KnownSecrets()
    _env_secrets(found, env)
    _docker_config(found, docker_config_path(env))
    _aws_files(
        found,
        [
            Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws/credentials"),
            Path(env.get("AWS_CONFIG_FILE") or home / ".aws/config"),
        ],
    )
    _aws_caches(found, home)
    _pgpass(found, Path(env.get("PGPASSFILE") or home / ".pgpass"))
    kubeconfigs = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    kubeconfigs.append(home / ".kube/config")
    if npa_home is not None:
        kubeconfigs += sorted((npa_home / "clusters").glob("*/kubeconfig"))
    _kubeconfigs(found, kubeconfigs)
    return found


def scrub(text: str, *, npa_home: Path | None = None) -> str:
    """``text`` without any credential this machine knows of or any credential-shaped value:
    what every place that stores text copied from a run calls."""
    return known_secrets(npa_home=npa_home).redact(text)
