"""Pulumi refusing the passphrase of a stack is an npa error naming the variable that gave it.
The stderr texts are pulumi 3.260's, as its CLI printed them for a file:// backend (the same
refusals are proved end to end in tests/integration/test_pulumi_backends.py)."""

from __future__ import annotations

import pytest

from npa.adapters.infra.runner import passphrase_refusal
from npa.core.errors import InvalidInput

pytestmark = pytest.mark.unit

WRONG = (
    "error: failed to decrypt: incorrect passphrase, please set PULUMI_CONFIG_PASSPHRASE to the "
    "correct passphrase or set PULUMI_CONFIG_PASSPHRASE_FILE to a file containing the passphrase"
)
NO_FILE = (
    "error: getting stack configuration: get stack secrets manager: unable to read "
    "PULUMI_CONFIG_PASSPHRASE_FILE: open /srv/pass: no such file or directory"
)


@pytest.mark.parametrize(
    ("env", "variable", "said"),
    [
        ({"PULUMI_CONFIG_PASSPHRASE": "x"}, "PULUMI_CONFIG_PASSPHRASE", "the passphrase in "
         "PULUMI_CONFIG_PASSPHRASE"),
        ({"PULUMI_CONFIG_PASSPHRASE_FILE": "/srv/pass"}, "PULUMI_CONFIG_PASSPHRASE_FILE",
         "the passphrase in /srv/pass"),
        ({}, None, "no passphrase (neither PULUMI_CONFIG_PASSPHRASE nor"),
    ],
)  # fmt: skip
def test_a_wrong_passphrase_names_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], variable: str | None, said: str
) -> None:
    for name in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    error = passphrase_refusal(f"code: 1\n stdout: Previewing update (s):\n stderr: {WRONG}", "s")
    assert isinstance(error, InvalidInput)
    assert error.message.startswith(said) and "does not decrypt the secrets of stack s" in (
        error.message
    )
    assert error.details["variable"] == variable
    assert error.fix is not None and error.fix.startswith("read -rs PULUMI_CONFIG_PASSPHRASE ")


def test_an_unreadable_passphrase_file_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE_FILE", "/srv/pass")
    error = passphrase_refusal(NO_FILE, "s")
    assert error is not None and error.message == (
        "PULUMI_CONFIG_PASSPHRASE_FILE names /srv/pass, which pulumi cannot read (open /srv/pass: "
        "no such file or directory), so the secrets of stack s cannot be opened"
    )
    assert error.fix == "ls -l /srv/pass  # the file holding the passphrase of stack s"


def test_other_failures_are_not_a_passphrase() -> None:
    assert passphrase_refusal("error: resource 'x' failed: timeout", "s") is None
