"""The example Kubernetes manifests (docs/k8s/) are never applied to a cluster here; this
checks what can be checked without one: they parse as YAML, the container's command line
is one edgeinfer accepts, its models.toml loads, the probes and ports name real routes
and ports, the selectors match the pods, the shutdown fits the grace period, and the
endpoint picker is pointed at metrics edgeinfer exposes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgeinfer.api.app import ROUTES
from edgeinfer.api.metrics import LoadCollector
from edgeinfer.cli.main import build_parser
from edgeinfer.config import load_config, read_api_key_file

yaml = pytest.importorskip("yaml")

K8S = Path(__file__).resolve().parents[2] / "docs" / "k8s"


def documents() -> dict[tuple[str, str], dict[str, Any]]:
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), (path.name, doc)
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in docs, key
            docs[key] = doc
    return docs


DOCS = documents()
DEPLOYMENT = DOCS[("Deployment", "edgeinfer-smollm2")]
POD = DEPLOYMENT["spec"]["template"]
[CONTAINER] = POD["spec"]["containers"]


def test_every_object_the_docs_name_is_there() -> None:
    assert set(DOCS) == {
        ("ConfigMap", "edgeinfer-models"), ("Secret", "edgeinfer-api-keys"),
        ("Deployment", "edgeinfer-smollm2"), ("Service", "edgeinfer-smollm2"),
        ("InferencePool", "edgeinfer-smollm2"), ("ConfigMap", "edgeinfer-smollm2-epp"),
        ("InferenceObjective", "edgeinfer-chat"), ("HTTPRoute", "edgeinfer-smollm2")}
    assert DOCS[("InferencePool", "edgeinfer-smollm2")]["apiVersion"] == \
        "inference.networking.k8s.io/v1"


def mounted(tmp: Path) -> dict[str, Path]:
    """The pod's ConfigMap and Secret volumes, written out under ``tmp`` at their mount
    paths: {mount path: folder}."""
    volumes = {v["name"]: v for v in POD["spec"]["volumes"]}
    out = {}
    for mount in CONTAINER["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = DOCS[("ConfigMap", volume["configMap"]["name"])]["data"]
        elif "secret" in volume:
            data = DOCS[("Secret", volume["secret"]["secretName"])]["stringData"]
        else:
            continue
        folder = tmp / mount["mountPath"].strip("/")
        folder.mkdir(parents=True)
        for name, text in data.items():
            (folder / name).write_text(text)
        out[mount["mountPath"]] = folder
    return out


def test_the_container_runs_a_command_line_edgeinfer_accepts(tmp_path: Path) -> None:
    assert CONTAINER["command"] == ["edgeinfer"]
    args = build_parser().parse_args(CONTAINER["args"])
    assert args.command == "serve" and args.host == "0.0.0.0"
    assert args.serve_while_loading and args.open_metrics
    files = mounted(tmp_path)
    config_dir, keys_dir = (files[str(Path(p).parent)] for p in (args.config,
                                                                args.api_key_file))
    config = load_config(config_dir / Path(args.config).name)
    assert config.allowed_hosts == ("*",)  # probes and scrapes name the pod's IP
    assert [m.id for m in config.models] == ["smollm2-135m-instruct"]
    assert read_api_key_file(keys_dir / Path(args.api_key_file).name) == ["sk-replace-me"]
    assert config.models[0].threads == int(CONTAINER["resources"]["requests"]["cpu"])
    grace = POD["spec"]["terminationGracePeriodSeconds"]
    assert grace > args.drain_delay + args.shutdown_grace
    env = {e["name"]: e["value"] for e in CONTAINER["env"]}
    assert env["EDGEINFER_CACHE"] in {m["mountPath"] for m in CONTAINER["volumeMounts"]}


def test_probes_ports_and_selectors_agree() -> None:
    args = build_parser().parse_args(CONTAINER["args"])
    [port] = CONTAINER["ports"]
    assert port["containerPort"] == args.port
    paths = {r.path for r in ROUTES}
    probes = {k: CONTAINER[k]["httpGet"] for k in ("startupProbe", "livenessProbe",
                                                    "readinessProbe")}
    assert probes["readinessProbe"]["path"] == "/ready"
    assert probes["livenessProbe"]["path"] == "/health"
    for probe in probes.values():
        assert probe["path"] in paths and probe["port"] == port["name"]
    labels = POD["metadata"]["labels"]
    assert DEPLOYMENT["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = DOCS[("Service", "edgeinfer-smollm2")]["spec"]
    assert service["selector"].items() <= labels.items()
    assert service["ports"][0]["targetPort"] == port["name"]
    pool = DOCS[("InferencePool", "edgeinfer-smollm2")]["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert pool["targetPorts"] == [{"number": args.port}]
    route = DOCS[("HTTPRoute", "edgeinfer-smollm2")]["spec"]["rules"][0]["backendRefs"][0]
    assert (route["kind"], route["name"]) == ("InferencePool", "edgeinfer-smollm2")
    objective = DOCS[("InferenceObjective", "edgeinfer-chat")]["spec"]["poolRef"]
    assert objective["name"] == "edgeinfer-smollm2"


def test_the_endpoint_picker_reads_metrics_edgeinfer_exposes() -> None:
    text = DOCS[("ConfigMap", "edgeinfer-smollm2-epp")]["data"]["epp-config.yaml"]
    config = yaml.safe_load(text)
    [extractor] = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    [engine] = extractor["parameters"]["engineConfigs"]
    assert engine["name"] == POD["metadata"]["labels"]["llm-d.ai/engine-type"]
    snap = {"queued": 0, "slots_busy": 0, "n_ctx": 8,
            "prefix_cache": {"cells_in_use": 0}}
    exposed = {m.name for m in LoadCollector(lambda: {"m": snap}).collect()}
    for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
        assert engine[key] in exposed, key
    assert engine["loraSpec"] == ""  # no adapters, no LoRA metric
    [source] = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    assert source["parameters"]["path"] == "/metrics"
