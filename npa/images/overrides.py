"""Which image each tool runs: exact overrides, then the global fallback, then the spec.

``--image-override TOOL_REF=IMAGE`` (repeatable) pins one tool; ``--image IMAGE`` replaces the
image of every tool that has no exact override; a tool with neither keeps its spec image. The
chosen image is the one preflight verifies and whose digest render pins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from npa.core.errors import InvalidInput
from npa.core.suggest import closest
from npa.images.reference import parse_reference

if TYPE_CHECKING:
    from npa.spec.model import Workflow

ImageSource = Literal["override", "image", "spec"]


@dataclass(frozen=True)
class ChosenImage:
    tool: str
    image: str
    source: ImageSource


FLAG = "--image-override"


def parse_overrides(
    values: Iterable[str],
    tools: Iterable[str],
    rerun: Callable[[tuple[str, ...]], str] | None = None,
) -> dict[str, str]:
    """``["a=img", ...]`` -> ``{"a": "img"}``; unknown or repeated TOOL_REFs are errors. An
    error's fix is ``rerun`` (the command, given the overrides it runs with) with the override
    corrected or left out; without ``rerun``, its details hold the overrides to run with
    (``rerun_with``), from which the CLI writes the command out."""
    known = sorted(tools)
    given = list(values)
    out: dict[str, str] = {}

    def refuse(message: str, index: int, meant: str | None) -> InvalidInput:
        kept = tuple(v for v in (meant if i == index else v for i, v in enumerate(given)) if v)
        fix = rerun(kept) if rerun is not None else None
        return InvalidInput(message, fix=fix, details={"rerun_with": {FLAG: list(kept)}})

    for index, value in enumerate(given):
        tool, eq, image = value.partition("=")
        tool, image = tool.strip(), image.strip()
        if not eq or not tool or not image:
            meant = f"{closest(tool, known) or (known[0] if known else tool)}={image or value}"
            raise refuse(
                f"{FLAG} {value!r} is not TOOL_REF=IMAGE (the spec declares: "
                f"{', '.join(known) or 'no tools'})",
                index,
                meant,
            )
        if tool not in known:
            guess = closest(tool, known)
            raise refuse(
                f"{FLAG} names unknown tool {tool!r}; the spec declares: "
                f"{', '.join(known) or 'none'}" + (f"; did you mean {guess!r}?" if guess else ""),
                index,
                f"{guess}={image}" if guess else None,
            )
        if tool in out:
            raise refuse(f"{FLAG} gives tool {tool!r} twice ({out[tool]} and {image})", index, None)
        parse_reference(image)  # malformed references fail here, before any network call
        out[tool] = image
    return out


def choose_images(
    spec_images: Mapping[str, str],
    overrides: Mapping[str, str],
    fallback: str | None,
) -> list[ChosenImage]:
    """One chosen image per tool, in TOOL_REF order."""
    if fallback is not None:
        parse_reference(fallback)
    chosen = []
    for tool in sorted(spec_images):
        if tool in overrides:
            chosen.append(ChosenImage(tool, overrides[tool], "override"))
        elif fallback is not None:
            chosen.append(ChosenImage(tool, fallback, "image"))
        else:
            chosen.append(ChosenImage(tool, spec_images[tool], "spec"))
    return chosen


def with_chosen_images(
    workflow: Workflow, overrides: Iterable[str], fallback: str | None
) -> Workflow:
    """The workflow whose tools run the images ``--image-override`` (``overrides``) and
    ``--image`` (``fallback``) choose: the one rule render and submit both apply, whether or
    not preflight verified the images."""
    spec_images = {ref: tool.image for ref, tool in workflow.tools.items()}
    picked = parse_overrides(overrides, workflow.tools)
    chosen = {c.tool: c.image for c in choose_images(spec_images, picked, fallback)}
    if chosen == spec_images:
        return workflow
    tools = {
        ref: tool.model_copy(update={"image": chosen[ref]}) for ref, tool in workflow.tools.items()
    }
    return workflow.model_copy(update={"tools": tools})
