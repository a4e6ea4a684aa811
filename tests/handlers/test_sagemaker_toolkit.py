"""inference.py under the sagemaker-inference toolkit: in-process through its Transformer with MMS's
request context, and once behind a real Multi Model Server (Java), as SageMaker's toolkit containers run it."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import httpx
import pytest
from conftest import MODEL_DIR, ROOT, free_port

pytest.importorskip("sagemaker_inference", reason="sagemaker-inference is a dev dependency")
mms_context = pytest.importorskip("mms.context", reason="multi-model-server is a dev dependency")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """model.tar.gz with code/, extracted like SageMaker does."""
    root = tmp_path_factory.mktemp("toolkit")
    archive = root / "model.tar.gz"
    subprocess.run([sys.executable, "-m", "infra.sagemaker.package", "--model", str(MODEL_DIR), "--out", str(archive),
                    "--code"], cwd=ROOT, check=True, capture_output=True)
    model = root / "opt" / "ml" / "model"
    model.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(model)
    return model


@pytest.fixture(scope="module")
def transformer(model_dir, monkeypatch_module):
    monkeypatch_module.setenv("TTS_DEVICE", "cpu")
    monkeypatch_module.setenv("TTS_DEFAULT_MAX_NEW_TOKENS", "16")
    monkeypatch_module.syspath_prepend(str(model_dir / "code"))
    sys.modules.pop("inference", None)
    from sagemaker_inference.transformer import Transformer

    t = Transformer()
    ctx = context(model_dir, {"Content-Type": "application/json"})
    t.validate_and_initialize(model_dir=str(model_dir), context=ctx)
    yield t
    importlib.import_module("inference")  # the toolkit imported code/inference.py, not handlers.sagemaker
    assert sys.modules["inference"].__file__.startswith(str(model_dir))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def context(model_dir, headers: dict):
    ctx = mms_context.Context("model", str(model_dir), None, 1, None, "1.1.11")
    ctx.request_processor = [mms_context.RequestProcessor(headers)]
    return ctx


def call(transformer, model_dir, body: bytes | str, headers: dict):
    ctx = context(model_dir, headers)
    raw = body.encode() if isinstance(body, str) else body  # MMS hands the toolkit bytes
    out = transformer.transform([{"body": raw}], ctx)
    return out[0], ctx.get_response_status(0), ctx.get_response_headers(0)


def test_four_functions_through_the_toolkit(transformer, model_dir):
    body, status, headers = call(transformer, model_dir, json.dumps({"text": "Toolkit.", "seed": 1}),
                                 {"Content-Type": "application/json", "Accept": "audio/wav"})
    assert status[0] == 200 and headers["content-type"] == "audio/wav"
    assert body[:4] == b"RIFF" and len(body) == 44 + 15 * 2048 * 2
    body, status, headers = call(transformer, model_dir, json.dumps({"input": "As JSON.", "seed": 2}),
                                 {"Content-Type": "application/json", "Accept": "application/json"})
    meta = json.loads(body)
    assert headers["content-type"] == "application/json" and meta["seed"] == 2 and meta["frames"] == 15


def test_msgpack_and_default_accept(transformer, model_dir):
    import msgpack

    body, status, headers = call(transformer, model_dir, msgpack.packb({"text": "Packed.", "format": "flac"}),
                                 {"Content-Type": "application/x-msgpack"})
    assert status[0] == 200
    # the toolkit turns a missing Accept into SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT (application/json)
    assert headers["content-type"] == "application/json" and json.loads(body)["format"] == "flac"


@pytest.mark.parametrize("body, headers, code, words", [
    ("a,b", {"Content-Type": "text/csv"}, 415, "unsupported content type"),
    ("{bad", {"Content-Type": "application/json"}, 400, "not valid JSON"),
    (json.dumps({"text": ""}), {"Content-Type": "application/json", "Accept": "audio/wav"}, 400, "text is empty"),
    (json.dumps({"text": "x"}), {"Content-Type": "application/json", "Accept": "image/png"}, 406, "cannot produce"),
])
def test_errors_carry_their_status(transformer, model_dir, body, headers, code, words):
    _, status, _ = call(transformer, model_dir, body, headers)
    assert status[0] == code and words in status[1]


def test_real_multi_model_server(model_dir, tmp_path):
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])  # the venv's scripts
    if shutil.which("java", path=path) is None or shutil.which("multi-model-server", path=path) is None:
        pytest.skip("needs Java and multi-model-server")
    port = free_port(below=32768)  # MMS rejects ports above a signed short
    base = model_dir.parent  # SAGEMAKER_BASE_DIR: the model is $BASE/model
    work = tmp_path / "mms"
    work.mkdir()
    env = {**os.environ, "PATH": path, "SAGEMAKER_BASE_DIR": str(base), "SAGEMAKER_BIND_TO_PORT": str(port),
           "SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SAGEMAKER_PROGRAM": "inference.py", "TEMP": str(work),
           "LOG_LOCATION": str(work / "logs"), "METRICS_LOCATION": str(work / "logs"), "TTS_DEVICE": "cpu",
           "TTS_DEFAULT_MAX_NEW_TOKENS": "16"}
    launcher = ("import sagemaker_inference.model_server as ms\n"
                f"ms.MMS_CONFIG_FILE = {str(work / 'mms.properties')!r}  # not /etc: no root needed\n"
                "ms.start_model_server(handler_service='sagemaker_inference.default_handler_service')\n")
    log = open(work / "server.log", "w")  # noqa: SIM115 - a file, not an unread pipe: MMS blocks on a full pipe
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=work, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end, r = time.time() + 240, None
        while time.time() < end:
            try:
                r = httpx.post(url + "/invocations", timeout=120, headers={"accept": "audio/wav"},
                               json={"text": "Through MMS.", "seed": 3})
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        tail = (work / "server.log").read_text()[-3000:]
        assert r is not None and r.status_code == 200, (r.status_code if r else None, tail)
        assert r.headers["content-type"] == "audio/wav" and len(r.content) == 44 + 15 * 2048 * 2
        assert httpx.get(url + "/ping").status_code == 200
        bad = httpx.post(url + "/invocations", content=b"a,b", headers={"content-type": "text/csv"}, timeout=60)
        assert bad.status_code == 415
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-9", "-f", f"model_service_worker.*{work}"], capture_output=True)
        log.close()
