"""Fix lines: the exact commands npa prints for a user to run, built from real values.

Every value goes through shell quoting, so a context named by an ARN, a path with spaces or a
project alias pastes into a shell as one word. The commands start with ``npa`` (or a tool on
PATH), never with a path inside npa's repository.
"""

from __future__ import annotations

import shlex
from pathlib import Path


def npa_command(*argv: str) -> str:
    """``npa ARGV...`` quoted for a shell."""
    return shlex.join(["npa", *argv])


def with_flags(argv: list[str], fragment: str, takes_value: dict[str, bool]) -> str | None:
    """``npa ARGV`` with the flags of ``fragment`` (a fix such as ``--runtime auto  # why``)
    set: a flag ``argv`` has gets the fragment's value, another is added; the comment stays.
    ``takes_value`` says, for each flag the command has, whether it takes a value. None when
    the fragment names a flag the command does not have (it is then no fix for it)."""
    head, hashed, comment = fragment.partition("  #")
    words = shlex.split(head)
    out = list(argv)
    while words:
        flag = words.pop(0)
        if flag not in takes_value:
            return None
        value = [words.pop(0)] if takes_value[flag] and words else []
        if flag in out and value:
            out[out.index(flag) + 1] = value[0]
        elif flag not in out:
            out += [flag, *value]
    return npa_command(*out) + (f"  #{comment}" if hashed else "")


def with_values(argv: list[str], values: dict[str, list[str]]) -> str:
    """``npa ARGV`` with each repeatable flag of ``values`` given exactly those values (every
    ``--flag V`` and ``--flag=V`` of ``argv`` replaced, in place of the first)."""
    out: list[str] = []
    words = iter(argv)
    placed: set[str] = set()
    for word in words:
        flag = word.split("=", 1)[0]
        if flag not in values:
            out.append(word)
            continue
        if "=" not in word:
            next(words, None)
        if flag not in placed:
            placed.add(flag)
            out += [a for v in values[flag] for a in (flag, v)]
    for flag in values.keys() - placed:
        out += [a for v in values[flag] for a in (flag, v)]
    return npa_command(*out)


def status_command(run_id: str, project: str, *extra: str) -> str:
    """The command that shows run ``run_id`` of ``project`` (``extra``: --watch, --cached...)."""
    return npa_command("workbench", "workflow", "status", run_id, "--project", project, *extra)


def cancel_command(run_id: str, project: str) -> str:
    """The command that cancels run ``run_id`` of ``project`` (and releases what it holds)."""
    return npa_command("workbench", "workflow", "cancel", run_id, "--project", project)


def logs_command(run_id: str, project: str, stage: str) -> str:
    """The command that shows the logs of ``stage`` of run ``run_id`` of ``project``."""
    return npa_command(
        "workbench", "workflow", "logs", run_id, "--project", project, "--stage", stage
    )


def provision_command(context: str, project: str | None = None) -> str:
    """The command that provisions ``context`` for ``project`` (npa's default without one)."""
    argv = ["provision-if-absent", *(["--project", project] if project else [])]
    return npa_command(*argv, "--target", "kubernetes", "--context", context)


def aws_command(*argv: str, endpoint_url: str | None = None, profile: str | None = None) -> str:
    """An aws CLI line that reaches the store npa reached: the same endpoint and profile (without
    them, aws asks AWS itself, with whatever credentials the shell has), quoted for a shell."""
    where = [*(["--endpoint-url", endpoint_url] if endpoint_url else [])]
    who = [*(["--profile", profile] if profile else [])]
    return shlex.join(["aws", *argv, *where, *who])


def store_credentials_command(project: str, profile: str | None, known: list[str]) -> str:
    """The command that gives ``project`` S3 credentials: keys for its ``profile`` (aws asks
    for them; the secret is the user's to type), else the first profile of ``known`` (this
    machine's), else a new profile ``npa`` recorded for the project."""
    record = ["configure", "--project", project, "--profile"]
    if profile:
        return shlex.join(["aws", "configure", "--profile", profile])
    if known:
        return npa_command(*record, known[0])
    return (
        shlex.join(["aws", "configure", "--profile", "npa"]) + " && " + npa_command(*record, "npa")
    )


def edit_command(path: str | Path) -> str:
    """The command that opens ``path`` (a spec, a quota file) in the user's editor."""
    return "${EDITOR:-vi} " + shlex.quote(str(path))


def kubectl_command(kubeconfig: str | Path, context: str, *args: str) -> str:
    """A kubectl command line for exactly this kubeconfig (a path or a KUBECONFIG list) and
    context, quoted for a shell."""
    return f"KUBECONFIG={shlex.quote(str(kubeconfig))} " + shlex.join(
        ["kubectl", "--context", context, *args]
    )


def bootstrap_tools_command(*only: str) -> str | None:
    """The command that installs npa's external tools (pulumi, plugins, kube-apiserver...), or
    only the tools ``only`` names (the script's ``--only`` names: pulumi, kubernetes-plugin...).

    It is ``scripts/bootstrap-tools`` of the checkout npa runs from, given as an absolute path
    so it works from any directory. An installed wheel has no checkout: None, and the error
    that needed a tool says so in its message (a fix line is a command, never a sentence).
    """
    script = Path(__file__).resolve().parents[2] / "scripts" / "bootstrap-tools"
    if script.is_file():
        return shlex.join([str(script), *(a for tool in only for a in ("--only", tool))])
    return None


def pulumi_install_command(version: str) -> str:
    """The pulumi CLI ``version`` from pulumi's own installer (for an npa without its
    bootstrap-tools script)."""
    return f"curl -fsSL https://get.pulumi.com | sh -s -- --version {shlex.quote(version)}"
