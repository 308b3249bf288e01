"""The leftover checks name a process by (pid, start) and find a port's listeners by socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.harness.procs import identities, listeners, process_start, still_running, ticks_now


def test_a_process_is_its_pid_and_its_start() -> None:
    before = ticks_now()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        [identity] = identities([child.pid])
        assert identity[0] == child.pid and identity[1] >= before - 1
        assert still_running(identity)
        # The same pid with another start is another process (the pid was handed out again).
        assert not still_running([child.pid, identity[1] - 1])
    finally:
        child.kill()
        child.wait()
    assert not still_running(identity)
    assert process_start(child.pid) is None or process_start(child.pid) != identity[1]
    assert identities([child.pid]) == [] or identities([child.pid])[0][1] != identity[1]


def test_listeners_are_found_on_any_address_and_only_while_listening() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert os.getpid() not in listeners(port)  # bound, not yet listening
        server.listen()
        assert listeners(port) == [os.getpid()]
    assert listeners(port) == []


def test_the_suites_own_processes_are_told_from_a_childs_orphans() -> None:
    """A process under this pytest (a service another worker started meanwhile) is the suite's;
    one whose parent died and that now hangs from init (a child's orphan) is not."""
    from tests.integration.leftovers import _descends_from, _suite_root

    suite = _suite_root()
    assert _descends_from(os.getpid(), suite)
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    # The shell starts a sleeper in the background, prints its pid and exits: an orphan.
    shell = subprocess.run(
        ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    orphan = int(shell.stdout.strip())
    try:
        assert _descends_from(own.pid, suite)
        assert not _descends_from(orphan, suite)
    finally:
        own.kill()
        own.wait()
        os.kill(orphan, 9)
