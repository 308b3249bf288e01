"""Kubeconfigs shaped the way platform engineers have them, built from the harness cluster."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tests.harness.kube import KubeCluster

EKS = "arn:aws:eks:us-east-1:123456789012:cluster/gpu-prod"


def split_kubeconfig(kube: KubeCluster, directory: Path, context: str = EKS) -> str:
    """The harness cluster as a KUBECONFIG list: credentials in one file, the context (named
    ``context``) in another, a file that does not exist between them. Returns the list."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    creds, contexts = directory / "credentials.yaml", directory / "contexts.yaml"
    head = {"apiVersion": "v1", "kind": "Config"}
    creds.write_text(
        yaml.safe_dump({**head, "clusters": config["clusters"], "users": config["users"]})
    )
    entry = dict(config["contexts"][0], name=context)
    contexts.write_text(yaml.safe_dump({**head, "contexts": [entry], "current-context": context}))
    for path in (creds, contexts):
        path.chmod(0o600)
    return os.pathsep.join([str(contexts), str(directory / "absent.yaml"), str(creds)])


def unreachable_kubeconfig(path: Path, port: int, context: str = EKS) -> Path:
    """A kubeconfig whose API server address nothing listens on."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
                "contexts": [{"name": context, "context": {"cluster": "gone", "user": "u"}}],
                "current-context": context,
            }
        )
    )
    return path
