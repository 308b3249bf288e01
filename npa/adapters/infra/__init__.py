"""Pulumi Automation API runner for npa's stacks (the programs themselves live in ``stacks/``).

Importing this package is cheap; pulumi is imported only when a stack is opened.
"""
