"""The fault rule (which faults pass by themselves) and the store that waits them out.

Both run in process: the patient store gets a fake clock and a fake pause, and its inner store
is a file store under tmp_path whose calls fail as a corpus of real answers would.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.storage.file import FileStore
from npa.adapters.storage.patient import (
    DEFAULT_PATIENCE,
    FIRST_PAUSE,
    LONGEST_PAUSE,
    PatientStore,
    store_patience,
)
from npa.core.errors import (
    BackendUnavailable,
    BucketAbsent,
    InvalidInput,
    LocalStateUnavailable,
    NpaError,
    ObjectAbsent,
    StoreUnavailable,
    VerificationUnavailable,
    passes_by_itself,
)
from tests.tiers import examples

# Answers a store really gives, as npa's clients turn them into errors, and whether each may
# pass without anyone acting.
CORPUS: list[tuple[str, NpaError, bool]] = [
    ("500 from S3", StoreUnavailable("x", details={"code": "InternalError", "http_status": 500}),
     True),
    ("503 SlowDown", StoreUnavailable("x", details={"code": "SlowDown", "http_status": 503}),
     True),
    ("429", StoreUnavailable("x", details={"code": "TooManyRequests", "http_status": 429}), True),
    ("408", StoreUnavailable("x", details={"code": "RequestTimeout", "http_status": 408}), True),
    ("reset (botocore)", StoreUnavailable("x", details={"code": "", "http_status": None}), True),
    ("silent (obstore)", StoreUnavailable("x", details={"client": "obstore",
                                                        "refused": False}), True),
    ("silent (bounded)", StoreUnavailable("x", details={"timeout_seconds": 15}), True),
    ("NFS EIO", StoreUnavailable("x", details={"errno": errno.EIO}), True),
    ("NFS ESTALE", StoreUnavailable("x", details={"errno": errno.ESTALE}), True),
    ("queue down", BackendUnavailable("x"), True),
    ("AccessDenied", StoreUnavailable("x", details={"code": "AccessDenied", "http_status": 403,
                                                    "refused": True}), False),
    ("no credentials", StoreUnavailable("x", details={"refused": True}), False),
    ("400", StoreUnavailable("x", details={"code": "InvalidRequest", "http_status": 400}), False),
    ("full disk", StoreUnavailable("x", details={"errno": errno.ENOSPC}), False),
    ("read-only", StoreUnavailable("x", details={"errno": errno.EROFS}), False),
    ("no permission", StoreUnavailable("x", details={"errno": errno.EACCES}), False),
    ("unverified source", VerificationUnavailable("x"), False),
    ("no bucket", BucketAbsent("x"), False),
    ("absent", ObjectAbsent("x"), False),
    ("local disk", LocalStateUnavailable("x"), False),
    ("bad input", InvalidInput("x"), False),
]  # fmt: skip


@pytest.mark.parametrize(("what", "error", "passes"), CORPUS, ids=[c[0] for c in CORPUS])
def test_the_rule_knows_which_faults_pass_by_themselves(
    what: str, error: NpaError, passes: bool
) -> None:
    assert passes_by_itself(error) is passes


class Flaky(FileStore):
    """A file store whose next ``failures`` calls fail with ``error``."""

    def __init__(self, root: Path, error: StoreUnavailable, failures: int) -> None:
        super().__init__(root)
        self.error = error
        self.failures = failures
        self.calls = 0

    def _fail(self) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise type(self.error)(self.error.message, details=dict(self.error.details))

    def put(self, key: str, data: bytes, *, content_md5: str | None = None):  # type: ignore[no-untyped-def]
        self._fail()
        return super().put(key, data, content_md5=content_md5)

    def get(self, key: str) -> bytes:
        self._fail()
        return super().get(key)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        self._fail()
        return super().create_if_absent(key, data)


class Clock:
    def __init__(self, *, cost: float = 0.0) -> None:
        self.now = 0.0
        self.cost = cost  # what each call costs (a silent store's timeout)
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        self.now += self.cost
        return self.now


OUTAGE = StoreUnavailable("the store answered InternalError (HTTP 500)",
                          details={"code": "InternalError", "http_status": 500})  # fmt: skip


def patient(inner: Flaky, clock: Clock, patience: float = 60.0, **kw: object) -> PatientStore:
    lines: list[str] = []
    store = PatientStore(inner, patience, sleep=clock.sleep, clock=clock.clock,
                         note=lines.append, **kw)  # type: ignore[arg-type]  # fmt: skip
    store.lines = lines  # type: ignore[attr-defined]
    return store


def test_an_outage_shorter_than_the_patience_costs_only_time(tmp_path: Path) -> None:
    inner, clock = Flaky(tmp_path, OUTAGE, failures=6), Clock()
    store = patient(inner, clock)
    store.put("a/b", b"data")
    assert inner.calls == 7
    assert store.get("a/b") == b"data"
    # Pauses double from the first and never exceed the longest.
    assert clock.pauses == [min(FIRST_PAUSE * 2**i, LONGEST_PAUSE) for i in range(6)]
    assert len(store.lines) == 6  # type: ignore[attr-defined]
    assert "asking again" in store.lines[0]  # type: ignore[attr-defined]


def test_an_outage_longer_than_the_patience_raises_the_last_error_with_its_length(
    tmp_path: Path,
) -> None:
    inner, clock = Flaky(tmp_path, OUTAGE, failures=10**6), Clock()
    store = patient(inner, clock, patience=60.0)
    with pytest.raises(StoreUnavailable) as caught:
        store.get("x")
    assert caught.value.details["outage_seconds"] == pytest.approx(60.0)
    assert max(clock.pauses) == LONGEST_PAUSE
    assert sum(clock.pauses) == pytest.approx(60.0)


@pytest.mark.parametrize(("what", "error", "passes"),
                         [c for c in CORPUS if isinstance(c[1], StoreUnavailable) and not c[2]],
                         ids=lambda v: v if isinstance(v, str) else "")  # fmt: skip
def test_a_fault_a_person_must_fix_is_raised_at_once(
    tmp_path: Path, what: str, error: StoreUnavailable, passes: bool
) -> None:
    inner, clock = Flaky(tmp_path, error, failures=1), Clock()
    with pytest.raises(StoreUnavailable):
        patient(inner, clock).put("k", b"v")
    assert (inner.calls, clock.pauses) == (1, [])


def test_a_cancelled_caller_stops_waiting(tmp_path: Path) -> None:
    inner, clock = Flaky(tmp_path, OUTAGE, failures=10), Clock()
    with pytest.raises(StoreUnavailable):
        patient(inner, clock, stop=lambda: True).get("k")
    assert (inner.calls, clock.pauses) == (1, [])


def test_a_conditional_create_is_never_asked_twice(tmp_path: Path) -> None:
    inner, clock = Flaky(tmp_path, OUTAGE, failures=1), Clock()
    with pytest.raises(StoreUnavailable):
        patient(inner, clock).create_if_absent("k", b"v")
    assert inner.calls == 1


@settings(max_examples=examples(200), deadline=None)
@given(
    failures=st.integers(0, 40),
    patience=st.floats(0, 300),
    cost=st.sampled_from([0.0, 0.2, 2.0, 20.0]),
)
def test_the_store_answers_exactly_when_the_outage_ends_within_the_patience(
    tmp_path_factory: pytest.TempPathFactory, failures: int, patience: float, cost: float
) -> None:
    root = tmp_path_factory.mktemp("store")
    inner, clock = Flaky(root, OUTAGE, failures=failures), Clock(cost=cost)
    store = patient(inner, clock, patience=patience)
    try:
        store.put("k", b"v")
    except StoreUnavailable as error:
        # Given up only once the outage lasted the whole patience, and on the failing answer.
        assert error.details["outage_seconds"] >= patience - 1e-3
        assert inner.failures >= 0 and inner.calls <= failures
    else:
        assert inner.calls == failures + 1
    # Never a pause longer than the longest, and never waiting past the patience in all.
    assert all(0 < p <= LONGEST_PAUSE for p in clock.pauses)
    assert sum(clock.pauses) <= patience + 1e-6


@pytest.mark.parametrize(
    ("value", "expected"), [(None, DEFAULT_PATIENCE), ("", DEFAULT_PATIENCE), ("0", 0.0),
                            ("2.5", 2.5)],
)  # fmt: skip
def test_the_patience_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: float
) -> None:
    if value is None:
        monkeypatch.delenv("NPA_STORE_OUTAGE_SECONDS", raising=False)
    else:
        monkeypatch.setenv("NPA_STORE_OUTAGE_SECONDS", value)
    assert store_patience() == expected


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "1e9"])
def test_a_patience_that_is_not_seconds_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("NPA_STORE_OUTAGE_SECONDS", value)
    with pytest.raises(InvalidInput) as caught:
        store_patience()
    assert caught.value.fix == "export NPA_STORE_OUTAGE_SECONDS=120"
