"""What a killed pulumi leaves half-written in a file:// backend is removed, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.infra.runner import mend_torn_sidecars
from tests.tiers import examples

pytestmark = pytest.mark.unit

# Where the backend keeps files with metadata beside them.
PLACES = [
    ".pulumi/meta.yaml",
    ".pulumi/stacks/npa/a.local.json",
    ".pulumi/stacks/npa/a.local.json.bak",
    ".pulumi/locks/organization/npa/a.local/0b1c.json",
    ".pulumi/backups/npa/a.local/a.local.1796.json",
    ".pulumi/history/npa/a.local/a.local-1796.history.json",
]
WHOLE = (
    json.dumps({"user.content_type": "application/json", "md5": "fRetmf05Ir9u1c=="}) + "\n"
).encode()


@settings(max_examples=examples(60), deadline=None)
@given(cuts=st.lists(st.one_of(st.none(), st.integers(0, len(WHOLE) - 2)), min_size=len(PLACES),
                     max_size=len(PLACES)))  # fmt: skip
def test_only_torn_metadata_is_removed(tmp_path_factory: pytest.TempPathFactory,
                                       cuts: list[int | None]) -> None:  # fmt: skip
    root = tmp_path_factory.mktemp("backend")
    for place, cut in zip(PLACES, cuts, strict=True):
        data = root / place
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("{}")
        Path(f"{data}.attrs").write_bytes(WHOLE if cut is None else WHOLE[:cut])
    removed = mend_torn_sidecars(root)
    assert removed == sorted(
        f"{p}.attrs" for p, c in zip(PLACES, cuts, strict=True) if c is not None
    )
    for place, cut in zip(PLACES, cuts, strict=True):
        assert (root / place).read_text() == "{}"  # the state itself is never touched
        assert (root / f"{place}.attrs").exists() == (cut is None)
    assert mend_torn_sidecars(root) == []  # once is enough


def test_a_backend_without_state_has_nothing_to_mend(tmp_path: Path) -> None:
    assert mend_torn_sidecars(tmp_path) == []
    (tmp_path / ".pulumi").mkdir()
    (tmp_path / ".pulumi" / "x.json.attrs").write_text('"a string is not metadata"')
    assert mend_torn_sidecars(tmp_path) == [".pulumi/x.json.attrs"]
