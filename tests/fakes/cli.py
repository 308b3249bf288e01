"""``python -m tests.fakes.cli ARGS...``: the npa CLI with the managed-jobs double."""

from __future__ import annotations

from tests.fakes.entry import install

if __name__ == "__main__":
    install()
    from npa.cli.main import run

    run()
