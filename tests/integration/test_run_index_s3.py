"""The per-project run index on S3 (moto over HTTP, the real CLI in a subprocess, a counting
proxy in front): ``list`` and ``status`` of one project send requests in proportion to what they
print, never one for another project's runs; a missing index is repaired from the manifests; a
manifest copied under another run's key is flagged, never shown as a second run. Both S3
clients. (The file store's twins: tests/unit/test_run_index.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest

from npa.adapters.storage import S3_CLIENT_ENV, S3_CLIENTS
from npa.core.layout import (
    manifest_key,
    run_index_complete_key,
    run_index_key,
    run_index_prefix,
    run_prefix,
)
from npa.core.paths import NpaPaths
from npa.runs.manifest import RunManifest
from npa.runs.receipts import Receipt, write_receipt
from tests.harness.cli import CliResult, run_npa
from tests.harness.s3 import S3Server
from tests.integration.store_proxy import ProxyState, store_proxy

pytestmark = pytest.mark.integration

BUCKET = "npa-index"
ROOT = "runs"  # the stores' prefix in the bucket
WF = ("workbench", "workflow")
NOW = "2026-01-01T00:00:00+00:00"


def run_id(n: int) -> str:
    return f"202601{1 + n // 1440:02d}-{n // 60 % 24:02d}{n % 60:02d}00-{n * 7919 % 0xFFFFFF:06x}"


@dataclass
class Store:
    s3: S3Server
    env: dict[str, str]
    proxy: ProxyState

    def key(self, key: str) -> str:
        return f"{ROOT}/{key}"

    def run(self, n: int, project: str, *, workflow: str = "wf", indexed: bool = True) -> str:
        """A run as submit leaves it (its marker unless ``indexed`` is False, its manifest)."""
        rid = run_id(n)
        prefix = run_prefix(workflow, rid)
        client = self.s3.client()
        if indexed:
            client.put_object(Bucket=BUCKET, Key=self.key(run_index_key(project, workflow, rid)),
                              Body=b"{}")  # fmt: skip
        m = RunManifest(
            project=project, workflow=workflow, run_id=rid, backend="local", infra="local",
            state="SUCCEEDED", submitted_at=NOW, updated_at=NOW, store=f"s3://{BUCKET}/{ROOT}",
            prefix=prefix, spec_sha256="x", source_digest=None, plan_digest="x", tasks={},
            images={}, job_name=f"npa-{workflow}-{rid}", job_id=n,
        )  # fmt: skip
        body = json.dumps(m.model_dump(mode="json")).encode()
        client.put_object(Bucket=BUCKET, Key=self.key(manifest_key(prefix)), Body=body)
        return rid

    def keys(self, prefix: str) -> set[str]:
        pages = self.s3.client().get_paginator("list_objects_v2")
        found = set()
        for page in pages.paginate(Bucket=BUCKET, Prefix=self.key(prefix)):
            found |= {o["Key"].removeprefix(f"{ROOT}/") for o in page.get("Contents", [])}
        return found

    def npa(self, *argv: str) -> tuple[CliResult, list[str]]:
        """Run the CLI through the proxy; returns its result and the requests it sent."""
        self.proxy.requests.clear()
        res = run_npa(*argv, env=self.env)
        return res, list(self.proxy.requests)

    def list(self, project: str, limit: int = 50) -> tuple[dict[str, Any], list[str]]:
        res, sent = self.npa(*WF, "list", "--project", project, "--limit", str(limit), "--json")
        assert res.code in (0, 4), res.stdout + res.stderr
        return res.json(), sent


def listings(sent: list[str]) -> list[str]:
    """The prefixes of the listing requests among ``sent``."""
    out = []
    for line in sent:
        url = urlparse(line.split(" ", 1)[1])
        query = parse_qs(url.query)
        if "list-type" in query:
            out.append(query.get("prefix", [""])[0].removeprefix(f"{ROOT}/"))
    return out


def reads(sent: list[str]) -> list[str]:
    """The keys of the object GETs among ``sent``."""
    return [
        unquote(urlparse(line.split(" ", 1)[1]).path).removeprefix(f"/{BUCKET}/{ROOT}/")
        for line in sent
        if line.startswith("GET ") and "list-type" not in line
    ]


@pytest.fixture(params=S3_CLIENTS)
def store(request: pytest.FixtureRequest, s3: S3Server, npa_home: Path) -> Iterator[Store]:
    s3.client().create_bucket(Bucket=BUCKET)
    with store_proxy(s3.endpoint_url) as (endpoint, proxy):
        env = {**s3.env, "AWS_ENDPOINT_URL_S3": endpoint, S3_CLIENT_ENV: request.param,
               "NPA_HOME": str(npa_home), "HOME": str(npa_home.parent)}  # fmt: skip
        for project in ("demo", "other"):
            r = run_npa("configure", "--project", project, "--store", f"s3://{BUCKET}/{ROOT}",
                        env=env)  # fmt: skip
            assert r.code == 0, r.stderr
        yield Store(s3, env, proxy)


def test_list_sends_one_listing_and_one_read_per_run_printed(store: Store) -> None:
    mine = [store.run(n, "demo") for n in range(0, 80, 2)]
    theirs = [store.run(n, "other") for n in range(1001, 1121, 3)]
    store.list("demo")  # completes the index: nothing from before it to read
    assert run_index_complete_key("demo") in store.keys(run_index_prefix("demo"))

    listed, sent = store.list("demo", limit=10)
    newest = sorted(mine, reverse=True)[:10]
    assert [r["run_id"] for r in listed["runs"]] == newest and listed["truncated"]
    assert listings(sent) == [run_index_prefix("demo")]
    assert sorted(reads(sent)) == sorted(manifest_key(run_prefix("wf", r)) for r in newest)
    assert len(sent) == 1 + 10  # <= 1 + limit + listing pages, whatever the other project holds
    assert not any(rid in line for line in sent for rid in theirs)


def test_list_of_fifty_among_a_thousand_runs_sends_one_listing_and_fifty_reads(
    store: Store,
) -> None:
    """Issue 34's bound, 1 + 50 + listing pages, at a scale where the store holds more than one
    listing page (1,000 keys) of other objects: 400 runs of each project are 1,600 keys, so a
    listing of the store, of the run folders or of the other project's index would cost pages
    the bound has no room for. (20,000 runs take minutes to plant in moto and change no
    request: the index is listed from its newest marker, one page of limit + 2 keys.)"""
    with ThreadPoolExecutor(8) as pool:
        mine = list(pool.map(lambda n: store.run(n, "demo", workflow=f"wf{n % 3}"),
                             range(0, 800, 2)))  # fmt: skip
        list(pool.map(lambda n: store.run(n, "other", workflow=f"wf{n % 3}"), range(1, 800, 2)))
    assert len(store.keys("")) > 1000
    store.list("demo")  # completes the index: nothing from before it to read

    listed, sent = store.list("demo", limit=50)
    newest = sorted(mine, reverse=True)[:50]
    assert [r["run_id"] for r in listed["runs"]] == newest and listed["truncated"]
    assert all(r["recorded_state"] == "SUCCEEDED" for r in listed["runs"])
    assert listings(sent) == [run_index_prefix("demo")]
    assert len(reads(sent)) == 50
    assert len(sent) <= 1 + 50 + len(listings(sent)), sent


def test_list_of_fifty_among_ten_thousand_runs_of_each_project(store: Store) -> None:
    """Issue 34's shape on S3: 10,000 markers of the project and 10,000 of another, the other
    project's runs with manifests too (1,000 of them: planting costs moto a millisecond an
    object). The older runs and the other project's are planted in moto's own backend (this
    process runs the server), not over HTTP; the list is the real CLI over HTTP through the
    counting proxy: one listing page and the 50 manifests it prints, nothing of the other
    project. The whole process never imports pydantic (its import costs more than the list)."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    count = 10_000
    newest = [store.run(2 * n, "demo") for n in range(count - 60, count)][::-1][:50]
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    theirs = set()
    for n in range(count):
        mine, their = run_id(2 * n), run_id(2 * n + 1)
        theirs.add(their)
        backend.put_object(BUCKET, store.key(run_index_key("demo", "wf", mine)), b"{}")
        backend.put_object(BUCKET, store.key(run_index_key("other", "wf", their)), b"{}")
        if n < 1000:
            body = b'{"project": "other", "workflow": "wf", "run_id": "%s"}' % their.encode()
            backend.put_object(BUCKET, store.key(manifest_key(run_prefix("wf", their))), body)
    backend.put_object(BUCKET, store.key(run_index_complete_key("demo")), b"{}")

    store.proxy.requests.clear()
    res = run_npa(*WF, "list", "--project", "demo", "--limit", "50", "--json",
                  env={**store.env, "PYTHONPROFILEIMPORTTIME": "1"})  # fmt: skip
    sent = list(store.proxy.requests)
    assert res.code == 0, res.stderr[-2000:]
    listed = res.json()
    assert [r["run_id"] for r in listed["runs"]] == newest and listed["truncated"]
    assert listings(sent) == [run_index_prefix("demo")]
    assert sorted(reads(sent)) == sorted(manifest_key(run_prefix("wf", r)) for r in newest)
    assert len(sent) == 1 + 50
    assert not any(rid in line for line in sent for rid in theirs)
    assert "pydantic" not in res.stderr  # the import profile: every module the process loaded


def test_a_missing_index_is_repaired_from_the_manifests(store: Store) -> None:
    mine = {store.run(n, "demo", indexed=False) for n in range(0, 30, 2)}
    theirs = {store.run(n, "other", indexed=False) for n in range(1001, 1031, 2)}

    listed, sent = store.list("demo")
    assert {r["run_id"] for r in listed["runs"]} == mine
    assert "indexed 30 runs" in listed["index_note"]
    assert store.keys(run_index_prefix("demo")) == {
        run_index_key("demo", "wf", r) for r in mine
    } | {run_index_complete_key("demo")}
    other = {run_index_key("other", "wf", r) for r in theirs}
    assert store.keys(run_index_prefix("other")) == other

    # From now on the index alone: one listing, one read per run printed.
    again, sent = store.list("demo", limit=5)
    assert again["index_note"] is None and len(sent) == 1 + 5

    # Markers deleted: the next list still shows every run, and writes them again.
    client = store.s3.client()
    for key in store.keys(run_index_prefix("demo")):
        client.delete_object(Bucket=BUCKET, Key=store.key(key))
    repaired, sent = store.list("demo")
    assert {r["run_id"] for r in repaired["runs"]} == mine
    assert len(store.keys(run_index_prefix("demo"))) == len(mine) + 1
    # The repair read only runs no index named: the other project's are still indexed.
    assert not any(rid in key for key in reads(sent) for rid in theirs)


def test_a_copied_manifest_is_flagged_and_never_a_second_run(store: Store) -> None:
    genuine = store.run(1, "demo")
    victim = store.run(2, "demo")
    store.list("demo")
    client = store.s3.client()
    source = {"Bucket": BUCKET, "Key": store.key(manifest_key(run_prefix("wf", genuine)))}
    for workflow, rid in (("wf", victim), ("copied", run_id(3))):
        client.copy_object(CopySource=source, Bucket=BUCKET,
                           Key=store.key(manifest_key(run_prefix(workflow, rid))))  # fmt: skip
    listed, _ = store.list("demo")
    rows = {r["run_id"]: r for r in listed["runs"]}
    assert set(rows) == {genuine, victim}
    assert rows[genuine]["recorded_state"] == "SUCCEEDED"
    assert rows[victim]["recorded_state"] == "VERIFICATION_UNAVAILABLE"
    assert rows[victim]["error"].startswith("run_mismatch: ")
    status, _ = store.npa(*WF, "status", f"s3://{BUCKET}/{ROOT}/wf/{victim}", "--project",
                          "demo", "--cached", "--json")  # fmt: skip
    assert status.json()["reason"] == rows[victim]["error"].removeprefix("run_mismatch: ")


def test_status_without_a_receipt_asks_the_index(store: Store) -> None:
    for n in range(8):
        store.run(1000 + n, "other", workflow=f"wf{n}")
    rid = store.run(5, "demo", workflow="mine")
    store.list("demo")
    res, sent = store.npa(*WF, "status", rid, "--project", "demo", "--cached", "--json")
    assert res.code == 0 and res.json()["workflow"] == "mine", res.stdout
    # The run's markers, its manifest, its plan (for the stage order): nothing of the others.
    # (obstore lists the index's folder from just before the run's markers; botocore lists
    # the run's markers by their prefix: one request either way.)
    [listing] = listings(sent)
    assert listing.startswith(run_index_prefix("demo")), sent
    assert len(sent) <= 3, sent
    res, sent = store.npa(*WF, "status", run_id(77), "--project", "demo", "--json")
    assert res.code == 3 and res.json()["state"] == "NOT_FOUND"
    assert len(sent) == 2, sent  # the run's markers, then the index's completeness mark


def test_status_with_a_receipt_reads_one_to_three_objects(store: Store, npa_home: Path) -> None:
    """With the receipt submit leaves, ``status --cached`` of one run among others asks the
    store for that run alone: its manifest and plan, nothing of the index or other runs."""
    for n in range(8):
        store.run(1000 + n, "other", workflow=f"wf{n}")
    rid = store.run(5, "demo", workflow="mine")
    store.list("demo")
    uri = f"s3://{BUCKET}/{ROOT}"
    write_receipt(
        NpaPaths(npa_home),
        Receipt(
            project="demo", project_identity="x", workflow="mine", run_id=rid,
            submitted_at=NOW, store=uri, workflow_prefix=f"{uri}/{run_prefix('mine', rid)}",
            credentials_source="environment (AWS_ACCESS_KEY_ID)",
        ),
    )  # fmt: skip
    res, sent = store.npa(*WF, "status", rid, "--project", "demo", "--cached", "--json")
    assert res.code == 0 and res.json()["workflow"] == "mine", res.stdout
    assert 1 <= len(sent) <= 3, sent
    assert not listings(sent), sent
    assert manifest_key(run_prefix("mine", rid)) in reads(sent)


def test_a_paged_run_reads_its_manifest_its_pages_and_nothing_else(
    store: Store, tmp_path: Path
) -> None:
    """A run of 1,000 stages keeps its records in 8 pages and an order beside the manifest:
    ``status`` reads those (and the plan), concurrently where the client does, and shows every
    stage in plan order; ``list`` reads the manifest alone."""
    from npa.adapters.storage import open_store
    from npa.runs.manifest import StageRecord, pages_for, write_manifest

    rid = run_id(9)
    prefix = run_prefix("big", rid)
    names = [f"stage-{i:04d}" for i in range(1000)]
    m = RunManifest(
        project="demo", workflow="big", run_id=rid, backend="local", infra="local",
        state="SUCCEEDED", submitted_at=NOW, updated_at=NOW, store=f"s3://{BUCKET}/{ROOT}",
        prefix=prefix, spec_sha256="x", source_digest=None, plan_digest="x",
        tasks={n: "0" * 64 for n in names}, order=names, images={}, job_name=f"npa-big-{rid}",
        job_id=9, stages={n: StageRecord(state="SUCCEEDED") for n in reversed(names)},
    )  # fmt: skip
    # Written by npa's own writer (to a file store), then put in the bucket object by object.
    local = tmp_path / "written"
    local.mkdir()
    write_manifest(open_store(local.as_uri()), m)
    client = store.s3.client()
    written = sorted(p for p in local.rglob("*") if p.is_file())
    for path in written:
        key = store.key(path.relative_to(local).as_posix())
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    client.put_object(Bucket=BUCKET, Key=store.key(run_index_key("demo", "big", rid)), Body=b"{}")
    pages = pages_for(1000)
    assert pages == 8 and len(written) == 1 + pages + 1

    res, sent = store.npa(*WF, "status", f"s3://{BUCKET}/{ROOT}/{prefix}", "--project", "demo",
                          "--cached", "--json")  # fmt: skip
    assert res.code == 0, res.stdout + res.stderr
    assert list(res.json()["stages"]) == names
    assert {s["state"] for s in res.json()["stages"].values()} == {"SUCCEEDED"}
    got = reads(sent)
    page_keys = {f"{prefix}/manifest-pages/{n:04d}.json" for n in range(pages)}
    assert got[0] == manifest_key(prefix), got  # the manifest before its pages
    assert page_keys | {f"{prefix}/manifest-pages/order.json"} <= set(got)
    assert len(got) == len(set(got)) <= 1 + pages + 1 + 1, got  # and the plan, once each

    listed, sent = store.list("demo")
    assert [r["run_id"] for r in listed["runs"]] == [rid]
    assert not any("manifest-pages" in key for key in reads(sent)), sent
