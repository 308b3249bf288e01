"""A last line of defence: refuse to persist any text that contains a live credential value.

npa writes credentials nowhere by construction (records hold source *names*); this check turns
a future mistake into a loud error instead of a secret on disk.
"""

from __future__ import annotations

import os

from npa.core.errors import SecretLeak

# Variables whose values are credentials. Their names may be written; their values never.
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "NPA_REGISTRY_PASSWORD",
    "DOCKER_PASSWORD",
)


def ensure_secret_free(text: str, where: str) -> str:
    """Return ``text`` unchanged, or raise if it holds a credential value from the environment."""
    for name in CREDENTIAL_VARIABLES:
        value = os.environ.get(name, "")
        # Very short values would match by accident and are not worth protecting this way.
        if len(value) >= 8 and value in text:
            raise SecretLeak(
                f"refusing to write {where}: it would contain the value of {name}",
                fix="report this as an npa bug; nothing was written",
            )
    return text
