"""The missing-tools fix line is an absolute command that runs from any folder."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.core.errors import LockBusy
from npa.core.fsio import exclusive_lock

pytestmark = pytest.mark.integration


def test_the_tools_fix_is_an_absolute_command_that_runs_from_anywhere(tmp_path: Path) -> None:
    import shlex
    import subprocess

    from npa.core.commands import bootstrap_tools_command

    [script] = shlex.split(bootstrap_tools_command())
    assert Path(script).is_absolute() and Path(script).is_file()
    # From another directory, as a user pastes it: it answers (--plan changes nothing).
    plan = subprocess.run(
        [script, "--plan", "--only", "pulumi"], cwd=tmp_path, capture_output=True, text=True
    )
    assert plan.returncode == 0, plan.stderr
    assert "pulumi" in plan.stdout + plan.stderr


def test_a_busy_lock_suggests_a_command_that_waits_for_it(tmp_path: Path) -> None:
    """The fix was prose ("wait for it to finish"); it is a command that waits for the holder,
    and returns at once when the lock is free."""
    import shlex
    import subprocess

    lock = tmp_path / "x.lock"
    with exclusive_lock(lock), pytest.raises(LockBusy) as busy, exclusive_lock(lock):
        pass
    command = (busy.value.fix or "").split("  #", 1)[0]
    assert shlex.split(command) == ["flock", str(lock), "true"], busy.value.fix
    assert subprocess.run(shlex.split(command), timeout=30, check=False).returncode == 0


def test_a_live_pulumi_lock_suggests_waiting_for_its_process_then_the_resume() -> None:
    import shlex
    import socket
    import subprocess

    from npa.adapters.infra.runner import StackLock
    from npa.services.provision import _after_locks

    resume = "npa provision-if-absent --project p --target local --yes"
    ended = subprocess.Popen(["true"])
    ended.wait()
    here = StackLock(path="l", pid=ended.pid, hostname=socket.gethostname(), stale=False)
    fix = _after_locks([here], resume)
    waits, rest = fix.split("  #", 1)[0].split(" && ", 1)
    assert rest == resume, fix
    assert subprocess.run(shlex.split(waits), timeout=30, check=False).returncode == 0
    elsewhere = StackLock(path="l", pid=1, hostname="another-host", stale=False)
    assert _after_locks([elsewhere], resume).split("  #", 1)[0] == resume


_NOT_TEXT = st.sampled_from(
    [b"\xe9", b"\x93", b"\x81", b"\x8d", b"\xff", b"\xc3(", b"\xed\xa0\x80"]
)


@settings(max_examples=25, deadline=None)
@given(
    lines=st.lists(
        st.tuples(st.text(st.characters(max_codepoint=127, exclude_characters="\0"), max_size=12),
                  _NOT_TEXT | st.just(b"")),
        min_size=1, max_size=5,
    ),
    form=st.sampled_from(["utf-8", "utf-16-le", "utf-16-be", "utf-32-le"]),
    cut=st.booleans(),
    encodings=st.sampled_from(["yaml", "utf-8"]),
)  # fmt: skip
def test_the_fix_for_a_file_that_is_not_text_writes_a_copy_npa_reads(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[tuple[str, bytes]],
    form: str,
    cut: bool,
    encodings: Literal["yaml", "utf-8"],
) -> None:
    """Latin-1 or Windows-1252 bytes in a UTF-8 file, a UTF-16/32 file cut short, or any
    UTF-16/32 file where only UTF-8 is read (a kubeconfig): the fix line, run as printed with
    the real iconv, writes a copy read_user_text accepts the same way."""
    import shlex
    import subprocess

    from npa.core.errors import InvalidInput
    from npa.core.userfiles import read_user_text

    raw = b"\n".join(("k" + text).encode(form) + bad for text, bad in lines)
    if form != "utf-8":  # whole characters, or cut short (an odd byte count)
        raw = "\n".join("k" + text for text, _ in lines).encode(form)
        raw = raw[: len(raw) - 1] if cut else raw
    folder = tmp_path_factory.mktemp("fix")
    path = folder / "a spec.yaml"
    path.write_bytes(raw)
    try:
        read_user_text(path, "spec file", encodings=encodings)
    except InvalidInput as exc:
        assert exc.fix is not None
        command = exc.fix.split("  #", 1)[0]
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=folder,
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, (exc.fix, done.stderr)
        words = shlex.split(command)
        copy = Path(words[words.index("-o") + 1])
        assert read_user_text(copy, "spec file", encodings=encodings) is not None
    else:  # read as it was: whole text in an encoding this reader takes
        whole = not cut or len(raw) < 2  # (one byte left of a UTF-16 file reads as UTF-8)
        clean = not any(bad for _, bad in lines)
        assert (form == "utf-8" and clean) or (form != "utf-8" and encodings == "yaml" and whole)
