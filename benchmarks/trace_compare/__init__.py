"""Replaying Mooncake's FAST'25 conversation trace through vLLM's own client
(`vllm bench serve --dataset-name timed_trace`) against tieredkv and vLLM's CPU build.

`scaling` selects whole conversations and scales them to this machine, `replay` runs the
client against one server and reads what it saved, `report` renders the runs.
"""
