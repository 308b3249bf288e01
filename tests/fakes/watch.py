"""``python -m tests.fakes.watch DIR``: the run watcher with the managed-jobs double."""

from __future__ import annotations

import sys

from tests.fakes.entry import install

if __name__ == "__main__":
    install()
    from npa.launch.watch import main

    raise SystemExit(main(sys.argv[1:]))
