"""The object-store interface against its two real backends: moto's S3 server and files."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npa.adapters.storage import (
    S3_CLIENT_ENV,
    S3_CLIENTS,
    BucketAbsent,
    ObjectAbsent,
    ObjectStore,
    StoreUnavailable,
    open_store,
)
from npa.core.errors import InvalidInput
from tests.harness.procs import free_port
from tests.harness.s3 import S3Server
from tests.integration.store_proxy import store_proxy

pytestmark = pytest.mark.integration

BUCKET = "npa-store-test"


@pytest.fixture(params=S3_CLIENTS)
def s3_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each S3 client npa can use (subprocesses inherit the choice)."""
    monkeypatch.setenv(S3_CLIENT_ENV, request.param)
    return str(request.param)


@pytest.fixture(params=[*(f"s3-{c}" for c in S3_CLIENTS), "file"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, str]]:
    """(store URI, extra environment) for each backend (and each S3 client); the S3 bucket
    exists and is empty."""
    if request.param.startswith("s3-"):
        s3: S3Server = request.getfixturevalue("s3")
        s3.client().create_bucket(Bucket=BUCKET)
        return f"s3://{BUCKET}/some/prefix", {
            **s3.env,
            S3_CLIENT_ENV: request.param.removeprefix("s3-"),
        }
    return (tmp_path / "store").as_uri(), {}


@pytest.fixture
def store(backend: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    uri, env = backend
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return open_store(uri, endpoint_url=env.get("AWS_ENDPOINT_URL_S3"))


def test_put_get_head_delete(store: ObjectStore) -> None:
    info = store.put("a/b/c.txt", b"hello")
    assert info.size == 5
    assert store.get("a/b/c.txt") == b"hello"
    assert store.head("a/b/c.txt").size == 5
    assert store.exists("a/b/c.txt")
    store.put("a/b/c.txt", b"replaced")
    assert store.get("a/b/c.txt") == b"replaced"
    store.delete("a/b/c.txt")
    assert not store.exists("a/b/c.txt")
    store.delete("a/b/c.txt")  # deleting an absent key is fine
    with pytest.raises(ObjectAbsent):
        store.get("a/b/c.txt")
    with pytest.raises(ObjectAbsent):
        store.head("a/b/c.txt")


def test_the_endpoint_comes_from_the_environment_when_not_given(
    s3: S3Server, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both clients honour AWS_ENDPOINT_URL_S3 (as the AWS tools do) when npa passes none."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    s3.client().create_bucket(Bucket=BUCKET)
    store = open_store(f"s3://{BUCKET}/env")
    store.put("k", b"from the environment's endpoint")
    body = s3.client().get_object(Bucket=BUCKET, Key="env/k")["Body"].read()
    assert body == b"from the environment's endpoint"


def test_s3_etag_is_content_md5(
    s3: S3Server, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    s3.client().create_bucket(Bucket=BUCKET)
    store = open_store(f"s3://{BUCKET}", endpoint_url=s3.endpoint_url)
    assert store.put("x", b"abc").etag == hashlib.md5(b"abc").hexdigest()
    assert store.head("x").etag == hashlib.md5(b"abc").hexdigest()


def test_list_paginates_in_key_order(store: ObjectStore) -> None:
    keys = [f"p/{i:03d}" for i in range(23)] + ["p2/x", "q/y"]
    for k in keys:
        store.put(k, k.encode())
    page = store.list_page("p/", page_size=10)
    assert len(page.objects) == 10 and page.next_token is not None
    listed = [o.key for o in store.list("p/", page_size=10)]
    assert listed == sorted(k for k in keys if k.startswith("p/"))
    assert [o.key for o in store.list("p")] == sorted(k for k in keys if k.startswith("p"))
    assert all(o.size == len(o.key) for o in store.list("p/"))
    assert list(store.list("nothing/")) == []


def test_a_prefix_inside_a_name_lists_its_own_keys_in_pages(store: ObjectStore) -> None:
    """A prefix that ends inside a name (the run index's ``<order>.<run>@``): exactly the keys
    under it, paged, whatever sorts before or after it in the same folder."""
    keys = [f"f/{c}{i:02d}" for c in "abc" for i in range(12)] + ["f/b", "f/b.", "f/ba"]
    for k in keys:
        store.put(k, b"x")
    page = store.list_page("f/b0", page_size=5)
    assert [o.key for o in page.objects] == [f"f/b{i:02d}" for i in range(5)]
    assert page.next_token is not None
    listed = [o.key for o in store.list("f/b", page_size=5)]
    assert listed == sorted((k for k in keys if k.startswith("f/b")), key=str.encode)
    assert [o.key for o in store.list("f/b1")] == [f"f/b{i:02d}" for i in range(10, 12)]
    assert list(store.list("f/b2")) == [] and list(store.list("f/d")) == []


def test_keys_that_escape_are_refused(store: ObjectStore) -> None:
    for bad in ["../x", "/abs", "a//b", "a/./b", ""]:
        with pytest.raises(InvalidInput):
            store.put(bad, b"x")


def test_create_if_absent(store: ObjectStore) -> None:
    assert store.create_if_absent("lock/one", b"first") is True
    assert store.create_if_absent("lock/one", b"second") is False
    assert store.get("lock/one") == b"first"


RACER = textwrap.dedent(
    """
    import sys, time
    from npa.adapters.storage import open_store
    uri, endpoint, name, start, rounds = sys.argv[1:6]
    store = open_store(uri, endpoint_url=endpoint or None)
    while time.time() < float(start):
        pass
    for i in range(int(rounds)):
        won = store.create_if_absent(f"race/{i}", name.encode())
        print(i, won, flush=True)
    """
)


def test_create_if_absent_race_has_one_winner(
    backend: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes race for the same keys: every key has exactly one winner, whose bytes stay.

    On S3 this exercises the If-None-Match: * path end to end (moto answers 412 to the loser);
    on files it is link(2).
    """
    uri, env = backend
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    endpoint = env.get("AWS_ENDPOINT_URL_S3", "")
    rounds = 25
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, uri, endpoint, f"writer-{i}", str(start), str(rounds)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].split("\n") for p in procs]
    assert all(p.returncode == 0 for p in procs)
    wins = [{int(line.split()[0]) for line in out if line.endswith("True")} for out in outputs]
    assert wins[0] | wins[1] == set(range(rounds))
    assert not wins[0] & wins[1], "two writers both created the same key"
    store = open_store(uri, endpoint_url=endpoint or None)
    for i in range(rounds):
        assert store.get(f"race/{i}") == (b"writer-0" if i in wins[0] else b"writer-1")


def test_missing_bucket_is_not_a_missing_object(
    s3: S3Server, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    store = open_store("s3://no-such-bucket-here/x", endpoint_url=s3.endpoint_url)
    with pytest.raises(BucketAbsent) as err:
        store.head("k")
    assert "create-bucket --bucket no-such-bucket-here" in (err.value.fix or "")
    with pytest.raises(BucketAbsent):
        store.get("k")
    with pytest.raises(BucketAbsent):
        list(store.list(""))


def test_unreachable_endpoint_is_unavailable_not_absent(
    s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    store = open_store(
        "s3://bucket-x/p",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region="us-east-1",
        max_attempts=1,
    )
    for call in (
        lambda: store.head("k"),
        lambda: store.get("k"),
        lambda: list(store.list("")),
        lambda: store.put("k", b"x"),
        lambda: store.create_if_absent("k", b"x"),
    ):
        with pytest.raises(StoreUnavailable) as err:
            call()
        assert not isinstance(err.value, ObjectAbsent)
        assert err.value.exit_code == 4


class _Refusing(http.server.BaseHTTPRequestHandler):
    status = 403
    code = "AccessDenied"

    def _answer(self) -> None:
        body = (
            f"<?xml version='1.0'?><Error><Code>{self.code}</Code><Message>no</Message></Error>"
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=[(403, "AccessDenied"), (500, "InternalError")])
def refusing_endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("H", (_Refusing,), {"status": request.param[0], "code": request.param[1]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_refusals_and_server_errors_are_unavailable(
    refusing_endpoint: str, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    store = open_store(
        "s3://bucket-x/p", endpoint_url=refusing_endpoint, region="us-east-1", max_attempts=1
    )
    for call in (lambda: store.head("k"), lambda: store.get("k"), lambda: list(store.list(""))):
        with pytest.raises(StoreUnavailable) as err:
            call()
        assert not isinstance(err.value, ObjectAbsent)


def test_file_store_errors_are_unavailable(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # every lookup under it fails with ELOOP: an error, not an absence
    store = open_store(loop.as_uri())
    for call in (lambda: store.head("k"), lambda: store.get("k"), lambda: store.put("k", b"x")):
        with pytest.raises(StoreUnavailable):
            call()


def test_file_store_killed_writer_leaves_no_partial_object(tmp_path: Path) -> None:
    store = open_store((tmp_path / "s").as_uri())
    store.put("k", b"x" * 10)
    # Temporary files live outside the key space, so they are never listed as objects.
    (tmp_path / "s" / ".npa-tmp" / "123-dead").write_bytes(b"partial")
    assert [o.key for o in store.list("")] == ["k"]


# A file-store writer that stops in the middle of a put: its temporary file holds the data, not
# yet renamed into place. It says so on stdout and waits to be killed (or to finish).
STOPPED_WRITER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from npa.adapters.storage import open_store

    real_fsync = os.fsync

    def stop(fd):
        real_fsync(fd)
        print("writing", flush=True)
        sys.stdin.readline()

    os.fsync = stop
    open_store(Path(sys.argv[1]).as_uri()).put(sys.argv[2], b"x" * 100_000)
    """
)


def stopped_writer(root: Path, key: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_WRITER, str(root), key],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def test_a_killed_writer_s_temp_file_is_removed_by_the_next_write_at_once(tmp_path: Path) -> None:
    """A writer SIGKILLed mid-put leaves its temporary file; the next write (of another process)
    removes it at once, young as it is, while a live writer's file and another host's young one
    stay, and another host's file untouched for 10 minutes goes."""
    from npa.core.procs import TEMP_MAX_AGE, host_id

    root = tmp_path / "s"
    temps = root / ".npa-tmp"
    killed = stopped_writer(root, "a")
    (dead_temp,) = list(temps.iterdir())
    live = stopped_writer(root, "b")
    live_temp = next(p for p in temps.iterdir() if p != dead_temp)
    killed.kill()
    assert killed.wait() == -9
    other = "0" * 12 if host_id() != "0" * 12 else "1" * 12
    # Another host's writers: their pids mean nothing here (this one is the killed writer's).
    foreign_young = temps / f"{other}-{killed.pid}-1-{'e' * 32}"
    foreign_old = temps / f"{other}-{killed.pid}-2-{'f' * 32}"
    for path in (foreign_young, foreign_old):
        path.write_bytes(b"partial")
    past = time.time() - TEMP_MAX_AGE - 5
    os.utime(foreign_old, (past, past))

    r = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                        "from npa.adapters.storage import open_store; "
                        "open_store(Path(sys.argv[1]).as_uri()).put('c', b'next')", str(root)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(temps.iterdir()) == sorted([live_temp, foreign_young])
    # The live writer finishes: its object lands, its temporary file is gone; the killed one's
    # object was never published.
    assert live.communicate("\n", timeout=60)[0] == ""
    assert live.returncode == 0
    store = open_store(root.as_uri())
    assert store.get("b") == b"x" * 100_000 and store.get("c") == b"next"
    with pytest.raises(ObjectAbsent):
        store.get("a")
    assert list(temps.iterdir()) == [foreign_young]


def test_unknown_profile_is_invalid_input(
    tmp_path: Path, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(InvalidInput, match="no-such-profile"):
        open_store("s3://bucket-x", profile="no-such-profile")


def test_create_if_absent_falls_back_where_the_store_lacks_conditional_writes(
    s3: S3Server, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    s3.client().create_bucket(Bucket=BUCKET)
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        proxy.refuse_conditional = True
        store = open_store(f"s3://{BUCKET}/fb", endpoint_url=endpoint, max_attempts=1)
        assert store.create_if_absent("k", b"first") is True
        assert store.create_if_absent("k", b"second") is False
        assert store.get("k") == b"first"
        # The store said once that it cannot do conditional writes; npa stops asking.
        assert proxy.conditional_puts == 1
        assert getattr(store, "conditional_writes", None) is False
