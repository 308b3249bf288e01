"""Credential values: never persisted by npa, and removed from text npa copies from a run.

npa writes credentials nowhere by construction (records hold source *names*);
:func:`ensure_secret_free` turns a future mistake into a loud error instead of a secret on disk.
Text npa copies out of a run (a stage's log tail, its failure detail) can hold a credential the
stage echoed; :mod:`npa.core.redaction` takes out every credential value npa can know of on
this machine and every credential-shaped value, whoever copies the text.
"""

from __future__ import annotations

import os

from npa.core.errors import SecretLeak
from npa.core.redaction import CREDENTIAL_VARIABLES, KnownSecrets, known_secrets, scrub

__all__ = ["CREDENTIAL_VARIABLES", "KnownSecrets", "ensure_secret_free", "known_secrets", "scrub"]


def ensure_secret_free(text: str, where: str) -> str:
    """Return ``text`` unchanged, or raise if it holds a credential value from the environment."""
    for name in CREDENTIAL_VARIABLES:
        value = os.environ.get(name, "")
        # Very short values would match by accident and are not worth protecting this way.
        if len(value) >= 8 and value in text:
            raise SecretLeak(
                f"refusing to write {where}: it would contain the value of {name}; nothing was "
                "written (this is an npa bug: please report it)",
            )
    return text
