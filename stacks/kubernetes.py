"""The ``kubernetes`` target: an existing cluster made ready for SkyPilot.

Config:

- ``npa:context``: the kube context; ``npa:kubeconfigPath``: where the kubeconfig is placed
  (``~/.npa/clusters/<context>/kubeconfig``);
- ``npa:kubeconfigSource`` (copy that context out of an existing kubeconfig) or
  ``npa:kubeconfigDocument`` (a new cluster's credential-free kubeconfig);
- ``npa:namespace`` and ``npa:serviceAccount``: where SkyPilot runs and as whom.

The placed kubeconfig is a resource of this stack and the Kubernetes provider reads it, so the
engine creates it first and deletes it last. The RBAC follows SkyPilot's minimal-permission
setup: everything inside the namespace, and read access to the cluster-scoped objects SkyPilot
inspects (nodes, runtime and ingress classes, its own RBAC, the kube-system namespace's id).
npa creates no registry pull secret: private-image credentials stay the operator's.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from stacks.localfs import PlacedKubeconfig, fingerprint, minimal_kubeconfig

LABELS = {"app.kubernetes.io/managed-by": "npa", "parent": "skypilot"}
# None of these objects owns others, so nothing waits on the garbage collector to delete them
# (the provider's default, foreground deletion, does).
ANNOTATIONS = {"pulumi.com/deletionPropagationPolicy": "background"}

# Cluster-scoped read access SkyPilot needs (from its generate_kubeconfig.sh minimal set).
CLUSTER_RULES = [
    {"api_groups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {
        "api_groups": ["node.k8s.io"],
        "resources": ["runtimeclasses"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "api_groups": ["networking.k8s.io"],
        "resources": ["ingressclasses"],
        "verbs": ["get", "list", "watch"],
    },
    {"api_groups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {
        "api_groups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles", "clusterrolebindings", "roles", "rolebindings"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "api_groups": [""],
        "resources": ["namespaces"],
        "resource_names": ["kube-system"],
        "verbs": ["get"],
    },
]
NAMESPACE_RULES = [{"api_groups": ["*"], "resources": ["*"], "verbs": ["*"]}]


def program() -> None:
    config = pulumi.Config("npa")
    context = config.require("context")
    destination = config.require("kubeconfigPath")
    source = config.get("kubeconfigSource")
    document = config.get("kubeconfigDocument")
    namespace_name = config.require("namespace")
    account_name = config.get("serviceAccount") or "sky-sa"
    if bool(source) == bool(document):
        raise pulumi.RunError("set exactly one of npa:kubeconfigSource and npa:kubeconfigDocument")
    text = document if document else minimal_kubeconfig(str(source), context)

    placed = PlacedKubeconfig(
        "kubeconfig",
        destination=destination,
        context=context,
        source=source,
        document=document,
        fingerprint_=fingerprint(text),
    )
    provider = k8s.Provider(
        "cluster",
        kubeconfig=placed.destination,
        context=context,
        opts=pulumi.ResourceOptions(depends_on=[placed]),
    )
    on_cluster = pulumi.ResourceOptions(provider=provider)

    # Deleting a namespace finishes when the cluster's namespace controller has emptied it;
    # teardown hands that over to the cluster instead of waiting for it.
    namespace = k8s.core.v1.Namespace(
        "namespace",
        metadata={
            "name": namespace_name,
            "labels": LABELS,
            "annotations": {**ANNOTATIONS, "pulumi.com/skipAwait": "true"},
        },
        opts=on_cluster,
    )
    in_namespace = pulumi.ResourceOptions(provider=provider, depends_on=[namespace])
    account = k8s.core.v1.ServiceAccount(
        "service-account",
        metadata={
            "name": account_name,
            "namespace": namespace_name,
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        opts=in_namespace,
    )
    role = k8s.rbac.v1.Role(
        "role",
        metadata={
            "name": f"{account_name}-role",
            "namespace": namespace_name,
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        rules=NAMESPACE_RULES,
        opts=in_namespace,
    )
    k8s.rbac.v1.RoleBinding(
        "role-binding",
        metadata={
            "name": f"{account_name}-rb",
            "namespace": namespace_name,
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        subjects=[{"kind": "ServiceAccount", "name": account_name, "namespace": namespace_name}],
        role_ref={
            "kind": "Role",
            "name": f"{account_name}-role",
            "api_group": "rbac.authorization.k8s.io",
        },
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[role, account]),
    )
    # Cluster-scoped names are shared by every namespace: include the namespace in them.
    cluster_role_name = f"{namespace_name}-{account_name}-cluster-role"
    cluster_role = k8s.rbac.v1.ClusterRole(
        "cluster-role",
        metadata={"name": cluster_role_name, "labels": LABELS, "annotations": ANNOTATIONS},
        rules=CLUSTER_RULES,
        opts=on_cluster,
    )
    k8s.rbac.v1.ClusterRoleBinding(
        "cluster-role-binding",
        metadata={
            "name": f"{namespace_name}-{account_name}-cluster-rb",
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        subjects=[{"kind": "ServiceAccount", "name": account_name, "namespace": namespace_name}],
        role_ref={
            "kind": "ClusterRole",
            "name": cluster_role_name,
            "api_group": "rbac.authorization.k8s.io",
        },
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[cluster_role, account]),
    )
    pulumi.export("kubeconfig", placed.destination)
    pulumi.export("context", context)
    pulumi.export("namespace", namespace.metadata["name"])
    pulumi.export("service_account", account.metadata["name"])
