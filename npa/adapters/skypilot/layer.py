"""npa's layer of SkyPilot configuration for a run's launch.

SkyPilot merges the client's configuration into every request and ships it, with each managed
job, to the jobs controller, which launches the job's tasks with it. npa adds its layer on top
of the user's own configuration, for the launch request only and in this process only:

- ``kubernetes.namespace``: the namespace provisioning created for the project, so the jobs
  controller and the task pods run where the project's RBAC is;
- ``kubernetes.remote_identity``: the service account provisioning created there;
- ``kubernetes.pod_config``: every pod (controller and tasks) takes the run store's credentials
  and endpoint from the project's store Secret as environment variables. The controller reads
  the store (a task's source is an ``s3://`` file mount) and each task writes its outputs there.

The layer names the Secret; it holds no credential.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from npa.adapters.kube.secrets import SECRET_NAME

SERVICE_ACCOUNT = "sky-sa"


def run_layer(namespace: str) -> dict[str, Any]:
    """The configuration npa lays over the user's for a launch into ``namespace``."""
    return {
        "kubernetes": {
            "namespace": namespace,
            "remote_identity": SERVICE_ACCOUNT,
            "pod_config": {
                "spec": {"containers": [{"envFrom": [{"secretRef": {"name": SECRET_NAME}}]}]}
            },
        }
    }


@contextlib.contextmanager
def applied(layer: dict[str, Any] | None) -> Iterator[None]:
    """SkyPilot's client configuration with ``layer`` over it, for the calls inside the block."""
    if not layer:
        yield
        return
    from sky import skypilot_config
    from sky.utils import config_utils

    merged = skypilot_config.overlay_skypilot_config(
        skypilot_config.to_dict(), config_utils.Config(layer)
    )
    with skypilot_config.replace_skypilot_config_in_process(merged):
        yield
