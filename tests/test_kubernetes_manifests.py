"""The Kubernetes manifests of examples/kubernetes hold together, and their commands work.

The manifests are parsed as ``kubectl apply`` reads them (every YAML document) and checked
for what a user relies on: the Service selects the master's pods and reaches the ports the
master listens on, every secret and ConfigMap a pod refers to exists (the Secrets are those
that docs/how-to/deploying.md creates), every mount names a volume, the journal lies on a
PersistentVolumeClaim, the trainers' ``/dev/shm`` is memory and larger than their budget,
and the pages show the files as they are.

Then the containers run here as the kubelet would run them: each container's command, args
and environment, resolved as Kubernetes resolves them (``$(VAR)``, ConfigMap, Secret and
downward-API references), with the values that only mean something in a cluster replaced by
local ones in the explicit mappings below (volume mount paths -> folders under tmp_path, the
Service -> 127.0.0.1 and a free port, the data's URL -> record files written here, the
job's size -> a small one). The master (TLS, token, journal) and two trainer pods (train.py)
train over two epochs; the master is SIGKILLed mid-epoch and started again from the same
command on the same journal, and one trainer is sent SIGTERM in the last epoch (a pod evicted)
and started again on its checkpoint. Every record reaches a trainer's loop once per epoch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import yaml
from _dataset_helpers import REPO_ROOT, shm_entries, subprocess_env, wait_gone
from _tls import make_pki

import shmloader
from shmloader.formats.example import encode_example

K8S = REPO_ROOT / "examples" / "kubernetes"
MANIFESTS = ("master.yaml", "train-elastic.yaml")
DEPLOYING = REPO_ROOT / "docs" / "how-to" / "deploying.md"
# A page's copy of a file: the comment naming it, then a fenced block equal to the file.
SHOWN = re.compile(
    r"^<!-- example: (examples/kubernetes/[\w.-]+) -->\n```\w*\n(.*?)^```$", re.M | re.S
)

EPOCHS = 2
SIZES = [920, 800, 680]  # three files, 2,400 records: 60 tasks of 40 an epoch
RECORDS = sum(SIZES)
TRAINERS = 2
VAR = re.compile(r"\$\((\w+)\)")  # Kubernetes' $(VAR) in command, args and env values

Doc = dict[str, Any]


@pytest.fixture(autouse=True)
def _no_leftover_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pods' variables come from the manifests alone, not from this process."""
    for name in ("SHMLOADER_TOKEN", "SHMLOADER_TLS_CA", "SHMLOADER_SHM_DIR", "SHMLOADER_MASTER"):
        monkeypatch.delenv(name, raising=False)


def load_train() -> ModuleType:
    """examples/kubernetes/train.py as a module (its record format, its exit status)."""
    spec = importlib.util.spec_from_file_location("k8s_train", K8S / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the manifests, as documents -----------------------------------------------------------


def manifests() -> dict[tuple[str, str], Doc]:
    """Every document of the manifests by (kind, name): what ``kubectl apply -f`` creates."""
    out: dict[tuple[str, str], Doc] = {}
    for name in MANIFESTS:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            assert isinstance(doc, dict), f"{name}: an empty or odd document"
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), (name, doc)
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{name}: {key} twice"
            out[key] = doc
    return out


def created_secrets() -> dict[str, set[str]]:
    """The Secrets deploying.md creates (``kubectl create secret generic``): name -> keys."""
    text = re.sub(r"\\\n[#\s]*", " ", DEPLOYING.read_text())  # continued lines, also in comments
    found: dict[str, set[str]] = {}
    for name, options in re.findall(
        r"kubectl create secret generic ([\w-]+)((?:\s+--from-(?:file|literal)=\S+)+)", text
    ):
        keys = found.setdefault(name, set())
        for kind, value in re.findall(r"--from-(file|literal)=(\S+)", options):
            keys.add(value.split("=")[0] if kind == "literal" or "=" in value else value)
    return found


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def the_container(doc: Doc) -> Doc:
    containers = pod_spec(doc)["containers"]
    assert len(containers) == 1, doc["metadata"]["name"]
    container: Doc = containers[0]
    return container


def option(args: list[str], name: str) -> str:
    """The value of ``--name=value`` in ``args`` (the manifests spell options so)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name}= in {args}"
    return values[0]


def volume_of(doc: Doc, path: str) -> tuple[str, Doc]:
    """The mount path that holds ``path`` in the pod of ``doc``, and its volume."""
    container = the_container(doc)
    volumes = {v["name"]: v for v in pod_spec(doc).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            return mount["mountPath"], volumes[mount["name"]]
    raise AssertionError(f"{path} is on no volume of {doc['metadata']['name']}")


def memory_bytes(size: str) -> int:
    """Bytes of a Kubernetes quantity (``2Gi``) or a shmloader size (``1GiB``)."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]i)B?", size)
    assert m, size
    return int(m[1]) << (10 * ("KiMiGiTi".index(m[2]) // 2 + 1))


# -- the checks --------------------------------------------------------------------------


def test_the_manifests_hold_together() -> None:
    docs = manifests()
    secrets_made = created_secrets()
    assert secrets_made.keys() >= {"shmloader-token", "shmloader-tls"}, secrets_made
    config_maps = {
        name: d.get("data", {}) for (kind, name), d in docs.items() if kind == "ConfigMap"
    }
    claims = {name: d for (kind, name), d in docs.items() if kind == "PersistentVolumeClaim"}
    deployment = docs["Deployment", "shmloader-master"]
    service = docs["Service", "shmloader-master"]
    job = docs["Job", "shmloader-train"]
    master, trainer = the_container(deployment), the_container(job)

    # One master at a time on its journal.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items(), "the Service selects no master"

    # The Service reaches the ports the master listens on, and only those.
    args = master["args"]
    ports = {p["name"]: p["containerPort"] for p in master["ports"]}
    listens = {int(option(args, "--port")), int(option(args, "--metrics-port"))}
    assert set(ports.values()) == listens, (ports, args)
    assert option(args, "--host") == "0.0.0.0"  # reachable from other pods

    def container_port(port: int | str) -> int:
        return ports[port] if isinstance(port, str) else port

    targets = {container_port(p.get("targetPort", p["port"])) for p in service["spec"]["ports"]}
    assert targets == listens, service["spec"]["ports"]
    assert container_port(master["readinessProbe"]["tcpSocket"]["port"]) == ports["grpc"]

    for doc in (deployment, job):
        container = the_container(doc)
        where = doc["metadata"]["name"]
        # Every Secret and ConfigMap a variable names exists, with that key.
        for var in container.get("env", []):
            ref = var.get("valueFrom", {})
            if "secretKeyRef" in ref:
                secret = ref["secretKeyRef"]
                assert secret["key"] in secrets_made.get(secret["name"], set()), (where, var)
            if "configMapKeyRef" in ref:
                config = ref["configMapKeyRef"]
                assert config["key"] in config_maps.get(config["name"], {}), (where, var)
        # Every mount names a volume; every volume exists.
        volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}
        assert {m["name"] for m in container["volumeMounts"]} == volumes.keys(), where
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, (where, volume)
            if "secret" in volume:
                keys = secrets_made[volume["secret"]["secretName"]]
                items = volume["secret"].get("items", [])
                assert {i["key"] for i in items} <= keys, (where, volume)
        # Every variable a command, an argument or a value names is defined before it.
        container_env(container, config_maps, fake_secrets(secrets_made), index=0)

    # The journal and the certificates lie on the volumes that hold them.
    mount, volume = volume_of(deployment, option(args, "--journal"))
    assert "persistentVolumeClaim" in volume, "the journal would not outlive its pod"
    tls_keys = secrets_made["shmloader-tls"]
    for name in ("--tls-cert", "--tls-key"):
        mount, volume = volume_of(deployment, option(args, name))
        assert volume["secret"]["secretName"] == "shmloader-tls"
        assert os.path.relpath(option(args, name), mount) in tls_keys
    # The master reads the token from the Secret, not from its command line.
    assert not any(a.startswith("--token") for a in args)
    env = {v["name"]: v for v in master["env"]}
    assert env["SHMLOADER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "shmloader-token"

    # The trainers: the master's Service, its token and CA, its data and epochs.
    env = {v["name"]: v for v in trainer["env"]}
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert env["SHMLOADER_MASTER"]["value"] == f"{service['metadata']['name']}:{grpc['port']}"
    assert env["SHMLOADER_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "shmloader-token", "key": "token"}
    }
    mount, volume = volume_of(job, env["SHMLOADER_TLS_CA"]["value"])
    assert volume["secret"]["secretName"] == "shmloader-tls"
    assert os.path.relpath(env["SHMLOADER_TLS_CA"]["value"], mount) in tls_keys
    master_env = {v["name"]: v for v in master["env"]}
    assert args[0] == "$(DATA)" and option(args, "--epochs") == "$(EPOCHS)"
    for name in ("DATA", "EPOCHS"):  # the same ConfigMap keys as the master's
        assert env[name]["valueFrom"] == master_env[name]["valueFrom"], name
    # /dev/shm: memory, larger than the readers' budget.
    mount, volume = volume_of(job, "/dev/shm")
    assert mount == "/dev/shm" and volume["emptyDir"]["medium"] == "Memory"
    budget = memory_bytes(option(trainer["args"], "--shm-budget"))
    assert memory_bytes(volume["emptyDir"]["sizeLimit"]) > budget
    assert memory_bytes(volume["emptyDir"]["sizeLimit"]) < memory_bytes(
        trainer["resources"]["limits"]["memory"]
    )
    # Each trainer's checkpoint on storage that every node mounts, under the pod's index.
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"]
    mount, volume = volume_of(job, env["CHECKPOINT"]["value"])
    claim = claims[volume["persistentVolumeClaim"]["claimName"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "$(INDEX)" in env["CHECKPOINT"]["value"]
    # The script the trainers run is the file beside the manifests.
    assert trainer["command"] == ["python", "train.py"] and trainer["workingDir"] == "/app"
    assert (K8S / "train.py").is_file()


def test_the_deploying_page_shows_the_files_as_they_are() -> None:
    page = DEPLOYING.read_text()
    shown = {path: code for path, code in SHOWN.findall(page)}
    expected = {f"examples/kubernetes/{name}" for name in (*MANIFESTS, "train.py")}
    assert shown.keys() == expected, sorted(shown)
    for path, code in shown.items():
        assert code == (REPO_ROOT / path).read_text(), f"{path} differs from its copy in the page"


# -- the containers, resolved as the kubelet resolves them ----------------------------------


def fake_secrets(made: dict[str, set[str]]) -> dict[str, dict[str, str]]:
    return {name: {key: f"<{name}/{key}>" for key in keys} for name, keys in made.items()}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)``: a variable defined before (in env order); none may be missing
    (Kubernetes would leave the text as it is, and the program would get ``$(VAR)``)."""

    def value(m: re.Match[str]) -> str:
        assert m[1] in env, f"$({m[1]}) names no variable defined before it"
        return env[m[1]]

    return VAR.sub(value, text)


def container_env(
    container: Doc,
    config_maps: dict[str, dict[str, str]],
    secret_values: dict[str, dict[str, str]],
    index: int,
) -> dict[str, str]:
    """The container's variables, resolved in order, and its command and args checked for
    references to them; ``index``: the pod's completion index (an indexed Job's annotation)."""
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
            continue
        ref = var["valueFrom"]
        if "configMapKeyRef" in ref:
            config = ref["configMapKeyRef"]
            env[var["name"]] = config_maps[config["name"]][config["key"]]
        elif "secretKeyRef" in ref:
            secret = ref["secretKeyRef"]
            env[var["name"]] = secret_values[secret["name"]][secret["key"]]
        else:
            m = re.fullmatch(r"metadata\.annotations\['(.+)'\]", ref["fieldRef"]["fieldPath"])
            assert m, ref
            env[var["name"]] = annotations[m[1]]
    for text in [*container.get("command", []), *container.get("args", [])]:
        expand(text, env)
    return env


def at_local_paths(text: str, mounts: dict[str, Path]) -> str:
    """``text`` with each mount path (at a path's start) replaced by its folder here."""
    for mount, here in mounts.items():
        text = re.sub(rf"(?<![\w/]){re.escape(mount)}(?=/|$)", str(here), text)
    return text


def replaced(args: list[str], mapping: dict[str, str]) -> list[str]:
    """``args`` with the whole arguments of ``mapping`` replaced, each of which must be there
    (a manifest that changed fails here, rather than run with a cluster's value)."""
    missing = mapping.keys() - set(args)
    assert not missing, f"the manifest no longer has {sorted(missing)}: {args}"
    return [mapping.get(a, a) for a in args]


def free_port() -> int:
    """A port free now, for a master that must come back on the same one after its kill."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pod:
    """A container of a manifest run here as a process: ``argv``, ``env`` and ``cwd`` as the
    kubelet would give them, with the local values. Started again on the same log."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path, log: Path):
        self.name, self.argv, self.env, self.cwd, self.log = name, argv, env, cwd, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        # A file, not a pipe: reader processes inherit it and may outlive the trainer.
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self.proc

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> set[int]:
        """The pids of the processes it started (its readers), while it runs."""
        if not self.running():
            return set()
        assert self.proc is not None
        with contextlib.suppress(psutil.Error):
            return {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}
        return set()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()


def wait_until(
    condition: Callable[[], bool], what: str, pods: list[Pod], timeout: float = 120.0
) -> None:
    """Poll ``condition``; fail if a pod in ``pods`` exits first, or after ``timeout`` (a bound
    for a loaded machine, not a measure)."""
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [p for p in pods if not p.running()]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}:\n{p.output()}" for p in pods)
            raise AssertionError(f"waiting for {what}: {[p.name for p in dead]} ended\n{logs}")
        time.sleep(0.05)


def delivered(logs: list[Path]) -> dict[int, Counter[int]]:
    """epoch -> how often each record id reached a trainer's loop, from train.py's ids logs."""
    out: dict[int, Counter[int]] = {}
    for path in logs:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                batch = json.loads(line)
                out.setdefault(batch["epoch"], Counter()).update(batch["ids"])
    return out


def write_records(folder: Path, features: int) -> None:
    """Record files of tf.train.Example as train.py reads them, ids 0 .. RECORDS - 1."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    first = 0
    for f, size in enumerate(SIZES):
        x = rng.standard_normal((size, features)).astype(np.float32)
        shmloader.write_records(
            folder / f"part-{f:05d}.tfrecord",
            (
                encode_example({"id": first + i, "x": x[i], "label": int(x[i].sum() > 0)})
                for i in range(size)
            ),
        )
        first += size


@pytest.mark.long
def test_the_pods_commands_train_here_through_a_master_kill_and_an_eviction(
    tmp_path: Path,
) -> None:
    train = load_train()
    docs = manifests()
    made = created_secrets()
    data = tmp_path / "data"
    write_records(data, train.FEATURES)
    grpc, metrics = free_port(), free_port()

    # What the cluster provides, here.
    (config,) = [d for (kind, _), d in docs.items() if kind == "ConfigMap"]
    local_config = {
        "data": str(data / "*.tfrecord"),  # was s3://...
        "epochs": str(EPOCHS),
        "records-per-task": "40",
    }
    assert local_config.keys() == config["data"].keys()
    config_maps = {config["metadata"]["name"]: local_config}
    token = secrets.token_urlsafe(16)
    secret_values = {"shmloader-token": {"token": token}}
    assert made["shmloader-token"] == {"token"}
    # The TLS Secret, mounted: the names of the certificate match the Service's name, as the
    # page says to make them (and 127.0.0.1, which the trainers reach the master by here).
    tls = tmp_path / "secret-shmloader-tls"
    make_pki(tls, names=("shmloader-master", "localhost", "127.0.0.1"))
    assert {p.name for p in tls.iterdir()} == made["shmloader-tls"]
    volumes = {  # mount path -> folder here
        "/var/lib/shmloader": tmp_path / "pvc-shmloader-journal",
        "/etc/shmloader/tls": tls,
        "/checkpoints": tmp_path / "pvc-shmloader-checkpoints",
    }
    commands = {"shmloader": [sys.executable, "-m", "shmloader"], "python": [sys.executable]}

    def pod(doc: Doc, name: str, args: dict[str, str], extra: list[str], index: int = 0) -> Pod:
        container = the_container(doc)
        env = container_env(container, config_maps, secret_values, index)
        for mount in container["volumeMounts"]:
            assert mount["mountPath"] in (*volumes, "/dev/shm"), mount
        env = {k: at_local_paths(v, volumes) for k, v in env.items()}
        argv = [*container["command"], *replaced(container.get("args", []), args)]
        argv = [at_local_paths(expand(a, env), volumes) for a in argv]
        argv = [*commands[argv[0]], *argv[1:], *extra]
        workdir = {"/app": K8S}[container.get("workingDir", "/app")]
        local = {**subprocess_env(), **env}
        return Pod(name, argv, local, workdir, tmp_path / f"{name}.log")

    master = pod(
        docs["Deployment", "shmloader-master"],
        "master",
        {
            "--host=0.0.0.0": "--host=127.0.0.1",
            "--port=50051": f"--port={grpc}",
            "--metrics-port=9100": f"--metrics-port={metrics}",
        },
        [],
    )
    assert master.argv[3:5] == ["master", str(data / "*.tfrecord")], master.argv
    master.env["PYTHONFAULTHANDLER"] = "1"  # a stack dump on SIGABRT, should it hang
    assert f"--journal={tmp_path / 'pvc-shmloader-journal' / 'journal'}" in master.argv
    ids_logs = [tmp_path / f"ids-{i}.jsonl" for i in range(TRAINERS)]
    trainers = []
    for i in range(TRAINERS):
        trainer = pod(
            docs["Job", "shmloader-train"],
            f"trainer-{i}",
            {
                "--batch-size=256": "--batch-size=16",
                "--readers=4": "--readers=1",
                "--shm-budget=1GiB": "--shm-budget=32MiB",
            },
            # A step as long as a bigger model's, and what each batch held.
            ["--step-seconds=0.05", f"--ids-log={ids_logs[i]}"],
            index=i,
        )
        assert trainer.env["SHMLOADER_MASTER"] == "shmloader-master:50051"
        trainer.env["SHMLOADER_MASTER"] = f"127.0.0.1:{grpc}"  # the Service
        trainer.env["SHMLOADER_SHM_DIR"] = str(tmp_path / f"pod-{i}-dev-shm")  # its /dev/shm
        os.makedirs(trainer.env["SHMLOADER_SHM_DIR"])
        trainers.append(trainer)

    listening = f"listening on 127.0.0.1:{grpc}"

    def start_master() -> None:
        before = master.output().count(listening)
        master.start()
        wait_until(lambda: master.output().count(listening) > before, "the master", [master])

    pods = [master, *trainers]
    readers: set[int] = set()
    try:
        start_master()
        with socket.create_connection(("127.0.0.1", metrics), timeout=10):
            pass  # the Service's other port: /metrics
        for trainer in trainers:
            trainer.start()

        def records_of(log: Path, epoch: int | None = None) -> int:
            counts = delivered([log])
            return sum(sum(c.values()) for e, c in counts.items() if epoch in (None, e))

        wait_until(
            lambda: all(records_of(log) >= 32 for log in ids_logs), "both trainers' batches", pods
        )
        # The master's pod dies (a node lost): SIGKILL mid-job, then the same command on the
        # same journal, as the Deployment starts it again.
        assert sum(records_of(log) for log in ids_logs) < EPOCHS * RECORDS
        assert master.proc is not None
        master.proc.send_signal(signal.SIGKILL)
        master.proc.wait()
        start_master()

        # A trainer's pod is evicted in the last epoch: SIGTERM, it saves and exits; its
        # replacement runs the same command on the same checkpoint.
        evicted = trainers[1]
        wait_until(
            lambda: records_of(ids_logs[1], EPOCHS - 1) >= 32,
            "trainer 1's batches of the last epoch",
            pods,
        )
        assert evicted.proc is not None
        evicted.proc.send_signal(signal.SIGTERM)
        assert evicted.proc.wait(120) == train.SIGTERM_EXIT, evicted.output()
        assert "SIGTERM: saved" in evicted.output()
        evicted.start()

        deadline = time.monotonic() + 180
        while any(t.running() for t in trainers) and time.monotonic() < deadline:
            for t in trainers:  # their readers, to see them gone
                readers |= t.children()
            time.sleep(0.2)
        codes = [t.proc.poll() if t.proc else None for t in trainers]
        assert codes == [0] * TRAINERS, "\n".join(f"--- {p.name}:\n{p.output()}" for p in pods)
        assert f"resumed from {tmp_path / 'pvc-shmloader-checkpoints'}" in evicted.output()
        assert master.proc is not None
        # The Deployment deleted: SIGTERM, and the master stops, printing its progress.
        master.proc.send_signal(signal.SIGTERM)
        try:
            code = master.proc.wait(60)
        except subprocess.TimeoutExpired:  # its threads' stacks (faulthandler), to see where
            master.proc.send_signal(signal.SIGABRT)
            code = master.proc.wait(30)
        assert code == 0, master.output()
    finally:
        for p in pods:
            p.stop()

    # Every record once per epoch, over the trainers, the master's restart and the eviction.
    got = delivered(ids_logs)
    assert sorted(got) == list(range(EPOCHS))
    for epoch in range(EPOCHS):
        assert got[epoch] == Counter(range(RECORDS)), (
            epoch,
            sorted((got[epoch] - Counter(range(RECORDS))).items())[:10],
            sorted((Counter(range(RECORDS)) - got[epoch]).items())[:10],
        )
    assert f"stopped: {EPOCHS} of {EPOCHS} epoch(s) finished" in master.output()
    assert "Handshake failed" not in master.output()
    # The checkpoints hold the end of the job; nothing of ours is left in shared memory.
    for i in range(TRAINERS):
        saved = torch.load(tmp_path / "pvc-shmloader-checkpoints" / f"trainer-{i}.pt")
        assert saved["data"]["epoch"] == EPOCHS
    assert wait_gone(readers) == []
    for i in range(TRAINERS):
        assert shm_entries(tmp_path / f"pod-{i}-dev-shm") == []
