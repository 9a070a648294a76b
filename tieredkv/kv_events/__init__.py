"""KV events: every page landing in or leaving a local tier, published over ZMQ in vLLM's wire
format (`schema`) by a background thread (`publisher`), for precise prefix-aware routers."""
