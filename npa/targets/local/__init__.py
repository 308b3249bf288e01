"""The ``local`` target: this machine's store and executor directories."""
