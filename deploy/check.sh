#!/usr/bin/env bash
# Validates the deployment files under deploy/ (deploy/README.md, "Checking these files"):
#
#   - every Kubernetes manifest of deploy/kubernetes against the Kubernetes API schemas, in
#     strict mode (unknown fields fail), with kubernetes-validate from PyPI, for each version
#     of $QUOTIENT_K8S_VERSIONS; plus what the schemas do not say: kustomization.yaml lists
#     exactly the manifests, QUIC ports are UDP, probes ask /healthz and /readyz, and the
#     shell scripts inside the manifests parse;
#   - deploy/prometheus: `promtool check rules`, `promtool test rules` and
#     `promtool check config` of each example configuration;
#   - deploy/grafana/quotient.json: valid JSON with the datasource and share variables;
#   - in the dashboard and the alerting rules: every PromQL expression names only metrics
#     that Quotient exports (or `up`), with their labels and label values.
#
#   bash deploy/check.sh          (from any directory)
#
# A missing tool is an error, never a skip. kubernetes-validate lives in a virtualenv,
# $QUOTIENT_VENV [default: target/ci-venv of this checkout], made and filled here when
# needed (PyPI). promtool comes from Debian's `prometheus` package, which this script
# installs when it is missing and it runs as root with apt-get.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="${QUOTIENT_VENV:-$root/target/ci-venv}"
kv_version="1.37.0"
k8s_versions="${QUOTIENT_K8S_VERSIONS:-1.30.0 1.37.0}"

die() {
    echo "deploy/check.sh: FAILED: $*" >&2
    exit 1
}
say() { echo "deploy/check.sh: $*"; }

# --- the tools
command -v python3 >/dev/null 2>&1 || die "python3 is not installed (it runs kubernetes-validate and the dashboard checks)"

venv_ok() {
    [ -x "$venv/bin/python" ] && [ -x "$venv/bin/kubernetes-validate" ] &&
        "$venv/bin/python" -c "import importlib.metadata as m, yaml; assert m.version('kubernetes-validate') == '$kv_version'" 2>/dev/null
}
if ! venv_ok; then
    if [ -e "$venv" ] && ! [ -x "$venv/bin/python" ]; then
        die "$venv exists but is not a virtualenv: remove it, or point QUOTIENT_VENV elsewhere"
    fi
    if ! [ -x "$venv/bin/python" ]; then
        say "making the virtualenv $venv"
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv" ||
            die "python3 -m venv $venv failed: install the venv module (Debian: apt-get install python3-venv)"
    fi
    "$venv/bin/python" -c 'import sys' 2>/dev/null ||
        die "the virtualenv $venv does not run (its Python was removed?): remove it and run again"
    say "installing kubernetes-validate==$kv_version into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$kv_version" ||
        die "pip could not install kubernetes-validate==$kv_version into $venv (no PyPI?)"
    venv_ok || die "kubernetes-validate==$kv_version or PyYAML is still missing from $venv after pip install"
fi

if ! command -v promtool >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "promtool is missing; installing Debian's prometheus package"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null || die "apt-get update failed; cannot install promtool"
        apt-get install -y -qq --no-install-recommends prometheus >/dev/null ||
            die "apt-get install prometheus failed; cannot install promtool"
    fi
    command -v promtool >/dev/null 2>&1 ||
        die "promtool is not installed: install Prometheus' promtool (Debian: apt-get install prometheus, as root)"
fi

# --- Kubernetes manifests
k8s="$here/kubernetes"
manifests=()
for file in "$k8s"/*.yaml; do
    [ "$(basename "$file")" = kustomization.yaml ] || manifests+=("$file")
done
[ "${#manifests[@]}" -gt 0 ] || die "no manifests in $k8s"
for version in $k8s_versions; do
    say "kubernetes-validate --strict, Kubernetes $version: ${#manifests[@]} manifests"
    "$venv/bin/kubernetes-validate" --strict --quiet --kubernetes-version "$version" "${manifests[@]}" ||
        die "a manifest in deploy/kubernetes does not validate against Kubernetes $version (above)"
done

# --- Prometheus
prom="$here/prometheus"
say "promtool check rules alerts.yml"
promtool check rules "$prom/alerts.yml" || die "promtool check rules deploy/prometheus/alerts.yml"
say "promtool test rules alerts_test.yml"
promtool test rules "$prom/alerts_test.yml" || die "promtool test rules deploy/prometheus/alerts_test.yml"
for config in "$prom"/prometheus*.yml; do
    say "promtool check config $(basename "$config")"
    promtool check config "$config" || die "promtool check config deploy/prometheus/$(basename "$config")"
done

# --- what the schemas and promtool do not check, and the dashboard
say "checking the manifests' details, the dashboard and the metric names"
"$venv/bin/python" - "$root" <<'PY' || die "the details above are wrong"
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

root = Path(sys.argv[1])
errors = []


def fail(where, text):
    errors.append(f"{where}: {text}")


# What Quotient exports (coordinator/src/metrics.rs and the agent's metrics): names and
# labels, and the values of the labels that take a fixed set.
JOB_STATES = {"runnable", "scheduled", "starting", "running", "preempting", "succeeded", "failed", "cancelled"}
GAUGES = {
    "quotient_share_gpus": {"share", "class", "kind"},
    "quotient_jobs": {"share", "state"},
    "quotient_nodes": {"state"},
    "quotient_raft_is_leader": set(),
    "quotient_raft_term": set(),
    "quotient_raft_commit_index": set(),
    "quotient_raft_applied_index": set(),
    "quotient_raft_replication_lag_entries": {"member"},
    "quotient_gpu_utilization_ratio": {"gpu", "uuid"},
    "quotient_gpu_memory_used_bytes": {"gpu", "uuid"},
    "quotient_gpu_temperature_celsius": {"gpu", "uuid"},
    "quotient_gpu_power_watts": {"gpu", "uuid"},
    "quotient_gpu_healthy": {"gpu", "uuid"},
    "quotient_agent_lease_remaining_seconds": set(),
    "quotient_agent_jobs": {"state"},
    "quotient_certificate_expiry_timestamp_seconds": {"certificate"},
}
COUNTERS = {
    "quotient_preemptions_total": {"share", "cause"},
    "quotient_scheduler_placements_total": set(),
    "quotient_gpu_xid_errors_total": {"gpu", "uuid"},
}
HISTOGRAMS = {
    "quotient_job_wait_seconds": {"share"},
    "quotient_scheduler_round_seconds": set(),
    "quotient_api_request_seconds": {"kind"},
}
TARGET_LABELS = {"job", "instance"}
METRICS = {"up": set()}
METRICS.update(GAUGES)
METRICS.update(COUNTERS)
for name, labels in HISTOGRAMS.items():
    METRICS[name + "_bucket"] = labels | {"le"}
    METRICS[name + "_sum"] = labels
    METRICS[name + "_count"] = labels
VALUES = {
    ("quotient_share_gpus", "kind"): {"limit", "used", "borrowed", "lent"},
    ("quotient_jobs", "state"): JOB_STATES,
    ("quotient_preemptions_total", "cause"): {"reclaim", "in_share", "drain", "node_lost", "agent_stopped", "start_timeout"},
    ("quotient_nodes", "state"): {"ready", "cordoned", "draining", "unreachable", "lost"},
    ("up", "job"): {"quotient-coordinator", "quotient-agent"},
    ("quotient_certificate_expiry_timestamp_seconds", "certificate"): {"own", "ca"},
}
FUNCTIONS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
    "histogram_quantile", "absent", "absent_over_time", "abs", "ceil", "floor", "round",
    "clamp", "clamp_min", "clamp_max", "changes", "resets", "vector", "scalar", "time",
    "label_replace", "label_join", "sort", "sort_desc", "predict_linear", "avg_over_time",
    "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
    "quantile_over_time", "timestamp", "sgn",
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def check_expr(where, expr):
    """Every metric an expression names is exported, with labels it has and values they take."""
    # Grafana's variables ($share, $__rate_interval) are not PromQL names.
    text = re.sub(r"\$\w+", "VAR", expr)
    named = set()
    for match in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}", text):
        name, matchers = match.group(1), match.group(2)
        if not name or name in KEYWORDS:
            fail(where, f"a selector without a metric name: {match.group(0)!r}")
            continue
        if name not in METRICS:
            fail(where, f"{name} is not a metric Quotient exports")
            continue
        named.add(name)
        for matcher in re.finditer(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', matchers):
            label, op, value = matcher.groups()
            if label not in METRICS[name] | TARGET_LABELS:
                fail(where, f"{name} has no label {label}")
            allowed = VALUES.get((name, label))
            if allowed and op == "=" and value not in allowed:
                fail(where, f'{name}{{{label}="{value}"}}: {label} is one of {sorted(allowed)}')
    # Everything else that is a name: a function (followed by a parenthesis), a keyword,
    # a label in by/on/without (...), or a metric selected without braces.
    stripped = re.sub(r"\{[^}]*\}", "", text)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', "", stripped)
    grouping = set()
    for match in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", stripped):
        grouping.update(label.strip() for label in match.group(2).split(",") if label.strip())
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", stripped)
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", stripped):
        name, call = match.group(1), match.group(2)
        if name in KEYWORDS or name == "VAR":
            continue
        if call:
            if name not in FUNCTIONS:
                fail(where, f"{name}(...) is not a PromQL function this check knows")
            continue
        if name not in METRICS:
            fail(where, f"{name} is not a metric Quotient exports")
        else:
            named.add(name)
    if not named:
        fail(where, f"names no metric Quotient exports: {expr!r}")
        return
    known_labels = set().union(*(METRICS[name] for name in named)) | TARGET_LABELS
    for label in sorted(grouping - known_labels):
        fail(where, f"groups by {label}, a label none of {sorted(named)} has")


# --- Kubernetes: kustomization.yaml lists exactly the manifests
k8s = root / "deploy" / "kubernetes"
kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
listed = set(kustomization.get("resources", []))
present = {path.name for path in k8s.glob("*.yaml") if path.name != "kustomization.yaml"}
if listed != present:
    fail("deploy/kubernetes/kustomization.yaml",
         f"resources {sorted(listed)} differ from the manifests {sorted(present)}")
images = {image.get("name") for image in kustomization.get("images", [])}

for path in sorted(k8s.glob("*.yaml")):
    if path.name == "kustomization.yaml":
        continue
    where = f"deploy/kubernetes/{path.name}"
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        kind = doc.get("kind")
        if doc.get("metadata", {}).get("namespace"):
            fail(where, "sets a namespace; kustomization.yaml sets it for every object")
        if kind == "Service":
            for port in doc["spec"].get("ports", []):
                if (port.get("name") == "quic" or port.get("port") == 7401) and port.get("protocol") != "UDP":
                    fail(where, f"port {port.get('name')} carries QUIC and must be protocol: UDP")
        template = doc.get("spec", {}).get("template", {}).get("spec")
        if not template:
            continue
        for container in template.get("containers", []):
            name = f"{where} container {container['name']}"
            if container.get("image") not in images:
                fail(name, f"image {container.get('image')!r} is not one kustomization.yaml sets")
            for port in container.get("ports", []):
                if port.get("containerPort") == 7401 and port.get("protocol") != "UDP":
                    fail(name, "port 7401 carries QUIC and must be protocol: UDP")
            if kind in ("StatefulSet", "DaemonSet"):
                live = container.get("livenessProbe", {}).get("httpGet", {}).get("path")
                ready = container.get("readinessProbe", {}).get("httpGet", {}).get("path")
                if live != "/healthz" or ready != "/readyz":
                    fail(name, f"probes ask {live} and {ready}; liveness /healthz and readiness /readyz expected")
                args = " ".join(container.get("command", []) + container.get("args", []))
                if "--metrics-listen" not in args:
                    fail(name, "starts without --metrics-listen, so its probes and metrics have no endpoint")
            command = container.get("command", [])
            if command[:2] == ["/bin/sh", "-c"]:
                script = container.get("args", [""])[0]
                parsed = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
                if parsed.returncode != 0:
                    fail(name, f"its shell script does not parse: {parsed.stderr.strip()}")

# --- Prometheus rules: metric names
alerts = yaml.safe_load((root / "deploy" / "prometheus" / "alerts.yml").read_text())
for group in alerts["groups"]:
    for rule in group["rules"]:
        where = f"deploy/prometheus/alerts.yml {rule.get('alert') or rule.get('record')}"
        check_expr(where, rule["expr"])
        if "alert" in rule:
            if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
                fail(where, "needs a severity label: critical, warning or info")
            for key in ("summary", "description"):
                if not rule.get("annotations", {}).get(key):
                    fail(where, f"needs a {key} annotation")

# --- Grafana dashboard
dash_path = root / "deploy" / "grafana" / "quotient.json"
where = "deploy/grafana/quotient.json"
try:
    dashboard = json.loads(dash_path.read_text())
except json.JSONDecodeError as error:
    fail(where, f"not valid JSON: {error}")
    dashboard = None
if dashboard is not None:
    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 36:
        fail(where, f"schemaVersion {dashboard.get('schemaVersion')!r}; 36 or later expected")
    variables = {var.get("name"): var for var in dashboard.get("templating", {}).get("list", [])}
    datasource = variables.get("datasource", {})
    if datasource.get("type") != "datasource" or datasource.get("query") != "prometheus":
        fail(where, "needs a variable `datasource` of type datasource for prometheus")
    share = variables.get("share", {})
    share_query = share.get("query")
    if isinstance(share_query, dict):
        share_query = share_query.get("query")
    if share_query != "label_values(quotient_share_gpus, share)":
        fail(where, f"the variable `share` queries {share_query!r}; label_values(quotient_share_gpus, share) expected")

    def all_panels(panels):
        for panel in panels:
            yield panel
            yield from all_panels(panel.get("panels", []))

    ids = set()
    exprs = 0
    for panel in all_panels(dashboard.get("panels", [])):
        title = f"{where} panel {panel.get('title')!r}"
        if panel.get("id") in ids:
            fail(title, f"id {panel.get('id')} is used twice")
        ids.add(panel.get("id"))
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            fail(title, "its datasource is not ${datasource}")
        if not panel.get("targets"):
            fail(title, "has no query")
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("uid") not in (None, "${datasource}"):
                fail(title, "a query's datasource is not ${datasource}")
            check_expr(title, target.get("expr", ""))
            exprs += 1
    if exprs == 0:
        fail(where, "has no queries")
    else:
        print(f"deploy/check.sh: the dashboard's {exprs} queries name only exported metrics")

if errors:
    for error in dict.fromkeys(errors):
        print(f"deploy/check.sh: {error}", file=sys.stderr)
    sys.exit(1)
PY
say "all deployment files are valid"
