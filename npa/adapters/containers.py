"""Container engines (podman or docker), driven through their command-line clients.

The local backend runs a stage in its pinned image when the machine has a working engine, so a
local run exercises the same bytes a cluster pulls. Only the engine's CLI is used: podman needs no
daemon, docker's client talks to its own, and npa imports nothing heavy for either.

Credentials never touch the disk: a pull that needs them hands podman a Docker-format auth file on
its standard input (``--authfile /dev/stdin``). The caller says which registries are plain HTTP
(npa's registry client uses plain HTTP for loopback hosts only).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npa.core.errors import InvalidInput, NpaError, ToolMissing, Unavailable
from npa.core.faults import classify_pull_failure
from npa.core.paths import docker_config_path
from npa.core.procs import run_child

ENGINES = ("podman", "docker")
PROBE_TIMEOUT = 30.0
PULL_TIMEOUT = 900.0
# Label every container npa starts carries, with the run id as its value: what a later process
# uses to find (and remove) containers a killed executor left behind.
RUN_LABEL = "io.npa.run"
# What the OCI runtime says when the host forbids the resource limits podman sets by default (a
# VM whose root lacks CAP_SYS_RESOURCE, with an open-file limit below podman's default): runc
# "error setting rlimit type 7: operation not permitted", crun "setrlimit `RLIMIT_NOFILE`:
# Operation not permitted".
_RLIMIT_REFUSED = re.compile(
    r"(error setting rlimit|setrlimit\b[^\n]*RLIMIT_[A-Z]+)[^\n]*(not permitted|permission denied)",
    re.IGNORECASE,
)
# crun, podman's default OCI runtime, on a host with cgroup v1 hierarchies and a unified mount.
_CRUN_HYBRID = "cgroups in hybrid mode not supported"
RUNC_FIX = (
    "apt-get install -y runc && printf '[engine]\\nruntime = \"runc\"\\n' > "
    "/etc/containers/containers.conf.d/npa-runtime.conf  # with CONTAINERS_CONF set, those "
    "lines go in the file it names"
)
RLIMIT_FIX = (
    "printf '[containers]\\ndefault_ulimits = []\\n' > /etc/containers/containers.conf.d/"
    "npa-ulimits.conf  # with CONTAINERS_CONF set, those lines go in the file it names"
)


# Variables an engine's client reads for itself (where its storage, configuration and daemon
# are): a container's value for one of them is given on the command line, not by name.
CLIENT_VARIABLES = frozenset(
    {
        "HOME",
        "PATH",
        "TMPDIR",
        "XDG_RUNTIME_DIR",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "CONTAINERS_CONF",
        "CONTAINERS_STORAGE_CONF",
        "CONTAINER_HOST",
        "DOCKER_HOST",
        "DOCKER_CONFIG",
        "DOCKER_CONTEXT",
    }
)


# What docker's client would add to every container it creates (the ``proxies`` of its own
# config.json, as HTTP(S)_PROXY, FTP_PROXY, NO_PROXY and ALL_PROXY) and what a client that only
# runs pulled images needs no copy of (its registry credentials).
_DOCKER_CONFIG_DROPPED = ("proxies", "auths", "credsStore", "credHelpers")


def docker_client_config(env: Mapping[str, str], into: Path) -> Path | None:
    """The configuration folder docker's client starts a stage's container with: the user's
    (``$DOCKER_CONFIG`` or ``~/.docker``, read from ``env``), except that its config.json
    loses ``proxies``, which the client would hand to the container as variables the stage
    never declared, and the credentials, which a run of an already pulled image never uses and
    which npa writes nowhere. Every other entry (contexts, plugins) is linked, so the client
    reaches the same daemon. None when the user's config.json has no ``proxies`` (or none that
    docker could read): the client then reads the user's own folder."""
    source = docker_config_path(env)
    try:
        config = json.loads(source.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "proxies" not in config:
        return None
    kept = {k: v for k, v in config.items() if k not in _DOCKER_CONFIG_DROPPED}
    try:
        into.mkdir(mode=0o700, parents=True, exist_ok=True)
        for entry in source.parent.iterdir():
            link = into / entry.name
            if entry.name != "config.json" and not link.is_symlink():
                link.symlink_to(entry)
        partial = into / "config.json.partial"
        partial.write_text(json.dumps(kept, indent=1) + "\n")
        partial.replace(into / "config.json")
    except OSError as exc:
        raise Unavailable(
            f"cannot write docker's client configuration in {into}: {exc.strerror or exc}",
            fix=f"df -h {shlex.quote(str(into.parent))}",
        ) from None
    return into


def client_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment to run :meth:`ContainerEngine.run_argv`'s command in: this process's,
    which the client needs, with the values ``env`` passes by name."""
    return {**os.environ, **{k: v for k, v in env.items() if k not in CLIENT_VARIABLES}}


class ContainerEngineError(Unavailable):
    """The engine could not pull or start an image (exit 4: nothing about the stage is known)."""


@dataclass(frozen=True)
class Mount:
    """A host path bound into the container at ``target``."""

    source: Path
    target: str
    read_only: bool = False

    def flag(self) -> str:
        for value in (str(self.source), self.target):
            if "," in value or "\n" in value:
                raise InvalidInput(
                    f"a container mount path cannot contain ',' or a newline: {value!r}"
                )
        text = f"type=bind,source={self.source},target={self.target}"
        return text + (",readonly" if self.read_only else "")


@dataclass(frozen=True)
class RegistryLogin:
    """A registry host and the username and secret to pull from it as (never shown)."""

    registry: str
    source: str  # where the credential came from, for messages (e.g. env:VAR, file:/path)
    username: str = field(repr=False)
    secret: str = field(repr=False)


def _auth_document(login: RegistryLogin) -> str:
    token = base64.b64encode(f"{login.username}:{login.secret}".encode()).decode()
    return json.dumps({"auths": {login.registry: {"auth": token}}})


@dataclass(frozen=True)
class ContainerEngine:
    """One engine's CLI, proven to work on this machine by :func:`find_engine`."""

    name: str  # podman | docker
    binary: str

    def _call(
        self, args: Sequence[str], *, timeout: float, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            return run_child([self.binary, *args], input=stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ContainerEngineError(
                f"{self.name} {args[0]} did not finish within {timeout:.0f}s",
                fix=f"{self.binary} info",
            ) from None
        except OSError as exc:
            raise ToolMissing(f"cannot run {self.binary}: {exc.strerror}") from None

    def pull(
        self, reference: str, *, plain_http: bool = False, login: RegistryLogin | None = None
    ) -> str:
        """Pull ``reference`` (``repository@sha256:...``) and return the local image id.

        ``plain_http`` is for registries served without TLS (npa's registry client uses plain
        HTTP for loopback hosts only); ``login`` is handed to podman on its standard input.
        """
        if "@sha256:" not in reference:
            raise InvalidInput(
                f"{reference} is not pinned by digest; npa runs only pinned images",
                fix=shlex.join([self.binary, "pull", reference])
                + " && "
                + shlex.join(
                    [self.binary, "image", "inspect", "--format", "{{.Digest}}", reference]
                )
                + "  # the digest to pin it by (preflight-images resolves a spec's tags)",
            )
        args = ["pull", "--quiet"]
        stdin = None
        if plain_http and self.name == "podman":
            # docker already treats loopback registries as plain HTTP; podman must be told.
            args.append("--tls-verify=false")
        if login is not None:
            if self.name != "podman":
                raise InvalidInput(
                    f"docker pulls with its own login only; npa found credentials for "
                    f"{login.registry} in {login.source}",
                    fix=f"docker login {login.registry}",
                )
            args += ["--authfile", "/dev/stdin"]
            stdin = _auth_document(login)
        result = self._call([*args, reference], timeout=PULL_TIMEOUT, stdin=stdin)
        if result.returncode != 0:
            # The command to retry by hand, minus the credential plumbing (stdin is npa's).
            shown = args[:-2] if login is not None else args
            retry = " ".join([self.binary, *shown, reference])
            raise ContainerEngineError(
                f"{self.name} could not pull {reference}: {_last_line(result.stderr)}"
                + image_refusal(result.stderr, reference),
                fix=retry,
            )
        image_id = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        return image_id or reference

    def run_argv(
        self,
        *,
        image: str,
        command: Sequence[str],
        name: str,
        env: Mapping[str, str],
        mounts: Sequence[Mount],
        workdir: str,
        labels: Mapping[str, str],
        user: str | None = None,
        userns: str | None = None,
    ) -> list[str]:
        """The command line that runs ``command`` in ``image``, attached, removed when it ends.

        The container's environment is its image's and ``env``, nothing else of the client's
        (podman's ``--http-proxy`` would copy the client's proxy variables: turned off). The
        values travel in the client's environment (:func:`client_env`), never on its command
        line, except for a variable the client reads itself (:data:`CLIENT_VARIABLES`), whose
        value must stay the client's own. The image must have been pulled (``--pull=never``):
        a run never fetches bytes that preflight did not see. ``userns`` is podman's
        ``--userns`` mode (rootless podman maps the container's user to the caller with
        ``keep-id:uid=U,gid=G``).
        """
        argv = [self.binary, "run", "--rm", "--pull=never", "--name", name, "--workdir", workdir]
        if self.name == "podman":
            argv += ["--http-proxy=false", "--env-host=false"]
        for key, value in sorted(labels.items()):
            argv += ["--label", f"{key}={value}"]
        for mount in mounts:
            argv += ["--mount", mount.flag()]
        for key in sorted(env):
            argv += ["--env", f"{key}={env[key]}" if key in CLIENT_VARIABLES else key]
        if user:
            argv += ["--user", user]
        if userns:
            argv += [f"--userns={userns}"]
        return [*argv, image, *command]

    def remove_labelled(self, value: str) -> list[str]:
        """Force-remove every container labelled ``io.npa.run=value``; returns their names."""
        listed = self._call(
            ["ps", "--all", "--filter", f"label={RUN_LABEL}={value}", "--format", "{{.Names}}"],
            timeout=PROBE_TIMEOUT,
        )
        if listed.returncode != 0:
            raise ContainerEngineError(
                f"{self.name} could not list containers: {_last_line(listed.stderr)}",
                fix=f"{self.binary} ps --all",
            )
        names = [n for n in listed.stdout.split() if n]
        if names:
            self._call(["rm", "--force", *names], timeout=PROBE_TIMEOUT)
        return names


# Lines of an engine's output that speak of the image (what a stage prints rarely does).
_IMAGE_LINE = re.compile(r"\b(image|manifest|pull|registry|repository)\b", re.IGNORECASE)


def image_refusal(text: str, image: str) -> str:
    """`` [actionable_configuration: why]`` when the engine's words about ``image`` say it is
    not there or not allowed (the same reading as the run watcher's of a pod's ErrImagePull:
    :func:`npa.core.faults.classify_pull_failure`); ``""`` otherwise."""
    fault = classify_pull_failure(text, image=image)
    return f" [{fault.classification.value}: {fault.why}]" if fault.actionable else ""


def _engine_words(log_tail: str) -> str:
    """A shard log's tail from the first line that speaks of the image on: the engine's error
    (with its continuation lines), not what the stage printed before."""
    lines = log_tail.splitlines()
    first = next((i for i, line in enumerate(lines) if _IMAGE_LINE.search(line)), len(lines))
    return "\n".join(lines[first:])


def start_failure(
    engine: ContainerEngine, log_tail: str, image: str | None = None
) -> NpaError | None:
    """The npa error for an engine that failed before the stage's command ran, if it did.
    ``image`` is the stage's: an image the engine does not have (``--pull=never``) is named
    with the pull that restores it, or says what the registry answers."""
    if _RLIMIT_REFUSED.search(log_tail):
        return ContainerEngineError(
            f"{engine.name} cannot set the container's resource limits on this host "
            "(the host forbids raising them)",
            fix=RLIMIT_FIX,
        )
    if _CRUN_HYBRID in log_tail:
        return ContainerEngineError(
            f"{engine.name}'s runtime crun cannot run containers on this host's mixed cgroup v1 "
            "and v2 hierarchies; runc can",
            fix=RUNC_FIX,
        )
    said = _engine_words(log_tail)
    refused = image_refusal(said, image) if image and said else ""
    if refused:
        return ContainerEngineError(
            f"{engine.name} cannot start the stage's image {image}: {_last_line(log_tail)}"
            + refused,
            fix=shlex.join([engine.binary, "pull", image or ""]),
        )
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _works(binary: str, name: str) -> bool:
    probe = ["info", "--format", "{{.Host.OCIRuntime.Name}}"] if name == "podman" else [
        "version", "--format", "{{.Server.Version}}"
    ]  # fmt: skip
    try:
        result = run_child([binary, *probe], timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def find_engine(choice: str = "auto", *, path: str | None = None) -> ContainerEngine | None:
    """The working engine ``choice`` names (``auto``: podman, then docker), or None.

    "Working" means the engine answered: a docker client without a reachable daemon is not an
    engine. An explicit ``podman``/``docker`` that does not work is an error with its fix;
    ``auto`` that finds none returns None.
    """
    if choice not in ("auto", *ENGINES):
        raise InvalidInput(
            f"unknown container engine {choice!r}; choose auto, podman or docker",
            fix="--engine auto",
        )
    search = path if path is not None else os.environ.get("PATH", "")
    for name in ENGINES if choice == "auto" else (choice,):
        binary = shutil.which(name, path=search)
        if binary and _works(binary, name):
            return ContainerEngine(name=name, binary=binary)
        if choice != "auto":
            install = "apt-get install -y podman" if name == "podman" else "start the docker daemon"
            state = "does not answer" if binary else "is not installed"
            raise ToolMissing(f"container engine {name} {state}", fix=install)
    return None
