"""benchmarks/tenants.py: one `--quick` run against two real servers (fair eviction on and
off). The flood is larger than the host tier, so plain LRU loses every chat's history between
turns; fair eviction keeps at least part of it."""

import json
from pathlib import Path

from benchmarks import tenants


def test_quick_run_keeps_the_chats_history_only_with_fair_eviction(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert tenants.main(["--quick", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    settings = report["settings"]
    turns = report["turns"]
    per_way = settings["turns"] * (settings["chats"] + settings["flood_prompts"])
    assert len(turns) == 2 * per_way

    def cached(way: str, later_turns: bool) -> tuple[int, int]:
        chat = [
            t
            for t in turns
            if t["way"] == way and t["tenant"] != "flood" and bool(t["round_index"]) == later_turns
        ]
        return sum(t["cached_tokens"] for t in chat), sum(t["prompt_tokens"] for t in chat)

    assert cached("fair", later_turns=False)[0] == cached("lru", later_turns=False)[0] == 0
    fair_hits, fair_prompt = cached("fair", later_turns=True)
    lru_hits, _ = cached("lru", later_turns=True)
    assert lru_hits == 0  # the flood pushed every history out of device and host
    assert fair_hits > 0.3 * fair_prompt  # fair: the histories stayed, at least in part
    for turn in turns:
        by_tier = sum(v for v in turn["cached_by_tier"].values() if v)
        assert by_tier == turn["cached_tokens"] and turn["ttft_s"] > 0
    pages = report["namespace_pages_at_end"]["fair"][0]
    assert any(name.startswith("flood-fair") for name in pages)
    summary = (out / "summary.md").read_text()
    assert "| fair |" in summary and "| lru |" in summary
