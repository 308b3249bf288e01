"""One YAML document read as PyYAML's safe loader reads it (SkyPilot's loader), faster for the
plain data npa's task files hold.

``yaml.load`` spends most of its time in PyYAML's Python constructor: a node object for every
value, then a generic walk that resolves, flattens and constructs each. Reading a task file back
(``npa.backends.skypilot.tasks``) needs none of that machinery, so :func:`read_document` builds
the values straight from libyaml's events: a quoted or block scalar is its text, a plain scalar
is resolved and constructed by PyYAML's own resolver and constructors, mappings and sequences
are dicts and lists. Whatever it does not build the same way (anchors, aliases, explicit tags,
merge keys, a key that is a collection, more than one document) and any error go to
``yaml.load`` itself, so the answer, or the exception, is always the loader's.
``tests/unit/test_yamlread.py`` holds that equality as a property over generated documents.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml
from yaml import events
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR = "tag:yaml.org,2002:str"
_RESOLVER = Resolver()
_CONSTRUCTOR = SafeConstructor()


class _NotPlainData(Exception):
    """The document holds something :func:`read_document` leaves to ``yaml.load``."""


def read_document(text: str) -> Any:
    """What ``yaml.load(text, Loader=CSafeLoader)`` returns, or raises."""
    try:
        return _build(text)
    except Exception:  # anything unusual is the loader's to answer
        return yaml.load(text, Loader=_LOADER)  # a safe loader


@lru_cache(maxsize=256)
def _plain(value: str) -> Any:
    """A plain scalar's value, as the safe loader resolves and constructs it (``1`` is an int,
    ``true`` a bool, an empty one None). Task files repeat a handful of them."""
    tag = _RESOLVER.resolve(ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    if tag == _STR:
        return value
    return _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, ScalarNode(tag, value))


def _build(text: str) -> Any:
    parser = _LOADER(text)
    try:
        return _Builder().run(parser)
    finally:
        parser.dispose()


_STARTS = (events.MappingStartEvent, events.SequenceStartEvent)
_ENDS = (events.MappingEndEvent, events.SequenceEndEvent)


class _Builder:
    """Values from events: a stack of the collections being filled, each with the key waiting
    for its value (``_Builder`` itself while none is)."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []
        self.root: Any = None
        self.documents = 0

    def run(self, parser: Any) -> Any:
        stack = self.stack
        while True:
            event = parser.get_event()
            kind = type(event)
            if kind is events.ScalarEvent:
                if event.anchor is not None or event.tag is not None:
                    raise _NotPlainData
                value = event.value if event.style else _plain(event.value)
            elif kind in _ENDS:
                value = stack.pop()[0]
            elif self.structure(event, kind):
                return self.root
            else:
                continue
            if not stack:
                self.root = value
                continue
            top = stack[-1]
            if type(top[0]) is list:
                top[0].append(value)
            elif top[1] is _Builder:
                if type(value) is dict or type(value) is list or value == "<<":
                    raise _NotPlainData  # unhashable, or a merge key: the loader's
                top[1] = value
            else:
                top[0][top[1]] = value
                top[1] = _Builder

    def structure(self, event: Any, kind: type) -> bool:
        """A collection's start, a document's start, an alias: whether the stream ended."""
        if kind in _STARTS:
            if event.anchor is not None or event.tag is not None:
                raise _NotPlainData
            self.stack.append([{} if kind is events.MappingStartEvent else [], _Builder])
        elif kind is events.DocumentStartEvent:
            self.documents += 1
            if self.documents > 1:
                raise _NotPlainData
        elif kind is events.AliasEvent:
            raise _NotPlainData
        return kind is events.StreamEndEvent
