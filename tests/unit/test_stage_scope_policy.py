"""The run-scoped session policy (npa.adapters.storage.stage_scope) allows exactly what one run's
stage library needs: its own prefix (read, write, list), the workflow's shared source and the
declared inputs (read, list), and nothing beside them, as moto's own IAM evaluator reads it
(tests.harness.moto_iam adds StringLike and s3:prefix, which a listing's scope rests on).

The oracle below says the same in plain string terms; hypothesis draws stores, runs, inputs and
probes placed next to every boundary: a sibling run whose id extends this one's (run1, run10),
the prefix without its '/', an input's key with a character more, a folder beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from npa.adapters.storage.stage_scope import session_name, session_policy
from npa.core.layout import run_prefix, shared_source_key
from tests.harness.moto_iam import session_permits, string_like
from tests.tiers import examples

# moto matches a Resource pattern as a regular expression with '*' widened and nothing
# escaped, so the drawn keys keep to characters that mean themselves there.
SEGMENT = st.text("abr01-_", min_size=1, max_size=4)
BUCKETS = st.sampled_from(["store", "data", "other"])


@dataclass
class Scope:
    bucket: str
    base: str
    run: str  # the run prefix, ending with "/"
    source: str
    inputs: list[tuple[str, str]]  # (bucket, key)

    def reads(self, bucket: str, key: str) -> bool:
        if bucket == self.bucket and key.startswith((self.run, self.source)):
            return True
        for in_bucket, in_key in self.inputs:
            folder = in_key if in_key.endswith("/") else in_key + "/"
            exact = not in_key.endswith("/") and key == in_key
            if in_bucket == bucket and (exact or key.startswith(folder)):
                return True
        return False

    def writes(self, bucket: str, key: str) -> bool:
        return bucket == self.bucket and key.startswith(self.run)

    def lists(self, bucket: str, prefix: str) -> bool:
        if bucket == self.bucket and prefix.startswith((self.run, self.source)):
            return True
        return any(
            b == bucket and prefix.startswith(k if k.endswith("/") else k + "/")
            for b, k in self.inputs
        )


def joined(base: str, key: str) -> str:
    return f"{base}/{key}" if base else key


@st.composite
def scopes(draw: st.DrawFn) -> tuple[Scope, dict[str, object], list[tuple[str, str]]]:
    base = "/".join(draw(st.lists(SEGMENT, max_size=2)))
    workflow = draw(st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True))
    run_id = draw(st.from_regex(r"run[0-9]{1,3}", fullmatch=True))
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        key = "/".join(draw(st.lists(SEGMENT, min_size=1, max_size=3)))
        inputs.append((draw(BUCKETS), key + ("/" if draw(st.booleans()) else "")))
    leaf = run_prefix(workflow, run_id)
    scope = Scope(
        bucket="store",
        base=base,
        run=joined(base, leaf) + "/",
        source=joined(base, shared_source_key(leaf)) + "/",
        inputs=inputs,
    )
    store = f"s3://store/{base}" if base else "s3://store"
    policy = session_policy(store, workflow, run_id, [f"s3://{b}/{k}" for b, k in inputs])
    # Probes at each boundary, and a few drawn anywhere.
    sibling = joined(base, run_prefix(workflow, run_id + draw(st.sampled_from(["0", "1", "9"]))))
    near = [
        ("store", scope.run + "x"),
        ("store", scope.run.rstrip("/")),
        ("store", sibling + "/x"),
        ("store", joined(base, f"{workflow}/{run_id}/x")),  # the run's root, beside its prefix
        ("store", scope.source + "blobs/x"),
        ("store", scope.source.rstrip("/") + "x/y"),
        ("store", joined(base, f"{workflow}x/{run_id}/npa-workflow/x")),
    ]
    for b, k in inputs:
        near += [(b, k), (b, k + "x"), (b, k.rstrip("/")), (b, k.rstrip("/") + "/x")]
        near += [(other, k) for other in ("store", "data", "other") if other != b]
    anywhere = draw(st.lists(st.tuples(BUCKETS, SEGMENT), max_size=3))
    return scope, policy, near + anywhere


def obj(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


@settings(max_examples=examples(300), deadline=None)
@given(scopes())
def test_the_session_policy_allows_exactly_the_runs_prefix_its_source_and_inputs(
    drawn: tuple[Scope, dict[str, object], list[tuple[str, str]]],
) -> None:
    scope, policy, probes = drawn
    for bucket, key in probes:
        read = session_permits(policy, "s3:GetObject", obj(bucket, key))
        assert read == scope.reads(bucket, key), (bucket, key, json.dumps(policy))
        wrote = session_permits(policy, "s3:PutObject", obj(bucket, key))
        assert wrote == scope.writes(bucket, key), (bucket, key, json.dumps(policy))
        assert not session_permits(policy, "s3:DeleteObject", obj(bucket, key))
        listed = session_permits(
            policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}", f"/?list-type=2&prefix={key}"
        )
        assert listed == scope.lists(bucket, key), (bucket, key, json.dumps(policy))
    # A listing without a prefix is a listing of the whole bucket: never.
    for bucket in ("store", "data", "other"):
        assert not session_permits(policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}", "/")


def test_a_key_with_a_wildcard_is_written_as_iams_literal_and_matches_only_itself() -> None:
    policy = session_policy("s3://store/a*b", "wf", "run1", ["s3://data/in?put$"])
    text = json.dumps(policy)
    assert "a${*}b/wf/run1/npa-workflow/*" in text
    assert "in${?}put${$}" in text
    pattern = "a${*}b/wf/run1/npa-workflow/*"
    assert string_like(pattern, "a*b/wf/run1/npa-workflow/x")
    assert not string_like(pattern, "aXYb/wf/run1/npa-workflow/x")


def test_the_session_name_keeps_to_iams_characters_and_length() -> None:
    assert session_name("20261205-021854-a1b2c3") == "npa-20261205-021854-a1b2c3"
    assert session_name("x" * 100 + "/é") == ("npa-" + "x" * 100)[:64]
