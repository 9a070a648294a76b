"""The endpoints SGLang's router asks a worker: open even with keys, answering with the served
model's name, its context length and the engine's own running/waiting gauges."""

from fastapi.testclient import TestClient
from tieredkv.server.worker_info import gauge_values

from tests.unit.server.conftest import MAX_MODEL_LEN, MODEL_NAME, make_app

GAUGES = """# HELP tieredkv_requests_running Requests in the running batch.
# TYPE tieredkv_requests_running gauge
tieredkv_requests_running 3
# TYPE tieredkv_requests_waiting gauge
tieredkv_requests_waiting 2
tieredkv_requests_waiting_total 99
"""


def test_model_and_server_info_under_both_names_need_no_key(engine):
    client = TestClient(make_app(engine, api_key="sekrit"))
    assert client.get("/v1/models").status_code == 401
    for path in ("/model_info", "/get_model_info"):
        body = client.get(path).json()
        assert body["served_model_name"] == MODEL_NAME
        assert body["max_context_length"] == MAX_MODEL_LEN and "model_path" not in body
    for path in ("/server_info", "/get_server_info"):
        body = client.get(path).json()
        assert body["served_model_name"] == MODEL_NAME and body["dp_size"] == 1
        assert body["context_length"] == MAX_MODEL_LEN


def test_load_is_the_engines_gauges(engine, monkeypatch):
    client = TestClient(make_app(engine, api_key="sekrit"))
    # before the engine records a step there are no gauges: an idle worker
    assert client.get("/get_load").json() == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}]
    monkeypatch.setattr(engine, "render_metrics", lambda: GAUGES)
    assert client.get("/get_load").json() == [{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2}]


def test_gauge_values_reads_only_the_named_samples():
    names = ("tieredkv_requests_running", "tieredkv_requests_waiting", "tieredkv_absent")
    assert gauge_values(GAUGES, names) == {
        "tieredkv_requests_running": 3,
        "tieredkv_requests_waiting": 2,
        "tieredkv_absent": 0,
    }
