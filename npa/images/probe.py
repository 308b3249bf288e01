"""The capability probe: run an unattested image once, bounded, and read what it can do.

The probe is a Pod in the project's namespace (the one provisioning created, where the run's
pods will run) that runs the image, pinned by digest, under the pod security context the
stage's task gets, with a fixed shell command that checks the contract's capabilities (what
SkyPilot's pod start-up needs as that user: a passwd entry, a writable home, bash, passwordless
sudo; and the AWS CLI the stage's set-up fetches its inputs with) and writes one line to the
termination message. It is bounded three ways: small resource limits,
``activeDeadlineSeconds`` on the Pod, and npa's own wait timeout. Whatever the outcome,
npa deletes the Pod and reads it back until the API answers 404; a Pod that will not go away
fails the probe, because a probe must leave nothing running behind it.

``kubernetes`` is imported inside the functions that use it so the CLI stays fast to start.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from npa.backends.base import pod_security_context
from npa.core.text import clipped
from npa.images.contract import CONTRACT_VERSION, REQUIRED_CAPABILITIES

PROBE_LABEL = "npa.io/probe"
MANAGED_BY = "app.kubernetes.io/managed-by"
DEFAULT_TIMEOUT = 120.0
DELETE_TIMEOUT = 30.0
POLL_INTERVAL = 0.5
LIMITS = {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "64Mi"}

# The probe command: every check runs, then one line reports all of them. The exit status is
# non-zero when a required capability is missing. POSIX sh builtins, plus `id` and `sudo` when
# the image has them: `sudo -n true` is what SkyPilot's `sudo` needs (no password, and a passwd
# entry for the user, which sudo refuses to run without).
PROBE_SCRIPT = (
    "uid=$(id -u 2>/dev/null || echo unknown); "
    "tmp=no; f=/tmp/.npa-probe.$$; "
    'if : > "$f" 2>/dev/null; then rm -f "$f"; tmp=yes; fi; '
    "bash=no; command -v bash >/dev/null 2>&1 && bash=yes; "
    "user=no; id -un >/dev/null 2>&1 && user=yes; "
    'home=no; h="${HOME:-/}"; g="$h/.npa-probe.$$"; '
    'if [ "$h" != / ] && : > "$g" 2>/dev/null; then rm -f "$g"; home=yes; fi; '
    'sudo=no; if [ "$uid" = 0 ]; then sudo=yes; '
    "elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then sudo=yes; fi; "
    "aws=no; command -v aws >/dev/null 2>&1 && aws=yes; "
    f"printf 'npa-probe/{CONTRACT_VERSION} uid=%s posix-shell=yes writable-tmp=%s bash=%s "
    "passwd-user=%s writable-home=%s sudo=%s aws-cli=%s\\n' "
    '"$uid" "$tmp" "$bash" "$user" "$home" "$sudo" "$aws" > /dev/termination-log; '
    'test "$tmp$bash$user$home$sudo$aws" = yesyesyesyesyesyes'
)
_RESULT = re.compile(r"npa-probe/(?P<version>[0-9]+)(?P<fields>(?: [a-z-]+=[A-Za-z0-9-]+)*)")

# Waiting reasons that mean the container will never run the probe command.
PULL_FAILURES = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
START_FAILURES = {"CreateContainerError", "CreateContainerConfigError", "RunContainerError"}

Verdict = Literal["passed", "failed", "unverified"]


@dataclass(frozen=True)
class ProbeOutcome:
    """What one probe found. ``failed``: the image lacks a capability; ``unverified``: the
    probe could not reach an answer (timeout, pull failure, API error, Pod not deleted)."""

    verdict: Verdict
    detail: str
    pod: str
    namespace: str
    uid: int | None = None
    fix: str | None = None
    namespace_missing: bool = False


@dataclass(frozen=True)
class ProbeTarget:
    """Where probes run: a kube context, the kubeconfig that defines it, a namespace."""

    context: str
    kubeconfig: str  # a path, or a KUBECONFIG list of paths
    namespace: str

    def kubectl(self, *args: str) -> str:
        config = f"KUBECONFIG={shlex.quote(self.kubeconfig)} "
        return f"{config}kubectl --context {self.context} -n {self.namespace} {' '.join(args)}"


def default_kubeconfig() -> str:
    """``$KUBECONFIG`` (read now, not when the client library was imported), else
    ``~/.kube/config``."""
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def select_target(
    context: str, kubeconfig: Path | str | None, namespace: str | None = None
) -> ProbeTarget:
    """Where to probe: ``namespace`` (the project's) in ``context``, else the context's own
    namespace in ``kubeconfig`` (default: :func:`default_kubeconfig`)."""
    from kubernetes import config as kconfig

    config_file = str(kubeconfig) if kubeconfig else default_kubeconfig()
    try:
        contexts, _ = kconfig.list_kube_config_contexts(config_file=config_file)
    except (kconfig.ConfigException, OSError) as exc:
        raise ProbeSetupError(f"cannot read the kubeconfig {config_file}: {exc}") from None
    for entry in contexts or []:
        if entry.get("name") == context:
            chosen = namespace or (entry.get("context") or {}).get("namespace") or "default"
            return ProbeTarget(context, config_file, chosen)
    raise ProbeSetupError(f"kube context {context!r} is not in the kubeconfig {config_file}")


class ProbeSetupError(Exception):
    """The probe cannot start: no usable kubeconfig or context."""


def pod_name(digest: str) -> str:
    return f"npa-probe-{digest.split(':', 1)[-1][:12]}-{secrets.token_hex(3)}"


def probe_pod(
    name: str, image: str, run_as_user: int, run_as_group: int, deadline: int, fs_group: int
) -> Any:
    """The Pod body of one probe: pinned image, fixed command, bounded, and the pod security
    context of the stage's task, no more and no less: a stricter one (no privilege escalation,
    no capabilities) would fail ``sudo`` that the task can run, a looser one would pass what the
    task cannot."""
    from kubernetes import client

    context = pod_security_context(run_as_user, run_as_group, fs_group)
    resources = client.V1ResourceRequirements(limits=dict(LIMITS), requests=dict(LIMITS))
    container = client.V1Container(
        name="probe",
        image=image,
        image_pull_policy="IfNotPresent",
        command=["/bin/sh", "-c", PROBE_SCRIPT],
        resources=resources,
        termination_message_path="/dev/termination-log",
        termination_message_policy="File",
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, labels={PROBE_LABEL: "capability", MANAGED_BY: "npa"}
        ),
        spec=client.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            active_deadline_seconds=deadline,
            automount_service_account_token=False,
            enable_service_links=False,
            termination_grace_period_seconds=0,
            security_context=client.V1PodSecurityContext(
                run_as_non_root=context["runAsNonRoot"],
                run_as_user=context["runAsUser"],
                run_as_group=context["runAsGroup"],
                fs_group=context["fsGroup"],
            ),
        ),
    )


def parse_result(message: str) -> dict[str, str] | None:
    """``npa-probe/2 uid=1000 posix-shell=yes writable-tmp=yes ...`` -> fields, or None."""
    for line in (message or "").splitlines():
        match = _RESULT.fullmatch(line.strip())
        if match:
            fields = dict(f.split("=", 1) for f in match.group("fields").split())
            fields["version"] = match.group("version")
            return fields
    return None


class CapabilityProber:
    """Runs probes through one CoreV1Api; ``clock``/``sleep`` are injectable for tests."""

    def __init__(
        self,
        core: Any,
        target: ProbeTarget,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        delete_timeout: float = DELETE_TIMEOUT,
        poll: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_created: Callable[[str], None] | None = None,
    ) -> None:
        self.core = core
        self.target = target
        self.timeout = timeout
        self.delete_timeout = delete_timeout
        self.poll = poll
        self.clock = clock
        self.sleep = sleep
        self.on_created = on_created

    def run(
        self,
        image: str,
        digest: str,
        *,
        run_as_user: int,
        run_as_group: int,
        fs_group: int | None = None,
    ) -> ProbeOutcome:
        """Create, wait, read, delete, confirm; the Pod is gone (or reported) on every path."""
        from kubernetes.client.rest import ApiException

        ns = self.target.namespace
        name = pod_name(digest)
        deadline = max(1, int(self.timeout))
        group = run_as_group if fs_group is None else fs_group
        body = probe_pod(name, image, run_as_user, run_as_group, deadline, group)
        try:
            self.core.create_namespaced_pod(ns, body)
        except ApiException as exc:
            if exc.status == 404:
                return ProbeOutcome(
                    "unverified",
                    f"namespace {ns} does not exist in context {self.target.context}: the "
                    "probe runs where the run's pods will, in the namespace provisioning creates",
                    name,
                    ns,
                    namespace_missing=True,
                )
            return ProbeOutcome(
                "unverified",
                f"the API refused the probe Pod: HTTP {exc.status} {_api_reason(exc)}",
                name,
                ns,
            )
        except Exception as exc:  # urllib3 connection errors and the like
            return ProbeOutcome(
                "unverified", f"cannot reach the Kubernetes API: {type(exc).__name__}", name, ns
            )
        if self.on_created:
            self.on_created(name)
        try:
            outcome = self._wait(name)
        finally:
            gone, why = self._delete(name)
        if not gone:
            return ProbeOutcome(
                "unverified",
                f"probe Pod {ns}/{name} could not be deleted ({why}); the probe fails "
                f"(it found: {outcome.detail})",
                name,
                ns,
                fix=self.target.kubectl("delete", "pod", name, "--grace-period=0", "--force"),
            )
        return outcome

    def _wait(self, name: str) -> ProbeOutcome:
        from kubernetes.client.rest import ApiException

        ns = self.target.namespace
        end = self.clock() + self.timeout
        while True:
            try:
                pod = self.core.read_namespaced_pod(name, ns)
            except ApiException as exc:
                return ProbeOutcome(
                    "unverified", f"cannot read the probe Pod: HTTP {exc.status}", name, ns
                )
            except Exception as exc:
                return ProbeOutcome(
                    "unverified", f"cannot reach the Kubernetes API: {type(exc).__name__}", name, ns
                )
            outcome = self._judge(name, pod)
            if outcome is not None:
                return outcome
            if self.clock() >= end:
                return ProbeOutcome(
                    "unverified",
                    f"the probe did not finish within {self.timeout:g}s "
                    f"(Pod phase {getattr(pod.status, 'phase', None) or 'unknown'})",
                    name,
                    ns,
                )
            self.sleep(self.poll)

    def _judge(self, name: str, pod: Any) -> ProbeOutcome | None:
        ns = self.target.namespace
        status = pod.status
        for cs in (status.container_statuses if status else None) or []:
            state = cs.state
            if state is None:
                continue
            if state.waiting is not None and state.waiting.reason in PULL_FAILURES:
                return ProbeOutcome(
                    "unverified",
                    f"the cluster cannot pull the image ({state.waiting.reason}); npa does not "
                    "manage pull secrets",
                    name,
                    ns,
                )
            if state.waiting is not None and state.waiting.reason in START_FAILURES:
                return ProbeOutcome(
                    "failed",
                    f"the probe command cannot start in the image ({state.waiting.reason}: "
                    f"{clipped((state.waiting.message or '').strip(), 200)})",
                    name,
                    ns,
                )
            if state.terminated is not None:
                return self._read_result(name, state.terminated)
        phase = status.phase if status else None
        if phase == "Failed":
            reason = (status.reason or "") if status else ""
            return ProbeOutcome(
                "unverified" if reason == "DeadlineExceeded" else "failed",
                f"the probe Pod failed ({reason or 'no container status'})",
                name,
                ns,
            )
        return None

    def _read_result(self, name: str, terminated: Any) -> ProbeOutcome:
        ns = self.target.namespace
        fields = parse_result(terminated.message or "")
        code = terminated.exit_code
        if fields is None:
            return ProbeOutcome(
                "failed",
                f"the probe exited {code} without its report line (is /bin/sh a POSIX shell?)",
                name,
                ns,
            )
        uid_text = fields.get("uid", "")
        uid = int(uid_text) if uid_text.isdigit() else None
        missing = [c for c in REQUIRED_CAPABILITIES if fields.get(c) != "yes"]
        if code != 0 or missing:
            lacks = f"lacks {', '.join(missing)}" if missing else "reported no missing capability"
            return ProbeOutcome(
                "failed", f"the probe exited {code}: the image {lacks}", name, ns, uid=uid
            )
        return ProbeOutcome(
            "passed",
            f"probe passed as uid {uid_text} ({', '.join(REQUIRED_CAPABILITIES)})",
            name,
            ns,
            uid=uid,
        )

    def _delete(self, name: str) -> tuple[bool, str]:
        """Delete the Pod now and read it back until the API says 404."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        ns = self.target.namespace
        try:
            self.core.delete_namespaced_pod(
                name, ns, body=client.V1DeleteOptions(grace_period_seconds=0)
            )
        except ApiException as exc:
            if exc.status != 404:
                return False, f"delete answered HTTP {exc.status}"
        except Exception as exc:
            return False, f"delete failed: {type(exc).__name__}"
        end = self.clock() + self.delete_timeout
        while True:
            try:
                self.core.read_namespaced_pod(name, ns)
            except ApiException as exc:
                if exc.status == 404:
                    return True, "gone"
            except Exception as exc:
                return False, f"cannot confirm deletion: {type(exc).__name__}"
            if self.clock() >= end:
                return False, f"still present {self.delete_timeout:g}s after delete"
            self.sleep(self.poll)


def _api_reason(exc: Any) -> str:
    return str(getattr(exc, "reason", "") or "").strip()


def core_api(target: ProbeTarget) -> Any:
    """A CoreV1Api for the target's context, from the one client factory."""
    from kubernetes import config as kconfig

    from npa.adapters.kube.client import core_api as kube_core_api

    try:
        return kube_core_api(target.kubeconfig, target.context)
    except (kconfig.ConfigException, OSError) as exc:
        raise ProbeSetupError(f"cannot use kube context {target.context!r}: {exc}") from None
