"""Project configuration: record a project alias, and resolve its settings with their sources.

A project alias names where a project's runs live (store, endpoint, region, profile), which
registry holds its images and which kube context runs them. Every resolved value carries the
place it came from — a flag, an environment variable, the config file, or npa's default — so
``npa configure --show`` answers "why is this run writing to *that* bucket?".

Credentials are never recorded or printed: only the *name* of the place they come from.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from npa.adapters.storage import LOCAL, normalize_store_uri
from npa.core.commands import npa_command
from npa.core.emit import PlainResult
from npa.core.errors import InvalidInput, NotFound, StateCorrupt
from npa.core.fsio import atomic_write_json, exclusive_lock, read_json
from npa.core.paths import NpaPaths, check_context_name, safe_component
from npa.core.suggest import closest, unknown

Source = Literal["flag", "env", "file", "aws-config", "default"]

CONFIG_VERSION = 1
DEFAULT_PROJECT = "default"
FIELDS = (
    "store",
    "registry",
    "endpoint_url",
    "region",
    "profile",
    "context",
    "backend_url",
    "stage_role_arn",
)
# Environment variables read for each setting, first match wins.
ENV_VARS: dict[str, tuple[str, ...]] = {
    "store": ("NPA_STORE",),
    "registry": ("NPA_REGISTRY",),
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "profile": ("AWS_PROFILE",),
    "context": ("NPA_CONTEXT",),
    # The pulumi CLI's own variable: a team that exports it gets the same backend in npa.
    "backend_url": ("PULUMI_BACKEND_URL",),
    # None: the role a pod's stage library assumes is the project's choice, recorded or not.
    "stage_role_arn": (),
}
DEFAULTS: dict[str, str | None] = {
    "store": LOCAL,
    "registry": None,
    "endpoint_url": None,
    "region": None,
    "profile": None,
    "context": None,
    "backend_url": None,  # file:// under NPA_HOME
    # The IAM role whose run-scoped credentials a pod's stage library gets (STS AssumeRole with
    # a session policy for the run's prefix and inputs); None: the store Secret's, unscoped.
    "stage_role_arn": None,
}
# An IAM role's ARN (any partition; a path may precede the name).
ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}")
# Environment variables whose presence (never value) says where credentials come from.
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass
class Setting:
    """One resolved value and where it came from (``origin`` names the variable or file)."""

    value: str | None
    source: Source
    origin: str | None = None


@dataclass(kw_only=True)
class ProjectSettings(PlainResult):
    """The resolved configuration of one project alias. Every command resolves one, so these
    results are dataclasses: no command pays pydantic's import for its settings."""

    project: str
    project_id: str | None
    identity: str
    config_file: str
    configured: bool
    settings: dict[str, Setting]
    credentials: str

    def value(self, name: str) -> str | None:
        return self.settings[name].value

    def text_lines(self) -> list[str]:
        where = f"recorded in {self.config_file}" if self.configured else "not configured"
        lines = [f"project: {self.project} (identity {self.identity}; {where})"]
        for name, s in self.settings.items():
            origin = f" {s.origin}" if s.origin else ""
            shown = s.value if s.value is not None else "-"
            lines.append(f"  {name}: {shown}  [{s.source}{origin}]")
        lines.append(f"  credentials: {self.credentials}")
        return lines


@dataclass(kw_only=True)
class ConfigurationView(PlainResult):
    """``npa configure --show``: every project asked for, resolved."""

    projects: list[ProjectSettings]

    def text_lines(self) -> list[str]:
        return [line for p in self.projects for line in p.text_lines()]


@dataclass(kw_only=True)
class Configured(PlainResult):
    """``npa configure --project P ...``: what was recorded."""

    project: str
    project_id: str
    config_file: str
    changed: list[str]
    recorded: dict[str, str | None]

    def text_lines(self) -> list[str]:
        changed = ", ".join(self.changed) if self.changed else "nothing changed"
        lines = [f"project {self.project} recorded in {self.config_file} ({changed})"]
        lines += [f"  {k}: {v if v is not None else '-'}" for k, v in self.recorded.items()]
        lines.append(f"  check with: npa configure --show --project {self.project}")
        return lines


# --- the config file ------------------------------------------------------------------------


def load_config(paths: NpaPaths) -> dict[str, Any]:
    """The config file's contents, or an empty configuration when there is none."""
    path = paths.config_file
    if not path.exists():
        return {"version": CONFIG_VERSION, "projects": {}}
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("projects"), dict):
        raise StateCorrupt(
            f"{path} is not an npa configuration (no 'projects' object)",
            fix=f"mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.broken')}  # keep it "
            "for inspection; npa configure then records projects afresh",
        )
    return data


def credential_source(profile: Setting) -> str:
    """Where the S3 credentials will come from, by name only; values are never looked at."""
    present = [name for name in CREDENTIAL_ENV if os.environ.get(name)]
    if present:
        return f"environment ({', '.join(present)}; values redacted)"
    if profile.value:
        return f"AWS profile {profile.value!r} (shared config/credentials files; values redacted)"
    return "AWS default chain (no credential variables set; values redacted)"


def redact(value: str | None) -> str | None:
    """Hide a user:password part of a URL or registry reference."""
    if value is None:
        return None
    return re.sub(r"(?<=//)[^/@\s]+@|^[^/@\s:]+:[^/@\s]+@", "<redacted>@", value)


def resolve_project(
    project: str | None,
    flags: dict[str, str | None] | None = None,
    *,
    paths: NpaPaths | None = None,
) -> ProjectSettings:
    """Resolve every setting of ``project``: flag, then environment, then file, then default."""
    paths = paths or NpaPaths.from_env()
    alias = safe_component(project or DEFAULT_PROJECT, "project")
    recorded = load_config(paths)["projects"].get(alias)
    entry: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    flags = flags or {}
    settings: dict[str, Setting] = {}
    for name in FIELDS:
        env = next((v for v in ENV_VARS[name] if os.environ.get(v)), None)
        if flags.get(name) is not None:
            settings[name] = Setting(value=flags[name], source="flag", origin=f"--{_flag(name)}")
        elif env is not None:
            settings[name] = Setting(value=os.environ[env], source="env", origin=env)
        elif entry.get(name) is not None:
            settings[name] = Setting(value=str(entry[name]), source="file", origin=None)
        else:
            settings[name] = Setting(value=DEFAULTS[name], source="default")
    for name in ("endpoint_url", "registry", "backend_url"):
        settings[name] = dataclasses.replace(settings[name], value=redact(settings[name].value))
    project_id = entry.get("project_id") if isinstance(entry.get("project_id"), str) else None
    return ProjectSettings(
        project=alias,
        project_id=project_id,
        # An unconfigured alias has no recorded id; its runs are scoped by the alias alone,
        # and configuring it later gives it an id (and a fresh scope) of its own.
        identity=project_id or f"unconfigured:{alias}",
        config_file=str(paths.config_file),
        configured=recorded is not None,
        settings=settings,
        credentials=credential_source(settings["profile"]),
    )


def known_projects(paths: NpaPaths) -> list[str]:
    """Aliases this machine knows: configured ones and those with runs reserved or submitted."""
    names = set(load_config(paths)["projects"])
    for folder in (paths.reservations_dir, paths.submissions_dir):
        if folder.is_dir():
            names.update(p.name for p in folder.iterdir() if p.is_dir())
    return sorted(names)


def require_known_project(settings: ProjectSettings, paths: NpaPaths, *command: str) -> None:
    """A project named on the command line that is neither configured nor has anything on
    this machine is a typo more often than a new project: NotFound, with the nearest alias."""
    known = known_projects(paths)
    if settings.configured or settings.project in known:
        return
    guess = closest(settings.project, known)
    raise NotFound(
        unknown("project", settings.project, known)
        + " (not configured, and no run of it is recorded here)",
        fix=npa_command(*command, "--project", guess)
        if guess
        else npa_command("configure", "--project", settings.project, "--store", LOCAL),
    )


def show(project: str | None, *, paths: NpaPaths | None = None) -> ConfigurationView:
    """``npa configure --show``: the named project, or every configured one."""
    paths = paths or NpaPaths.from_env()
    if project is not None:
        return ConfigurationView(projects=[_with_aws_config(resolve_project(project, paths=paths))])
    names = sorted(load_config(paths)["projects"]) or [DEFAULT_PROJECT]
    return ConfigurationView(
        projects=[_with_aws_config(resolve_project(n, paths=paths)) for n in names]
    )


def _with_aws_config(settings: ProjectSettings) -> ProjectSettings:
    """``settings`` with the endpoint and region the S3 client will take from the AWS
    configuration (the one resolution, ``s3_settings``) where npa's own sources set none, so
    --show never calls a region the profile sets the default."""
    from npa.adapters.storage.s3 import s3_settings

    profile = settings.settings["profile"].value
    try:
        resolved = s3_settings(profile=profile, credentials=False)
    except InvalidInput:
        return settings  # a profile that does not exist: the store says so when opened
    found = {"endpoint_url": resolved.endpoint_url, "region": resolved.region}
    origin = f"profile {profile or 'default'}"
    for name, value in found.items():
        if settings.settings[name].source == "default" and value is not None:
            shown = redact(value) if name == "endpoint_url" else value
            settings.settings[name] = Setting(value=shown, source="aws-config", origin=origin)
    return settings


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _stripped(value: str) -> str:
    """``value`` with any ``user:password@`` taken out."""
    return re.sub(r"(?<=//)[^/@\s]+@|^[^/@\s:]+:[^/@\s]+@", "", value)


def _check(name: str, value: str, paths: NpaPaths, project: str) -> str:
    """Validate one setting before it is recorded; credentials are refused outright."""

    def retry(corrected: str) -> str:
        return npa_command("configure", "--project", project, f"--{_flag(name)}", corrected)

    if redact(value) != value:
        raise InvalidInput(
            f"--{_flag(name)} {redact(value)} carries a credential; npa never records one",
            fix=retry(_stripped(value))
            + "  # credentials come from the environment (AWS_*, PGPASSWORD) or --profile",
        )
    if name == "store":
        return value if value == LOCAL else normalize_store_uri(value, paths, project)
    if name == "endpoint_url":
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            host = value.split("://", 1)[-1].strip().replace(" ", "")
            raise InvalidInput(
                f"--endpoint-url {value!r} is not an http(s) URL",
                fix=retry(f"https://{host}"),
            )
    if name == "registry" and not REGISTRY.fullmatch(value):
        raise InvalidInput(
            f"--registry {value!r} is not HOST[:PORT][/NAMESPACE]",
            fix=retry(guess)
            if (guess := _registry_guess(value))
            else npa_command("configure", "--show", "--project", project),
        )
    if name == "context":
        check_context_name(value)
    if name == "backend_url":
        from npa.adapters.infra.runner import check_backend_url

        check_backend_url(value, fix_argv=["configure", "--project", project, "--backend-url",
                                           f"file://{paths.pulumi_backend}"])  # fmt: skip
    if name in ("profile", "region"):
        safe_component(value, name)
    if name == "stage_role_arn" and value and not ROLE_ARN.fullmatch(value):
        raise InvalidInput(
            f"--stage-role-arn {value!r} is not an IAM role ARN "
            "(arn:aws:iam::<12-digit account>:role/<name>); '' unsets it",
            fix=retry("arn:aws:iam::123456789012:role/npa-stage")
            + "  # your account and role: aws iam list-roles --query 'Roles[].Arn'",
        )
    return value


REGISTRY = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?")


def _registry_guess(value: str) -> str | None:
    """The registry a mistyped value most likely means: no scheme, no tag, a lowercase path."""
    text = value.strip().split("://", 1)[-1].split("@", 1)[0].rstrip("/")
    host, _, path = text.partition("/")
    path = path.rsplit(":", 1)[0] if ":" in path else path
    guess = re.sub(r"[^A-Za-z0-9.:-]", "", host) + (
        "/" + re.sub(r"[^a-z0-9._/-]", "-", path.lower()) if path else ""
    )
    return guess if REGISTRY.fullmatch(guess) else None


def record_project(
    project: str, values: dict[str, str | None], *, paths: NpaPaths | None = None
) -> Configured:
    """Create or update the alias ``project`` with the given settings, under the config lock."""
    paths = paths or NpaPaths.from_env()
    alias = safe_component(project, "project")
    checked: dict[str, str | None] = {
        k: _check(k, v, paths, alias) for k, v in values.items() if v is not None
    }
    if checked.get("stage_role_arn") == "":
        checked["stage_role_arn"] = None  # '' unsets it: stages get the store Secret's again
    with exclusive_lock(paths.lock("config"), timeout=10, purpose="npa configure"):
        config = load_config(paths)
        entry = dict(config["projects"].get(alias) or {})
        changed = [k for k, v in checked.items() if entry.get(k) != v]
        if "project_id" not in entry:
            entry["project_id"] = uuid.uuid4().hex
            entry["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
            changed.insert(0, "created")
        entry.update(checked)
        config["projects"][alias] = entry
        config["version"] = CONFIG_VERSION
        if changed:
            atomic_write_json(paths.config_file, config)
    return Configured(
        project=alias,
        project_id=entry["project_id"],
        config_file=str(paths.config_file),
        changed=changed,
        recorded={k: entry.get(k) for k in FIELDS},
    )


@dataclass
class ChosenContext:
    """The kube context a command acts on, and where the choice came from."""

    name: str
    source: str  # "--context", "spec", "NPA_CONTEXT", "project <alias>", "current-context"


def choose_context(
    flag: str | None,
    *,
    project: str | None = None,
    spec_context: str | None = None,
    kubeconfig: Path | None = None,
    paths: NpaPaths | None = None,
    use_current: bool = True,
) -> ChosenContext | None:
    """The one order every command picks a kube context in: ``--context``, then the spec's
    ``infrastructure.context`` (for commands that read a spec), then the project's configured
    context (``NPA_CONTEXT``, then ``npa configure --context``), then the kubeconfig's
    ``current-context`` (``--kubeconfig``, else ``$KUBECONFIG``, else ~/.kube/config). None
    when none of them names one. Every choice is checked by the one context-name rule.

    ``use_current=False`` stops before the current-context: teardown destroys what was
    provisioned, so it acts only on a context someone named, never on whichever one the
    kubeconfig happens to point at."""
    from npa.adapters.kube import kubeconfig as kube

    chosen: ChosenContext | None = None
    if flag is not None:
        chosen = ChosenContext(name=flag, source="--context")
    elif spec_context is not None:
        chosen = ChosenContext(name=spec_context, source="spec")
    else:
        setting = resolve_project(project, paths=paths).settings["context"]
        if setting.value is not None and setting.source != "default":
            where = setting.origin if setting.source == "env" else f"project {project or 'default'}"
            chosen = ChosenContext(name=setting.value, source=str(where))
    if chosen is None and use_current:
        # A kubeconfig that cannot be read is that file's error, not "no current-context".
        current = kube.merge(kube.source_files(kubeconfig)).current_context
        if current:
            chosen = ChosenContext(name=current, source="current-context")
    if chosen is not None:
        check_context_name(chosen.name)
    return chosen


def no_context_error(command: list[str]) -> InvalidInput:
    """No flag, spec, configuration or current-context names a context for ``command``."""
    return InvalidInput(
        "no kube context: none was given with --context, the project configures none and the "
        "kubeconfig has no current-context",
        fix=shlex.join(["kubectl", "config", "get-contexts", "-o", "name"])
        + f"  # the names {shlex.join([*command, '--context'])} takes",
    )
