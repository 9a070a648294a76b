"""deploy/grafana/tieredkv.json queries only metrics the server exports, by their exported names
(a renamed metric would leave a panel silently empty)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tieredkv.engine.metrics import EngineMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tieredkv.json"
SUFFIXES = ("_bucket", "_sum", "_count")


def exported_families() -> set[str]:
    text = EngineMetrics().render()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_every_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    families = exported_families()
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"\btieredkv_[a-z_]+", target["expr"]):
                for suffix in SUFFIXES:
                    name = name.removesuffix(suffix)
                assert name in families, (panel["title"], name)
                queried.add(name)
    # the contract's headline figures are all on the dashboard
    for name in ("time_to_first_token_seconds", "cache_hit_tokens_total", "tier_used_bytes"):
        assert f"tieredkv_{name}" in queried
