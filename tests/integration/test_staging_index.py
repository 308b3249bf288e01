"""The stat index of source staging: unchanged files are reused and racily changed ones
hashed again. The tests wait for the clock to pass the racy window, so they are not unit
tests."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from npa.adapters.storage.base import ObjectStore
from npa.runs.staging import (
    HashIndex,
    hash_file,
    scan_tree,
    stage_source,
    timestamp_granularity_ns,
)
from tests.unit import test_staging as unit
from tests.unit.test_staging import PREFIX

pytestmark = pytest.mark.integration

# The unit file's fixtures, used here by name.
tree = unit.tree
store = unit.store


def _wait_past_racy_window(tree: Path) -> None:
    """Wait until the clock is past every file's change by the index's granularity: an event
    (the clock passing a point), whatever the machine's speed."""
    files = scan_tree(tree)
    newest = max(max(f.mtime_ns, f.ctime_ns) for f in files)
    while time.time_ns() <= newest + timestamp_granularity_ns(files):
        time.sleep(0.005)


def test_stat_index_reuses_unchanged_files_and_rehashes_racy_ones(
    tree: Path, tmp_path: Path
) -> None:
    index = HashIndex()
    _wait_past_racy_window(tree)
    reference = time.time_ns()
    files = scan_tree(tree)
    index.record([hash_file(f) for f in files], reference, timestamp_granularity_ns(files))
    util = next(f for f in files if f.path == "pkg/util.py")
    cached = index.lookup(util)
    assert cached is not None and cached.sha256 == hash_file(util).sha256
    # Changed content changes the stat: the entry no longer matches.
    (tree / "pkg" / "util.py").write_text("X = 42\n")
    changed = next(f for f in scan_tree(tree) if f.path == "pkg/util.py")
    assert index.lookup(changed) is None
    # Racy: an entry confirmed within a timestamp tick of its file's last change is not
    # trusted, because a same-tick write would leave the stat exactly as recorded.
    racy = HashIndex(index.entries, util.mtime_ns + 1, index.granularity_ns)
    assert racy.lookup(util) is None
    saved = tmp_path / "index.json"
    index.save(saved)
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert HashIndex.load(saved).lookup(util) is not None
    saved.write_text("{not json")
    assert HashIndex.load(saved).entries == {}


def test_restaging_with_an_index_reads_only_what_changed(
    tree: Path, store: ObjectStore, tmp_path: Path
) -> None:
    index = tmp_path / "idx.json"
    _wait_past_racy_window(tree)
    first = stage_source(store, tree, PREFIX, index=index)
    assert first.hashed == len(first.files)
    plan = stage_source(store, tree, PREFIX, index=index)
    assert plan.digest == first.digest and plan.uploaded == 0 and plan.hashed == 0
    (tree / "pkg" / "util.py").write_text("X = 7\n")
    other = stage_source(store, tree, "flow/run-2/npa-workflow", index=index)
    assert other.hashed == 1 and other.uploaded == 1
