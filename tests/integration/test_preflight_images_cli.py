"""``npa workbench workflow preflight-images`` end to end: real CLI process, real registry."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from tests.harness.cli import run_npa
from tests.harness.procs import free_port
from tests.harness.registry import Registry
from tests.integration.imagespec import push_attested, unique_repo, write_spec
from tests.integration.registry_proxy import PROXY_PASSWORD, PROXY_USER, token_proxy

pytestmark = pytest.mark.integration

CMD = ("workbench", "workflow", "preflight-images")


def _env(registry: Registry, npa_home: Path) -> dict[str, str]:
    return {"REG_AUTH": f"{registry.auth[0]}:{registry.auth[1]}", "NPA_HOME": str(npa_home)}


def _rows(result_json: dict) -> dict[str, dict]:
    return {row["tool"]: row for row in result_json["images"]}


def test_ok_missing_and_cache(registry: Registry, npa_home: Path, tmp_path: Path) -> None:
    good = push_attested(registry, "good", index=True)
    missing_repo = unique_repo("missing")
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "good": {"image": f"{registry.host}/{good.repository}:v1"},
            "missing": {
                "image": f"{registry.host}/{missing_repo}:2.0",
                "build": {"context": "tools/missing", "dockerfile": "Dockerfile.gpu"},
            },
        },
    )
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    first = run_npa(*CMD, str(spec), auth, "--json", env=_env(registry, npa_home), cwd=tmp_path)
    assert first.code == 1, first.stderr
    rows = _rows(first.json())
    assert rows["good"]["status"] == "ok"
    assert rows["good"]["digest"] == good.digest
    assert rows["good"]["pinned"] == f"{registry.host}/{good.repository}@{good.digest}"
    assert rows["good"]["verified_by"] == "contract"
    assert rows["good"]["user"] == 1000
    assert rows["good"]["credential_source"] == "env:REG_AUTH"
    assert rows["missing"]["status"] == "not_found"
    ref = f"{registry.host}/{missing_repo}:2.0"
    assert rows["missing"]["fix"] == (
        f"docker build -t {ref} -f tools/missing/Dockerfile.gpu tools/missing && docker push {ref}"
    )
    assert first.json()["digests"] == {"good": rows["good"]["pinned"]}

    # Only the good image is verified, so only it is cached, owner-only.
    cache_dir = npa_home / "cache" / "images"
    files = list(cache_dir.iterdir())
    assert [f.name for f in files] == [good.digest.replace(":", "-") + ".json"]
    assert oct(cache_dir.stat().st_mode & 0o777) == "0o700"
    assert oct(files[0].stat().st_mode & 0o777) == "0o600"

    second = run_npa(*CMD, str(spec), auth, "--json", env=_env(registry, npa_home), cwd=tmp_path)
    assert _rows(second.json())["good"]["verified_by"] == "cache"

    # A cache entry from another contract version is not trusted.
    entry = json.loads(files[0].read_text())
    entry["contract_version"] = 0
    files[0].write_text(json.dumps(entry))
    third = run_npa(*CMD, str(spec), auth, "--json", env=_env(registry, npa_home), cwd=tmp_path)
    assert _rows(third.json())["good"]["verified_by"] == "contract"


def test_text_output_and_exit_zero_when_all_ok(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    a, b = push_attested(registry, "a"), push_attested(registry, "b")
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "alpha": {"image": f"{registry.host}/{a.repository}:v1"},
            "beta": {"image": f"{registry.host}/{b.repository}:v1"},
        },
    )
    out = run_npa(
        *CMD,
        str(spec),
        f"--registry-auth={registry.host}=env:REG_AUTH",
        env=_env(registry, npa_home),
    )
    assert out.code == 0, out.stdout + out.stderr
    assert "2 images, all ok" in out.stdout
    assert a.digest[:19] in out.stdout and "env:REG_AUTH" in out.stdout


def test_registry_flag_resolves_short_references(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    img = push_attested(registry, "short")
    namespace, name = img.repository.split("/", 1)
    spec = write_spec(tmp_path / "spec.yaml", {"tool": {"image": f"{name}:v1"}})
    out = run_npa(
        *CMD,
        str(spec),
        "--registry",
        f"{registry.host}/{namespace}",
        f"--registry-auth={registry.host}=env:REG_AUTH",
        "--json",
        env=_env(registry, npa_home),
    )
    assert out.code == 0, out.stdout
    assert _rows(out.json())["tool"]["digest"] == img.digest


def test_overrides_beat_the_global_image_which_beats_the_spec(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    spec_img, global_img, exact_img = (push_attested(registry, p) for p in ("s", "g", "e"))
    ref = lambda p: f"{registry.host}/{p.repository}:v1"  # noqa: E731
    spec = write_spec(
        tmp_path / "spec.yaml",
        {"one": {"image": ref(spec_img)}, "two": {"image": ref(spec_img)}},
    )
    auth = f"--registry-auth={registry.host}=env:REG_AUTH"
    env = _env(registry, npa_home)

    plain = _rows(run_npa(*CMD, str(spec), auth, "--json", env=env).json())
    assert {r["source"] for r in plain.values()} == {"spec"}

    out = run_npa(
        *CMD,
        str(spec),
        auth,
        "--json",
        "--image",
        ref(global_img),
        "--image-override",
        f"one={ref(exact_img)}",
        env=env,
    )
    assert out.code == 0, out.stdout
    rows = _rows(out.json())
    assert (rows["one"]["source"], rows["one"]["digest"]) == ("override", exact_img.digest)
    assert (rows["two"]["source"], rows["two"]["digest"]) == ("image", global_img.digest)
    assert out.json()["digests"]["one"].endswith(exact_img.digest)

    unknown = run_npa(*CMD, str(spec), "--image-override", f"three={ref(exact_img)}", env=env)
    assert unknown.code == 2 and "unknown tool 'three'" in unknown.stderr
    dup = run_npa(
        *CMD,
        str(spec),
        "--image-override",
        f"one={ref(exact_img)}",
        "--image-override",
        f"one={ref(global_img)}",
        env=env,
    )
    assert dup.code == 2 and "twice" in dup.stderr
    bad = run_npa(*CMD, str(spec), "--image-override", "one=Not A Ref", "--json", env=env)
    assert bad.code == 2 and bad.json()["error"]["kind"] == "invalid_input"


def test_forbidden_and_unreachable_rows(registry: Registry, npa_home: Path, tmp_path: Path) -> None:
    denied_repo, broken_repo = unique_repo("denied"), unique_repo("broken")
    registry.push_image(denied_repo, "v1")
    registry.push_image(broken_repo, "v1")
    closed = f"127.0.0.1:{free_port()}"
    with token_proxy(registry, denied={denied_repo}, broken={broken_repo}) as proxy:
        spec = write_spec(
            tmp_path / "spec.yaml",
            {
                "denied": {"image": f"{proxy.host}/{denied_repo}:v1"},
                "broken": {"image": f"{proxy.host}/{broken_repo}:v1"},
                "closed": {"image": f"{closed}/nothing/here:v1"},
            },
        )
        env = {**_env(registry, npa_home), "TOK": f"{PROXY_USER}:{PROXY_PASSWORD}"}
        out = run_npa(*CMD, str(spec), f"--registry-auth={proxy.host}=env:TOK", "--json", env=env)
    assert out.code == 1
    rows = _rows(out.json())
    assert rows["denied"]["status"] == "forbidden"
    assert proxy.host in rows["denied"]["detail"]
    assert rows["denied"]["fix"].startswith(f"docker login {proxy.host}")
    assert rows["broken"]["status"] == "unreachable"
    assert rows["closed"]["status"] == "unreachable"


def test_unattested_image_without_context_is_unverified(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    img = registry.push_image(unique_repo("plain"), "v1")
    spec = write_spec(
        tmp_path / "spec.yaml", {"plain": {"image": f"{registry.host}/{img.repository}:v1"}}
    )
    env = {**_env(registry, npa_home), "KUBECONFIG": str(tmp_path / "none")}
    env.pop("NPA_CONTEXT", None)
    out = run_npa(
        *CMD, str(spec), f"--registry-auth={registry.host}=env:REG_AUTH", "--json", env=env
    )
    assert out.code == 4, out.stdout
    row = _rows(out.json())["plain"]
    assert row["status"] == "unverified" and row["digest"] == img.digest
    assert "--context" in row["fix"]


def test_no_credential_value_in_output_or_written_files(
    registry: Registry, npa_home: Path, tmp_path: Path
) -> None:
    user, password = registry.auth
    good = push_attested(registry, "leak")
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "good": {"image": f"{registry.host}/{good.repository}:v1"},
            "missing": {"image": f"{registry.host}/{unique_repo('leak-missing')}:v1"},
        },
    )
    home = npa_home.parent
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_text(
        json.dumps({"auths": {f"http://{registry.host}": {"auth": encoded}}})
    )
    env = {"HOME": str(home), "NPA_HOME": str(npa_home), "DOCKER_CONFIG": str(home / ".docker")}
    outputs = []
    for extra in ((), ("--json",)):
        res = run_npa(*CMD, str(spec), *extra, env=env)
        assert res.code == 1
        outputs += [res.stdout, res.stderr]
    rows = _rows(json.loads(outputs[2]))
    assert rows["good"]["credential_source"] == f"docker-config:{home / '.docker' / 'config.json'}"
    # An error path too: a wrong variable named on the command line.
    env_bad = {**env, "WRONG": f"{user}:{password}-wrong"}
    bad = run_npa(*CMD, str(spec), f"--registry-auth={registry.host}=env:WRONG", env=env_bad)
    outputs += [bad.stdout, bad.stderr]

    secrets_ = [password, encoded, f"{password}-wrong"]
    for text in outputs:
        for secret in secrets_:
            assert secret not in text
    written = [p for p in npa_home.rglob("*") if p.is_file()]
    assert written, "preflight should have written its cache"
    for path in written:
        data = path.read_bytes()
        for secret in secrets_:
            assert secret.encode() not in data, f"{path} holds a credential"
    assert all(os.stat(p).st_mode & 0o077 == 0 for p in written)


def test_project_supplies_registry(registry: Registry, npa_home: Path, tmp_path: Path) -> None:
    img = push_attested(registry, "proj")
    namespace, name = img.repository.split("/", 1)
    env = _env(registry, npa_home)
    recorded = run_npa(
        "configure", "--project", "team", "--registry", f"{registry.host}/{namespace}", env=env
    )
    assert recorded.code == 0, recorded.stderr
    spec = write_spec(tmp_path / "spec.yaml", {"tool": {"image": f"{name}:v1"}})
    out = run_npa(
        *CMD,
        str(spec),
        "--project",
        "team",
        f"--registry-auth={registry.host}=env:REG_AUTH",
        "--json",
        env=env,
    )
    assert out.code == 0, out.stdout + out.stderr
    assert out.json()["registry"] == f"{registry.host}/{namespace}"
    assert _rows(out.json())["tool"]["digest"] == img.digest
