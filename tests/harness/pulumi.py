"""A Pulumi ``file://`` state backend in a temp dir, driven by the real pulumi CLI."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

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


def file_backend(state_dir: Path, pulumi_bin: Path) -> PulumiBackend:
    state_dir.mkdir(parents=True, exist_ok=True)
    return PulumiBackend(url=f"file://{state_dir}", state_dir=state_dir, pulumi_bin=pulumi_bin)
