"""Insights rules without a store: metrics schemas and the order in which divergence is told."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from npa.insights.compare import first_divergence, pair_stages
from npa.insights.scan import RunFacts, StageFacts, parse_metrics, redact_facts
from npa.runs.secrets import known_secrets

pytestmark = pytest.mark.unit


def stage(name: str, position: int, **over: object) -> StageFacts:
    base: dict[str, object] = dict(
        stage=name, position=position, state="SUCCEEDED", classification=None, detail=None,
        started_at=None, ended_at=None, duration_s=1.0, waves=1, attempts=1, recoveries=0,
        tool="t", image="r/i@sha256:aa", output_bytes=10,
    )  # fmt: skip
    base.update(over)
    return StageFacts(**base)  # type: ignore[arg-type]


def run(run_id: str, state: str, stages: list[StageFacts]) -> RunFacts:
    return RunFacts("wf", run_id, "p", "local", state, "", "", "file:///x", "h", {}, stages)


def test_metrics_schemas() -> None:
    assert parse_metrics("metrics.json", b'{"a": 1, "b": {"c": 2.5}, "s": "x", "t": true}') == {
        "a": 1.0,
        "b.c": 2.5,
    }
    lines = b'{"name": "loss", "value": 3}\n{"name": "loss", "value": 2}\nnot json\n{"acc": 0.9}\n'
    assert parse_metrics("metrics.jsonl", lines) == {"loss": 2.0, "acc": 0.9}
    assert parse_metrics("metrics.json", b"[1, 2") == {}


def test_an_earlier_image_change_is_stated_after_a_state_change_but_before_retries() -> None:
    base = run("a", "SUCCEEDED", [stage("one", 0), stage("two", 1)])
    failed = run("b", "FAILED", [
        stage("one", 0, attempts=2),
        stage("two", 1, state="FAILED", classification="payload"),
    ])  # fmt: skip
    pairs = pair_stages(base, failed)
    hit = first_divergence(base, pairs, failed)
    assert hit is not None and (hit.stage, hit.facet) == ("two", "state")
    assert hit.candidate == "FAILED (payload)"

    moved = run(
        "c", "SUCCEEDED", [stage("one", 0, attempts=2), stage("two", 1, image="r/i@sha256:bb")]
    )
    hit = first_divergence(base, pair_stages(base, moved), moved)
    assert hit is not None and (hit.stage, hit.facet) == ("two", "image")


def test_durations_alone_are_no_divergence() -> None:
    base = run("a", "SUCCEEDED", [stage("one", 0)])
    slow = run("b", "SUCCEEDED", [stage("one", 0, duration_s=99.0)])
    assert first_divergence(base, pair_stages(base, slow), slow) is None


def test_every_text_copied_from_a_run_loses_its_credential_values(tmp_path: Path) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(b"robot:hunter2-registry").decode()
    (docker / "config.json").write_text(json.dumps({"auths": {"reg.example.com": {"auth": auth}}}))
    (tmp_path / "aws").write_text("[default]\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n")
    kube = tmp_path / "kubeconfig"
    kube.write_text("users:\n- name: u\n  user: {token: kube-bearer-token-1}\n")
    env = {
        "HOME": str(tmp_path),
        "DOCKER_CONFIG": str(docker),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws"),
        "KUBECONFIG": str(kube),
        "MY_REGISTRY_PASSWORD": "pw-from-env",
        "REG_AUTH": "ci-bot:auth-from-env",
        "PATH": "/usr/bin:/bin",
        "SHORT_TOKEN": "abc",
    }
    secrets = known_secrets(env)
    leaked = (
        "hunter2-registry wJalrXUtnFEMI/K7MDENG kube-bearer-token-1 pw-from-env "
        f"auth-from-env Basic {auth} /usr/bin:/bin abc"
    )
    facts = run("r", "FAILED", [stage("one", 0, detail=leaked, log_tails={"k": leaked})])
    facts.supervisor = {"attempts": [{"detail": leaked}]}
    facts.run_logs = {"logs/supervisor.log": leaked}
    clean = redact_facts(facts, secrets)
    for text in (
        clean.stages[0].detail,
        clean.stages[0].log_tails["k"],
        clean.supervisor["attempts"][0]["detail"],
        clean.run_logs["logs/supervisor.log"],
    ):
        for value in ("hunter2-registry", "wJalrXUtnFEMI", "kube-bearer", "pw-from-env",
                      "auth-from-env", auth):  # fmt: skip
            assert value not in text
        assert f"[REDACTED:docker-config:{docker / 'config.json'}]" in text
        assert "[REDACTED:env:MY_REGISTRY_PASSWORD]" in text
        assert text.endswith("/usr/bin:/bin abc")  # not credentials: kept as they are
