"""YAML read straight from libyaml's events into plain values, as PyYAML's safe loader (SkyPilot's
loader) reads them, for the two readers that see large documents: a task file read back
(:func:`read_document`) and a workflow spec (``npa.spec.loader``).

``yaml.load`` spends most of its time in PyYAML's Python constructor: a node object for every
value, then a generic walk that resolves, flattens and constructs each. Plain data needs none of
that: :class:`EventReader` builds the values from the events, a quoted or block scalar is its
text, a plain scalar is resolved and constructed by PyYAML's own resolver and constructors,
mappings and sequences are dicts and lists. Whatever it does not build the same way (anchors,
aliases, explicit tags, merge keys, a key that is a collection, more than one document, deep
nesting) raises :class:`NotPlainData`, and the caller asks its full reader, so the answer, or the
error, is always that reader's. ``tests/unit/test_yamlread.py`` holds the equality as a property
over generated documents.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, ClassVar

import yaml
from yaml import events
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR = "tag:yaml.org,2002:str"
_RESOLVER = Resolver()
_CONSTRUCTOR = SafeConstructor()
_STARTS = (events.MappingStartEvent, events.SequenceStartEvent)
_ENDS = (events.MappingEndEvent, events.SequenceEndEvent)


class _Everything:
    def __contains__(self, _: object) -> bool:
        return True


# The first characters a plain scalar that is not a string can start with (the safe loader's
# implicit resolvers are chosen by it; "" is the empty scalar, null): any other is a string.
# A resolver registered for any first character (None) makes every plain scalar a candidate.
_RESOLVED_FIRST: frozenset[str] | _Everything = (
    _Everything()
    if None in Resolver.yaml_implicit_resolvers
    else frozenset(Resolver.yaml_implicit_resolvers)
)


class NotPlainData(Exception):
    """The document holds something an :class:`EventReader` leaves to a full reader."""


def read_document(text: str) -> Any:
    """What ``yaml.load(text, Loader=CSafeLoader)`` returns, or raises."""
    try:
        return EventReader().read(text)
    except Exception:  # anything unusual is the loader's to answer
        return yaml.load(text, Loader=_LOADER)  # a safe loader


@lru_cache(maxsize=4096)
def plain_scalar(value: str) -> tuple[str, Any]:
    """A plain scalar's tag and value, as the safe loader resolves and constructs it (``1`` is
    an int, ``true`` a bool, an empty one None). Documents repeat a handful of them."""
    tag = _RESOLVER.resolve(ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    if tag == _STR:
        return tag, value
    return tag, _CONSTRUCTOR.yaml_constructors[tag](_CONSTRUCTOR, ScalarNode(tag, value))


class EventReader:
    """Values from one document's events: a stack of the collections being filled, each with
    the key waiting for its value (the class itself while none is).

    ``unique_keys``: a key met twice raises :class:`NotPlainData` (the safe loader keeps the
    last); ``limit``: more values than this (keys, scalars, lists and mappings) raises it.
    :meth:`plain` may be overridden to refuse a plain scalar."""

    #: Deeper than this, the full reader answers (its recursion has its own limit).
    MAX_DEPTH: ClassVar[int] = 64

    def __init__(self, *, unique_keys: bool = False, limit: int | None = None) -> None:
        self.stack: list[list[Any]] = []
        self.root: Any = None
        self.documents = 0
        self.unique_keys = unique_keys
        self.left = -1 if limit is None else limit  # values still allowed; -1: no limit

    def plain(self, text: str) -> Any:
        return plain_scalar(text)[1]

    def read(self, text: str) -> Any:
        """The document's value; raises :class:`NotPlainData` or the parser's error."""
        parser = _LOADER(text)
        try:
            return self._run(parser)
        finally:
            parser.dispose()

    def _run(self, parser: Any) -> Any:
        stack = self.stack
        while True:
            event = parser.get_event()
            kind = type(event)
            if kind is events.ScalarEvent:
                if event.anchor is not None or event.tag is not None or self.left == 0:
                    raise NotPlainData
                self.left -= 1
                value = event.value
                if not event.style and value[:1] in _RESOLVED_FIRST:
                    value = self.plain(value)
            elif kind in _ENDS:
                value = stack.pop()[0]
            elif self._structure(event, kind):
                return self.root
            else:
                continue
            if not stack:
                self.root = value
                continue
            top = stack[-1]
            if type(top[0]) is list:
                top[0].append(value)
            elif top[1] is EventReader:  # a key: a collection or a merge key is the full reader's
                if type(value) is dict or type(value) is list or value == "<<":
                    raise NotPlainData
                if self.unique_keys and value in top[0]:
                    raise NotPlainData
                top[1] = value
            else:
                top[0][top[1]] = value
                top[1] = EventReader

    def _structure(self, event: Any, kind: type) -> bool:
        """A collection's start, a document's start, an alias: whether the stream ended."""
        if kind in _STARTS:
            if event.anchor is not None or event.tag is not None or self.left == 0:
                raise NotPlainData
            if len(self.stack) >= self.MAX_DEPTH:
                raise NotPlainData
            self.left -= 1
            self.stack.append([{} if kind is events.MappingStartEvent else [], EventReader])
        elif kind is events.DocumentStartEvent:
            self.documents += 1
            if self.documents > 1:
                raise NotPlainData
        elif kind is events.AliasEvent:
            raise NotPlainData
        return kind is events.StreamEndEvent
