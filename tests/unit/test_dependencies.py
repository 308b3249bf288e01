"""Every third-party module npa imports at run time comes from a dependency pyproject.toml
declares (a dev extra is not enough: users install without it); a feature extra's modules are
imported only inside functions; each exact pin is written once and agrees everywhere it is read."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from datetime import UTC, datetime
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return _normal(match.group(0))


def declared() -> set[str]:
    return {_name(r) for r in _project()["dependencies"]}


def feature_extras() -> dict[str, str]:
    """Distribution -> the feature extra (any extra but ``dev``) that declares it."""
    extras = _project()["optional-dependencies"]
    return {_name(r): extra for extra, reqs in extras.items() if extra != "dev" for r in reqs}


def imported_top_levels(package: Path) -> dict[str, tuple[str, bool]]:
    """Top-level module -> (one place that imports it, whether some import of it runs when its
    module is imported, i.e. is not inside a function), for every import under ``package``."""
    found: dict[str, tuple[str, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        deferred = {
            id(inner)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for inner in ast.walk(fn)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                where, eager = found.get(top, (f"{path.relative_to(ROOT)}:{node.lineno}", False))
                found[top] = (where, eager or id(node) not in deferred)
    return found


def test_every_runtime_import_is_a_declared_dependency() -> None:
    distributions = packages_distributions()
    wanted = declared()
    extras = feature_extras()
    missing = []
    for module, (where, eager) in sorted(imported_top_levels(ROOT / "npa").items()):
        if module in sys.stdlib_module_names or module in ("npa", "stacks", "__future__"):
            continue
        owners = {_normal(d) for d in distributions.get(module, [])}
        assert owners, f"{where}: {module} is imported but no installed distribution provides it"
        if owners & wanted:
            continue
        if owners & extras.keys() and not eager:
            continue  # a feature extra's module, imported only where the feature runs
        if owners & extras.keys():
            missing.append(f"{where}: {module} is an extra's but imported with its module")
        else:
            missing.append(f"{where}: {module} (from {', '.join(sorted(owners))})")
    assert not missing, "imported but not declared in [project] dependencies:\n" + "\n".join(
        missing
    )


def test_the_dev_extra_carries_every_feature_extra() -> None:
    """Tests run with the dev extra, so they cover every optional feature."""
    dev = set(_project()["optional-dependencies"]["dev"])
    for extra, requirements in _project()["optional-dependencies"].items():
        assert set(requirements) <= dev, f"[{extra}] requirements missing from dev"


def _pins() -> dict[str, str]:
    """Distribution -> version of every exact (``==``) pin in pyproject.toml."""
    project = _project()
    extras = project["optional-dependencies"].values()
    reqs = [*project["dependencies"], *(r for reqs in extras for r in reqs)]
    pins = {}
    for requirement in reqs:
        if "==" in requirement:
            name, version = requirement.split("==")
            pins[_normal(name.split("[")[0])] = version.split(";")[0].strip()
    return pins


def test_exact_pins_agree_with_constraints() -> None:
    frozen = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            frozen[_normal(name)] = version.strip()
    for name, version in _pins().items():
        assert frozen.get(name) == version, f"{name}=={version} vs constraints.txt"


def _semver(pep440: str) -> str:
    """The plugin version a Pulumi SDK pre-release asks for (bootstrap-tools' semver_of)."""
    match = re.fullmatch(r"(\d+\.\d+\.\d+)([ab])(\d+)", pep440)
    if not match:
        return pep440
    return f"{match[1]}-{'alpha' if match[2] == 'a' else 'beta'}.{match[3]}"


SKIP_DIRS = {".git", ".venv", ".bench", "build", "dist", "node_modules", "__pycache__"}


def _repo_text_files() -> list[Path]:
    files = []
    stack = [ROOT]
    while stack:
        for entry in stack.pop().iterdir():
            if entry.is_dir():
                hidden = entry.name.startswith(".") and entry.name != ".ci"
                if not (hidden or entry.name in SKIP_DIRS or entry.name.endswith(".egg-info")):
                    stack.append(entry)
            elif entry.is_file() and entry.stat().st_size < 2_000_000:
                files.append(entry)
    return files


def test_pulumi_kubernetes_version_is_written_only_in_pyproject() -> None:
    """The SDK pin is the one place: constraints.txt freezes it, bootstrap-tools reads it, npa
    and the tests read the plugin version from the installed SDK. Nothing else spells it."""
    pin = _pins()["pulumi-kubernetes"]
    assert _files_mentioning({pin, _semver(pin)}) == ["constraints.txt", "pyproject.toml"]


def test_bootstrap_builds_the_plugin_the_pinned_sdk_asks_for() -> None:
    """bootstrap-tools reads the pin, and the provider commit it compiles is the one the SDK
    pre-release was cut from: the pseudo-version's timestamp is the pre-release number."""
    script = (ROOT / "scripts" / "bootstrap-tools").read_text()
    assert "PULUMI_K8S_PY_VERSION=$(pin_of pulumi-kubernetes)" in script
    pin = _pins()["pulumi-kubernetes"]
    pseudo = r"^PULUMI_K8S_PROVIDER_MODULE_VERSION=v\d+\.\d+\.\d+-(\d{14})-"
    match = re.search(pseudo, script, re.M)
    assert match, "no PULUMI_K8S_PROVIDER_MODULE_VERSION pseudo-version"
    stamp = datetime.strptime(match[1], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    pre = re.fullmatch(r"\d+\.\d+\.\d+[ab](\d+)", pin)
    if pre:  # a release pin names its tag's commit; only a pre-release carries the time
        assert int(stamp.timestamp()) == int(pre[1]), (match[1], pin)


def test_npa_checks_for_the_plugin_the_installed_sdk_asks_for() -> None:
    from npa.adapters.infra.sdk_plugins import sdk_plugin
    from npa.targets.kubernetes.target import K8S_PLUGIN

    loaded = "pulumi_kubernetes" in sys.modules
    pin = _pins()["pulumi-kubernetes"]
    assert sdk_plugin.__wrapped__("pulumi_kubernetes") == ("resource", "kubernetes", _semver(pin))
    assert ("resource", "kubernetes", _semver(pin)) == K8S_PLUGIN
    if not loaded:
        assert "pulumi_kubernetes" not in sys.modules, "reading the plugin imported the SDK"


def test_the_nebius_bridge_plugin_version_has_one_home() -> None:
    """The terraform-provider plugin the nebius target checks for is the one the pinned
    pulumi-nebius SDK asks for, and its version is typed out nowhere in the repository: a
    literal copy would go stale on the next SDK upgrade."""
    from npa.adapters.infra.sdk_plugins import sdk_plugin
    from npa.targets.nebius.target import NEBIUS_PLUGINS

    kind, name, version = sdk_plugin.__wrapped__("pulumi_nebius")
    assert (kind, name) == ("resource", "terraform-provider")
    assert NEBIUS_PLUGINS[0] == (kind, name, version)
    assert _files_mentioning({version, "v" + version, version.replace(".", r"\.")}) == []


def test_an_sdk_that_is_not_installed_names_the_pip_command() -> None:
    from npa.adapters.infra.sdk_plugins import sdk_plugin
    from npa.core.errors import ToolMissing

    with pytest.raises(ToolMissing) as caught:
        sdk_plugin.__wrapped__("pulumi_not_a_provider")
    assert caught.value.fix == "pip install -c constraints.txt 'pulumi-not-a-provider'"


def _files_mentioning(spellings: set[str]) -> list[str]:
    """The repository's text files (relative, sorted) that contain any of ``spellings``."""
    mentions = []
    for path in _repo_text_files():
        try:
            text = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        if any(s in text for s in spellings):
            mentions.append(str(path.relative_to(ROOT)))
    return sorted(mentions)
