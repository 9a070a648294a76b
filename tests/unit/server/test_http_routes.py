"""Models, health, metrics, cache flush, the debug view and the OpenAPI document."""

from fastapi.testclient import TestClient

from tests.unit.server.conftest import MAX_MODEL_LEN, MODEL_NAME, make_app
from tests.unit.server.fake_engine import METRICS_TEXT


def test_models_lists_the_served_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == MODEL_NAME and card["object"] == "model"
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert client.get(f"/v1/models/{MODEL_NAME}").json() == card


def test_health_is_200_only_when_ready_and_lists_tiers(client, engine):
    response = client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["ready"] is True and body["status"] == "ok"
    assert body["tiers"] == {"device": "healthy", "host": "healthy", "disk": "disabled"}
    engine.ready = False
    response = client.get("/health")
    assert response.status_code == 503 and response.json()["ready"] is False
    assert client.post("/v1/cache/flush").status_code == 503


def test_metrics_is_the_engines_prometheus_text(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.text == METRICS_TEXT
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")


def test_flush_drops_the_cache(client, engine):
    response = client.post("/v1/cache/flush")
    assert response.status_code == 200 and response.json() == {"flushed_pages": 42}
    assert engine.flushes == 1


def test_debug_cache_only_with_debug_endpoints(engine):
    app = make_app(engine, debug_endpoints=True)
    with TestClient(app) as client:
        response = client.get("/debug/cache")
        assert response.status_code == 200 and response.json()["ok"] is True


def test_openapi_describes_the_request_bodies(client):
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for path, model in (
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/completions", "CompletionRequest"),
    ):
        operation = schema["paths"][path]["post"]
        body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body_schema == {"$ref": f"#/components/schemas/{model}"}
        assert {"400", "404", "413", "429", "503"} <= set(operation["responses"])
        assert any(p["name"] == "X-Cache-Namespace" for p in operation["parameters"])
    assert "messages" in components["ChatCompletionRequest"]["required"]
    assert "prompt" in components["CompletionRequest"]["required"]
    for field in ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop", "cache_salt"):
        assert field in components["ChatCompletionRequest"]["properties"]
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert refs and all(r.removeprefix("#/components/schemas/") in components for r in refs)
