"""npa's kubeconfig merge against the real kubectl over generated multi-file KUBECONFIGs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npa.adapters.kube import kubeconfig
from tests.harness.tools import require_tool
from tests.unit.test_kubeconfig import EKS, GKE, _write

pytestmark = pytest.mark.integration


NAMES = st.sampled_from([EKS, GKE, "kind-npa", "admin@prod"])


SERVERS = st.sampled_from(["https://one", "https://two", "https://three"])


@st.composite
def kubeconfig_files(draw: st.DrawFn) -> list[dict[str, object]]:
    files = []
    for _ in range(draw(st.integers(1, 3))):
        contexts = draw(st.lists(NAMES, max_size=3, unique=True))
        cluster_names = draw(st.lists(st.sampled_from(["c1", "c2"]), max_size=2, unique=True))
        body: dict[str, object] = {
            "clusters": [{"name": c, "cluster": {"server": draw(SERVERS)}} for c in cluster_names],
            "users": [{"name": "u", "user": {"token": draw(st.sampled_from(["t1", "t2"]))}}],
            "contexts": [
                {
                    "name": n,
                    "context": {
                        "cluster": draw(st.sampled_from(["c1", "c2"])),
                        "user": "u",
                        "namespace": draw(st.sampled_from(["a", "b"])),
                    },
                }
                for n in contexts
            ],
        }
        if draw(st.booleans()) and contexts:
            body["current-context"] = draw(st.sampled_from(contexts))
        files.append(body)
    return files


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kubeconfig_files())
def test_merge_agrees_with_kubectl(tmp_path: Path, files: list[dict[str, object]]) -> None:
    kubectl = require_tool("NPA_KUBECTL_BIN", "kubectl")
    written = [_write(tmp_path / f"f{i}" / "config", body) for i, body in enumerate(files)]
    listed = os.pathsep.join(str(p) for p in written)
    merged = kubeconfig.merge(written)
    for name in [EKS, GKE, "kind-npa", "admin@prod"]:
        proc = subprocess.run(
            [str(kubectl), "config", "view", "--raw", "--minify", "--context", name, "-o", "json"],
            env={"KUBECONFIG": listed, "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            ours = yaml.safe_load(kubeconfig.minimal(merged, name))
        except kubeconfig.KubeconfigError:
            assert proc.returncode != 0, f"kubectl resolved {name} where npa did not"
            continue
        assert proc.returncode == 0, proc.stderr
        theirs = json.loads(proc.stdout)
        assert theirs["contexts"] == ours["contexts"]
        assert theirs["clusters"] == ours["clusters"]
        assert [u["user"] for u in theirs["users"]] == [u["user"] for u in ours["users"]]
    current = subprocess.run(
        [str(kubectl), "config", "current-context"],
        env={"KUBECONFIG": listed, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (current.stdout.strip() or None) == merged.current_context
