"""``workflow diff RUN_A RUN_B``: what two submitted runs launched differently.

Each run's task files are read from its own prefix (the bytes that were launched, checked
against the sha256 its manifest recorded), with what else decided the launch (backend, infra,
images, accelerator names, the source digest) as one more file, ``launch.json`` (the plan is in
the task files; its digest covers the run id). Each run's
own id is set aside, as ``render --diff`` does, so two runs of the same spec and source compare
equal. Reads only; exits 1 when something differs, as ``diff`` does.
"""

from __future__ import annotations

import hashlib
import json

from npa.adapters.storage import ObjectAbsent
from npa.core.errors import EXIT_FAILURE, StateCorrupt
from npa.core.output import Result
from npa.core.paths import NpaPaths
from npa.runs.manifest import RunManifest
from npa.services.artifacts import _require_manifest
from npa.services.locate import Located, locate
from npa.services.render import unified_diff, without_run_id

LAUNCH = "launch.json"


class RunDiffResult(Result):
    """The two runs, the files that differ, and one unified diff of them."""

    run_a: str
    run_b: str
    prefix_a: str
    prefix_b: str
    files_a: dict[str, str]  # file -> sha256 as launched
    files_b: dict[str, str]
    changed: list[str]
    diff: str

    def exit_code(self) -> int:
        return EXIT_FAILURE if self.changed else 0

    def text_lines(self) -> list[str]:
        if not self.changed:
            return [f"runs {self.run_a} and {self.run_b} launched the same tasks (run ids aside)"]
        lines = [f"runs {self.run_a} and {self.run_b} differ in: {', '.join(self.changed)}"]
        return lines + self.diff.rstrip("\n").splitlines()


def _launch_facts(m: RunManifest) -> str:
    facts = {
        "backend": m.backend,
        "infra": m.infra,
        "images": m.images,
        "accelerator_remap": m.accelerator_remap,
        "source_digest": m.source_digest,
        "stages": sorted(m.tasks),
    }
    return json.dumps(facts, indent=2, sort_keys=True) + "\n"


def launched_files(located: Located) -> dict[str, str]:
    """File name -> text of every task file the run launched, plus ``launch.json``."""
    _require_manifest(located)
    m, store, prefix = located.manifest, located.store, located.prefix
    assert m is not None and store is not None and prefix is not None
    stored = {o.key.rsplit("/", 1)[-1]: o.key for o in store.list(f"{prefix}/tasks/")}
    files: dict[str, str] = {}
    for stage, digest in sorted(m.tasks.items()):
        # The task file of a stage is <stage><suffix>; the suffix is the backend's own.
        names = [n for n in stored if n.rsplit(".", 1)[0] == stage]
        where = f"{located.store_uri}/{prefix}/tasks/{stage}.*"
        if len(names) != 1:
            raise StateCorrupt(
                f"run {m.run_id}: {where} does not name exactly one task file ({len(names)})",
                fix=located.status_command(),
            )
        try:
            data = store.get(stored[names[0]])
        except ObjectAbsent:
            raise StateCorrupt(f"run {m.run_id}: {where} vanished while read") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise StateCorrupt(
                f"run {m.run_id}: {located.store_uri}/{stored[names[0]]} is not the task file "
                f"its manifest recorded (sha256 {digest[:12]}...)",
                fix=located.status_command(),
            )
        files[names[0]] = data.decode("utf-8", errors="replace")
    files[LAUNCH] = _launch_facts(m)
    return files


def diff_runs(
    run_a: str, run_b: str, project: str | None, *, paths: NpaPaths | None = None
) -> RunDiffResult:
    """Compare what ``run_a`` and ``run_b`` launched."""
    paths = paths or NpaPaths.from_env()
    a = locate(run_a, project, paths=paths)
    b = locate(run_b, project, paths=paths)
    a.require_own_run()
    b.require_own_run()
    files_a, files_b = launched_files(a), launched_files(b)
    prefix_a, prefix_b = f"{a.store_uri}/{a.prefix}", f"{b.store_uri}/{b.prefix}"
    changed, diff = unified_diff(
        without_run_id(files_a, a.run_id),
        without_run_id(files_b, b.run_id),
        prefix_a,
        prefix_b,
    )
    return RunDiffResult(
        run_a=a.run_id,
        run_b=b.run_id,
        prefix_a=prefix_a,
        prefix_b=prefix_b,
        files_a={n: hashlib.sha256(t.encode()).hexdigest() for n, t in files_a.items()},
        files_b={n: hashlib.sha256(t.encode()).hexdigest() for n, t in files_b.items()},
        changed=changed,
        diff=diff,
    )
