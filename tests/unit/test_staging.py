"""Source staging against the file store: what is staged, idempotence, repair, immutability."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npa.adapters.storage import open_store
from npa.adapters.storage.base import ObjectStore
from npa.runs.staging import (
    SourceChanged,
    SourceLayout,
    SourceRefused,
    canonical_manifest,
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


def test_the_refused_symlinks_fix_leaves_them_out(tree: Path, tmp_path: Path) -> None:
    """The fix appends the refused links to .npaignore; once it has run, the tree stages
    without them, wherever they point (outside the tree, nowhere, a directory)."""
    (tree / "escape").symlink_to(tmp_path)
    (tree / "dangling").symlink_to(tmp_path / "no-such-file")
    (tree / "pkg" / "up").symlink_to("../")
    with pytest.raises(SourceRefused) as err:
        scan_tree(tree)
    fix = err.value.fix or ""
    assert fix.startswith("printf '%s\\n' ") and str(tree / ".npaignore") in fix
    # What the printf writes: one line per refused link.
    (tree / ".npaignore").write_text("dangling\nescape\npkg/up\n")
    staged = [f.path for f in scan_tree(tree)]
    assert not {"escape", "dangling", "pkg/up"} & set(staged)


def test_a_file_changing_while_read_is_detected(tree: Path) -> None:
    f = next(f for f in scan_tree(tree) if f.path == "pkg/util.py")
    (tree / "pkg" / "util.py").write_text("X = 2  # edited after the scan\n")
    with pytest.raises(SourceChanged, match=r"pkg/util\.py"):
        hash_file(f)


def test_stage_then_rerun_uploads_nothing(tree: Path, store: ObjectStore) -> None:
    first = stage_source(store, tree, PREFIX)
    manifest = first.manifest()
    assert first.digest == manifest.digest() and first.body == manifest.canonical_bytes()
    assert not first.already_committed
    assert first.uploaded == 8  # nine files, two with the same content
    layout = SourceLayout(PREFIX)
    blobs = [o.key for o in store.list(layout.blobs)]
    assert len(blobs) == len({e.digest for e in manifest.files}) == 8
    for entry in manifest.files:
        data = store.get(layout.blob(entry.digest.removeprefix("sha256:")))
        assert data == (tree / entry.path).read_bytes()
    assert next(e for e in manifest.files if e.path == "main.py").mode == 0o755
    again = stage_source(store, tree, PREFIX)
    assert again.already_committed and again.uploaded == 0 and again.repaired == 0
    assert again.manifest() == manifest


def test_rerun_trusts_the_commit_and_verify_repairs(tree: Path, store: ObjectStore) -> None:
    manifest = stage_source(store, tree, PREFIX).manifest()
    layout = SourceLayout(PREFIX)
    digests = sorted({e.digest.removeprefix("sha256:") for e in manifest.files})
    store.delete(layout.blob(digests[0]))
    store.put(layout.blob(digests[1]), b"truncated")
    # A plain re-run confirms the commit and trusts it: it neither lists nor uploads.
    trusted = stage_source(store, tree, PREFIX)
    assert trusted.already_committed and not trusted.listed and trusted.uploaded == 0
    plan = stage_source(store, tree, PREFIX, verify=True)
    assert plan.listed and plan.uploaded == 2 and plan.repaired == 1
    for d in digests[:2]:
        assert len(store.get(layout.blob(d))) == next(
            e.size for e in manifest.files if e.digest == "sha256:" + d
        )


def test_a_different_tree_under_the_same_run_is_refused(tree: Path, store: ObjectStore) -> None:
    manifest = stage_source(store, tree, PREFIX).manifest()
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


def test_runs_of_a_workflow_share_blobs(tree: Path, store: ObjectStore) -> None:
    layout = SourceLayout(PREFIX)
    # Blobs of other trees (another run, or a staging killed before its commit) are shared
    # content and stay: a run's commit never deletes what other runs may name.
    store.put(layout.blob("0" * 64), b"another tree's file")
    first = stage_source(store, tree, PREFIX)
    manifest = first.manifest()
    assert first.listed  # nothing vouched for any blob: the store was asked
    (tree / "pkg" / "util.py").write_text("X = 2\n")
    second_prefix = "flow/run-2/npa-workflow"
    plan = stage_source(store, tree, second_prefix)
    changed = plan.manifest()
    assert plan.uploaded == 1 and not plan.already_committed
    assert {o.key for o in store.list(layout.blobs)} == {layout.blob("0" * 64)} | {
        layout.blob(e.digest.removeprefix("sha256:")) for e in manifest.files + changed.files
    }
    assert store.get(SourceLayout(second_prefix).manifest) == changed.canonical_bytes()
    assert store.get(layout.tree(changed.digest())) == changed.canonical_bytes()


class Recorder:
    def __init__(self) -> None:
        self.totals: dict[str, tuple[int, int]] = {}
        self.done: dict[str, list[int]] = {}

    def begin(self, phase: str, files: int, nbytes: int) -> None:
        self.totals[phase] = (files, nbytes)
        self.done[phase] = [0, 0]

    def advance(self, phase: str, files: int, nbytes: int) -> None:
        self.done[phase][0] += files
        self.done[phase][1] += nbytes


def test_progress_has_totals_before_any_work(tree: Path, store: ObjectStore) -> None:
    seen = Recorder()
    manifest = stage_source(store, tree, PREFIX, progress=seen, jobs=3).manifest()
    total = sum(e.size for e in manifest.files)
    assert seen.totals["hash"] == (len(manifest.files), total)
    distinct = {e.digest: e.size for e in manifest.files}
    assert seen.totals["upload"] == (len(distinct), sum(distinct.values()))
    assert {k: tuple(v) for k, v in seen.done.items()} == seen.totals


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


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1),
            st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
            st.integers(min_value=0, max_value=1 << 40),
            st.integers(min_value=0, max_value=0o7777),
        ),
        max_size=20,
    )
)
def test_canonical_manifest_is_byte_for_byte_json_dumps(
    rows: list[tuple[str, str, int, int]],
) -> None:
    """The hand-written serialiser must give exactly the bytes every earlier manifest has, so
    digests of committed sources never change: any path text, any sizes and modes."""
    entries = [(p, "sha256:" + d, s, m) for p, d, s, m in rows]
    ordered = sorted(entries, key=lambda e: e[0].encode())
    files = [{"digest": d, "mode": m, "path": p, "size": s} for p, d, s, m in ordered]
    reference = json.dumps({"files": files, "version": 1}, sort_keys=True, separators=(",", ":"))
    assert canonical_manifest(entries) == (reference + "\n").encode()
