"""The OpenAI-compatible HTTP server (installed as tieredkv.server).

app.py                create_app(engine, tokenizer, server_config, model_name, max_model_len, clock)
completions.py        the two completion endpoints: body -> GenerationRequest -> JSON or SSE
schemas.py            pydantic request models (validation and the OpenAPI document)
request_body.py       the body under --max-request-bytes, JSON validation errors as 400s
generation_inputs.py  model name, unsupported values, namespace, prompt ids, sampling, context
                      limit: the inputs of a GenerationRequest
responses.py          response bodies, stream chunks, usage
streaming.py          reading the engine's stream: first update, collect, SSE, client hang-ups
errors.py             OpenAI's error shape and the exception handlers
openapi.py            request-body component schemas in /openapi.json
worker_info.py        what a router asks a worker: model info, server info, load
runner.py             uvicorn (uvloop) with the graceful SIGTERM
"""
