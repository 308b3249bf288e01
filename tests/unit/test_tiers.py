"""The one definition of a test's tier (tests/tiers.py) over the paths and markers a test can
have: every test gets exactly one tier or a refusal that says why, never a guess."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tiers import CLUSTER_MODULE, TIERS, TierError, examples, nodeid_tier, tier_of

pytestmark = pytest.mark.unit

CASES = [
    ("tests/unit/test_spec.py", set(), "unit"),
    ("tests/unit/test_spec.py", {"unit"}, "unit"),
    ("tests/unit/deeper/test_x.py", {"parametrize"}, "unit"),
    ("tests/integration/test_storage.py", set(), "integration"),
    ("tests/integration/test_storage.py", {"integration", "skip"}, "integration"),
    (CLUSTER_MODULE, {"cluster"}, "cluster"),
    (CLUSTER_MODULE, {"cluster", "opt_in"}, "cluster"),
    ("tests/integration/test_storage.py", {"opt_in"}, "integration"),
    (CLUSTER_MODULE, set(), "cluster"),
]

REFUSED = [
    ("tests/test_top.py", set(), "no tier"),
    ("tests/fakes/test_entry.py", set(), "no tier"),
    ("other/tests/unit/test_x.py", {"unit"}, "no tier"),
    ("tests/unitx/test_x.py", {"unit"}, "no tier"),
    ("tests/unit/test_spec.py", {"integration"}, "marked integration but lives in the unit"),
    ("tests/unit/test_spec.py", {"cluster"}, "marked cluster"),
    ("tests/integration/test_storage.py", {"unit"}, "marked unit"),
    ("tests/integration/test_storage.py", {"cluster"}, "marked cluster"),
    (CLUSTER_MODULE, {"integration", "cluster"}, "marked cluster, integration"),
    ("tests/unit/test_spec.py", {"opt_in"}, "only the integration and cluster tiers"),
]


@pytest.mark.parametrize(("path", "markers", "tier"), CASES)
def test_each_test_has_its_folders_tier(path: str, markers: set[str], tier: str) -> None:
    assert tier_of(path, markers) == tier
    assert nodeid_tier(f"{path}::test_x[param]") == tier


@pytest.mark.parametrize(("path", "markers", "says"), REFUSED)
def test_no_tier_or_a_contradicted_one_is_refused_with_the_reason(
    path: str, markers: set[str], says: str
) -> None:
    with pytest.raises(TierError, match=says):
        tier_of(path, markers)


FOLDERS = st.sampled_from(
    ["tests/unit", "tests/integration", "tests", "tests/fakes", "tests/harness", "src/tests/unit"]
)
MARKERS = st.sets(st.sampled_from([*TIERS, "opt_in", "skip", "parametrize"]))


@given(
    folder=FOLDERS,
    name=st.sampled_from(["test_a.py", "sub/test_b.py", CLUSTER_MODULE.rsplit("/", 1)[1]]),
    markers=MARKERS,
)
def test_a_tier_is_one_of_three_and_never_contradicts_a_declared_one(
    folder: str, name: str, markers: set[str]
) -> None:
    path = f"{folder}/{name}"
    try:
        tier = tier_of(path, markers)
    except TierError:
        declared = markers & set(TIERS)
        outside = not (path.startswith(("tests/unit/", "tests/integration/")))
        assert outside or len(declared) >= 1 or "opt_in" in markers
        return
    assert tier in TIERS
    assert markers & set(TIERS) <= {tier}
    assert (tier == "cluster") == (path == CLUSTER_MODULE)


def test_make_check_samples_properties_and_make_test_runs_them_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NPA_TEST_FAST", raising=False)
    assert examples(300) == 300
    monkeypatch.setenv("NPA_TEST_FAST", "1")
    assert examples(300) == 20 and examples(5) == 5
