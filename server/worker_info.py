"""What a router in front of several replicas asks a worker: which model it serves and how busy
it is. SGLang's router (`sglang-router`) calls these at registration (`/server_info`, then
`/get_server_info`; `/model_info`, then `/get_model_info`: SGLang's current and older names)
and, for its `power_of_two` policy, `/get_load`; its health checks use `/health`.

Like `/health` and `/metrics`, these are open: a router must reach them without holding a
client's key, and they tell nothing about prompts (the counts are `/metrics`' own gauges).
No model path is given: the router would try to load a tokenizer from it, which its HTTP
routing does not need, and a path on this machine means nothing on the router's.
"""

from __future__ import annotations

from fastapi import FastAPI

from tieredkv import __version__
from tieredkv.engine.protocol import EngineClient

RUNNING_GAUGE = "tieredkv_requests_running"
WAITING_GAUGE = "tieredkv_requests_waiting"


def install_worker_info(
    app: FastAPI, engine: EngineClient, model_name: str, max_model_len: int
) -> None:
    """Add the router's worker endpoints to `app`, answering for `model_name`."""

    def model_info() -> dict:
        return {
            "served_model_name": model_name,
            "is_generation": True,
            "max_context_length": max_model_len,
        }

    def server_info() -> dict:
        return {
            "served_model_name": model_name,
            "is_generation": True,
            "context_length": max_model_len,
            "tp_size": 1,
            "dp_size": 1,
            "version": f"tieredkv {__version__}",
        }

    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, model_info, methods=["GET"], include_in_schema=False)
    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, server_info, methods=["GET"], include_in_schema=False)

    @app.get("/get_load", include_in_schema=False)
    async def get_load() -> list[dict]:
        """One entry per data-parallel rank, as SGLang answers (tieredkv has one)."""
        gauges = gauge_values(engine.render_metrics(), (RUNNING_GAUGE, WAITING_GAUGE))
        running, waiting = gauges[RUNNING_GAUGE], gauges[WAITING_GAUGE]
        return [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting}]


def gauge_values(exposition: str, names: tuple[str, ...]) -> dict[str, int]:
    """The unlabelled samples `names` in Prometheus text `exposition` (0 for one not there:
    the engine has not recorded a step yet)."""
    values = dict.fromkeys(names, 0)
    for line in exposition.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = int(float(value))
    return values
