"""A Pulumi ``file://`` state backend in a temp dir, driven by the real pulumi CLI."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PASSPHRASE = "npa-test-passphrase"


@dataclass
class PulumiBackend:
    url: str
    state_dir: Path
    pulumi_bin: Path

    @property
    def env(self) -> dict[str, str]:
        """Environment for the pulumi CLI and the Automation API."""
        return {
            "PULUMI_BACKEND_URL": self.url,
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            # Nothing here may download plugins: bootstrap-tools installed what is needed.
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            # Dynamic providers run in this interpreter, which has the pulumi SDK installed.
            "PULUMI_PYTHON_CMD": sys.executable,
            "PATH": f"{self.pulumi_bin.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def stack(self, name: str, program: Callable[[], None], project: str = "npa-harness") -> Any:
        """An Automation API stack running ``program`` inline on this backend with the real CLI."""
        from pulumi import automation as auto

        return auto.create_or_select_stack(
            stack_name=name,
            project_name=project,
            program=program,
            opts=auto.LocalWorkspaceOptions(
                pulumi_command=auto.PulumiCommand(root=str(self.pulumi_bin.parent.parent)),
                project_settings=auto.ProjectSettings(
                    name=project, runtime="python", backend=auto.ProjectBackend(url=self.url)
                ),
                secrets_provider="passphrase",
                env_vars=self.env,
            ),
        )


def file_backend(state_dir: Path, pulumi_bin: Path) -> PulumiBackend:
    state_dir.mkdir(parents=True, exist_ok=True)
    return PulumiBackend(url=f"file://{state_dir}", state_dir=state_dir, pulumi_bin=pulumi_bin)
