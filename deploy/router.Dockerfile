# SGLang's router (sglang-router, the Rust router in a Python wheel) in front of the replicas.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
RUN pip install --no-cache-dir sglang-router==0.3.2
EXPOSE 30000
ENTRYPOINT ["python", "-m", "sglang_router.launch_router"]
