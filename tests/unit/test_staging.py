"""Source staging against the file store: what is staged, idempotence, repair, immutability."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npa.adapters.storage import open_store
from npa.adapters.storage.base import ObjectStore
from npa.runs.staging import (
    SourceChanged,
    SourceLayout,
    SourceRefused,
    hash_file,
    scan_tree,
    stage_source,
)

pytestmark = pytest.mark.unit

PREFIX = "flow/run-1/npa-workflow"


def make_tree(root: Path) -> Path:
    files = {
        "main.py": "print('hi')\n",
        "pkg/__init__.py": "",
        "pkg/util.py": "X = 1\n",
        "pkg/same.txt": "dup\n",
        "other/same.txt": "dup\n",
        "build/out.o": "binary",
        "logs/a.log": "log",
        "logs/keep.log": "keep",
        "data/big.bin": "big",
        "data/small.csv": "a,b\n",
        ".git/HEAD": "ref",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (root / "data" / ".npaignore").write_text("*.bin\n")
    os.chmod(root / "main.py", 0o755)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "src")


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return open_store((tmp_path / "store").as_uri())


def test_scan_honours_ignore_files(tree: Path) -> None:
    paths = [f.path for f in scan_tree(tree)]
    assert paths == sorted(paths)
    assert set(paths) == {
        ".gitignore", "main.py", "pkg/__init__.py", "pkg/util.py", "pkg/same.txt",
        "other/same.txt", "logs/keep.log", "data/.npaignore", "data/small.csv",
    }  # fmt: skip


def test_symlinks_inside_are_content_outside_are_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "alias.py").symlink_to("main.py")
    assert "alias.py" in [f.path for f in scan_tree(tree)]
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    (tree / "pkg" / "escape").symlink_to(outside)
    (tree / "up").symlink_to("../")
    with pytest.raises(SourceRefused) as err:
        scan_tree(tree)
    assert "pkg/escape" in err.value.message and "up ->" in err.value.message


def test_a_file_changing_while_read_is_detected(tree: Path) -> None:
    f = next(f for f in scan_tree(tree) if f.path == "pkg/util.py")
    (tree / "pkg" / "util.py").write_text("X = 2  # edited after the scan\n")
    with pytest.raises(SourceChanged, match=r"pkg/util\.py"):
        hash_file(f)


def test_stage_then_rerun_uploads_nothing(tree: Path, store: ObjectStore) -> None:
    manifest, first = stage_source(store, tree, PREFIX)
    assert not first.already_committed
    assert first.uploaded == 8  # nine files, two with the same content
    layout = SourceLayout(PREFIX)
    blobs = [o.key for o in store.list(layout.blobs)]
    assert len(blobs) == len({e.digest for e in manifest.files}) == 8
    for entry in manifest.files:
        data = store.get(layout.blob(entry.digest.removeprefix("sha256:")))
        assert data == (tree / entry.path).read_bytes()
    assert next(e for e in manifest.files if e.path == "main.py").mode == 0o755
    again_manifest, again = stage_source(store, tree, PREFIX)
    assert again.already_committed and again.uploaded == 0 and again.repaired == 0
    assert again_manifest.digest() == manifest.digest()


def test_rerun_repairs_missing_and_damaged_blobs(tree: Path, store: ObjectStore) -> None:
    manifest, _ = stage_source(store, tree, PREFIX)
    layout = SourceLayout(PREFIX)
    digests = sorted({e.digest.removeprefix("sha256:") for e in manifest.files})
    store.delete(layout.blob(digests[0]))
    store.put(layout.blob(digests[1]), b"truncated")
    _, plan = stage_source(store, tree, PREFIX)
    assert plan.uploaded == 2 and plan.repaired == 1
    for d in digests[:2]:
        assert len(store.get(layout.blob(d))) == next(
            e.size for e in manifest.files if e.digest == "sha256:" + d
        )


def test_a_different_tree_under_the_same_run_is_refused(tree: Path, store: ObjectStore) -> None:
    manifest, _ = stage_source(store, tree, PREFIX)
    (tree / "pkg" / "util.py").write_text("X = 3\n")
    (tree / "new.py").write_text("")
    (tree / "other" / "same.txt").unlink()
    with pytest.raises(SourceRefused) as err:
        stage_source(store, tree, PREFIX)
    msg = err.value.message
    for named in ("pkg/util.py (content differs)", "new.py (not in the committed",
                  "other/same.txt (missing"):  # fmt: skip
        assert named in msg
    layout = SourceLayout(PREFIX)
    assert store.get(layout.manifest) == manifest.canonical_bytes()


def test_orphan_blobs_of_an_interrupted_other_tree_are_removed(
    tree: Path, store: ObjectStore
) -> None:
    layout = SourceLayout(PREFIX)
    store.put(layout.blob("0" * 64), b"left by a killed staging of another tree")
    manifest, plan = stage_source(store, tree, PREFIX)
    assert plan.orphans_removed == 1
    assert {o.key for o in store.list(layout.blobs)} == {
        layout.blob(e.digest.removeprefix("sha256:")) for e in manifest.files
    }


def test_progress_reports_every_byte(tree: Path, store: ObjectStore) -> None:
    seen: dict[str, int] = {}

    def progress(phase: str, n: int) -> None:
        seen[phase] = seen.get(phase, 0) + n

    manifest, _ = stage_source(store, tree, PREFIX, progress=progress, jobs=3)
    total = sum(e.size for e in manifest.files)
    assert seen["hash"] == total
    distinct = sum({e.digest: e.size for e in manifest.files}.values())
    assert seen.get("upload", 0) + seen.get("skip", 0) == distinct


def test_hash_index_skips_reading_only_unchanged_files(tree: Path, tmp_path: Path) -> None:
    from npa.runs.staging import HashIndex

    index = tmp_path / "index.json"
    files = scan_tree(tree)
    HashIndex.save(index, [hash_file(f) for f in files])
    fresh = HashIndex.load(index)
    # Just written: every entry is too recent to trust (a same-tick write would not show).
    assert all(fresh.lookup(f) is None for f in files)
    old = HashIndex(fresh.entries, fresh.saved_ns + 10 * HashIndex.RACY_NS)
    util = next(f for f in files if f.path == "pkg/util.py")
    cached = old.lookup(util)
    assert cached is not None and cached.sha256 == hash_file(util).sha256
    (tree / "pkg" / "util.py").write_text("X = 42\n")
    changed = next(f for f in scan_tree(tree) if f.path == "pkg/util.py")
    assert old.lookup(changed) is None
    index.write_text("{not json")
    assert HashIndex.load(index).entries == {}


def test_restaging_with_an_index_gives_the_same_manifest(
    tree: Path, store: ObjectStore, tmp_path: Path
) -> None:
    index = tmp_path / "idx.json"
    manifest, _ = stage_source(store, tree, PREFIX, index=index)
    assert index.exists()
    again, plan = stage_source(store, tree, PREFIX, index=index)
    assert again.digest() == manifest.digest() and plan.uploaded == 0


def test_byte_budget_bounds_memory_but_admits_one_big_file() -> None:
    import threading

    from npa.runs.staging import ByteBudget

    budget = ByteBudget(100)
    seen: list[tuple[int, int]] = []  # (this holder's size, bytes held by all at that moment)
    guard = threading.Lock()

    def use(n: int) -> None:
        with budget.hold(n):
            with guard:
                seen.append((n, budget.used))
            threading.Event().wait(0.01)

    threads = [threading.Thread(target=use, args=(n,)) for n in [60, 60, 30, 500, 10] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert budget.used == 0 and len(seen) == 20
    assert all(used == 500 for n, used in seen if n == 500)  # the big file runs alone
    assert all(used <= 100 for n, used in seen if n != 500)
