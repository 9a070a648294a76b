"""`tieredkv serve` flags -> configs, start-up errors as one line, and the graceful SIGTERM of
the uvicorn runner (with the fake engine, in a child process)."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tieredkv.cli import main
from tieredkv.cli_parser import build_parser
from tieredkv.config import SchedulePolicy, WritePolicy
from tieredkv.serve_settings import serve_settings

GiB = 1 << 30


def settings(*flags):
    return serve_settings(build_parser().parse_args(["serve", *flags]))


def test_defaults_fit_a_small_machine():
    s = settings()
    assert (s.server.host, s.server.port, s.server.api_key) == ("127.0.0.1", 8000, None)
    assert s.cache.device_cache_bytes == 2 * GiB and s.cache.host_cache_bytes == 4 * GiB
    assert s.cache.disk_cache_bytes == 0 and not s.cache.disk_enabled  # no dir given
    assert s.cache.page_size == 16 and s.cache.enable_prefix_reuse
    assert s.cache.write_policy is WritePolicy.WRITE_THROUGH  # the policy grid's choice
    assert s.server.max_request_bytes == 1 << 20 and not s.server.debug_endpoints
    assert s.server.max_request_tokens == 1 << 16
    assert s.engine.schedule_policy is SchedulePolicy.LPM and s.engine.dtype == "auto"
    assert s.model is None and s.max_model_len is None and s.served_model_name is None
    assert s.cache.namespace_share is None  # fair tenants: an equal part of device and host


def test_every_flag_reaches_its_config(tmp_path):
    s = settings(
        "--model", "/m", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "9000",
        "--dtype", "float32", "--max-model-len", "4096", "--page-size", "32",
        "--device-cache-size", "512MiB", "--host-cache-size", "0",
        "--disk-cache-dir", str(tmp_path), "--disk-cache-size", "3G",
        "--write-policy", "write_back", "--schedule-policy", "fcfs",
        "--max-batch-tokens", "1024", "--max-num-seqs", "8", "--max-queue", "5",
        "--max-request-bytes", "64KiB", "--api-key", "k", "--no-cache", "--debug-endpoints",
        "--max-connections", "40", "--namespace-share", "0.25", "--remote-budget-scale", "3",
        "--max-request-tokens", "5000",
    )  # fmt: skip
    assert (s.model, s.served_model_name, s.max_model_len) == ("/m", "chat", 4096)
    assert (s.server.host, s.server.port, s.server.api_key) == ("0.0.0.0", 9000, "k")
    assert s.server.max_request_bytes == 64 << 10 and s.server.debug_endpoints
    assert s.server.max_connections == 40 and s.server.max_request_tokens == 5000
    assert s.cache.page_size == 32 and s.cache.device_cache_bytes == 512 << 20
    assert not s.cache.host_enabled and s.cache.disk_enabled
    assert s.cache.disk_cache_dir == tmp_path and s.cache.disk_cache_bytes == 3 * GiB
    assert s.cache.write_policy is WritePolicy.WRITE_BACK and not s.cache.enable_prefix_reuse
    assert s.engine.schedule_policy is SchedulePolicy.FCFS and s.engine.dtype == "float32"
    assert (s.engine.max_batch_tokens, s.engine.max_num_seqs, s.engine.max_queue) == (1024, 8, 5)
    assert s.engine.max_model_len == 4096
    assert s.cache.namespace_share == 0.25 and s.cache.remote_budget_scale == 3.0
    assert settings("--namespace-share", "equal").cache.namespace_share is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device-cache-size", "10KB"], "invalid size"),
        (["--host-cache-size", "lots"], "invalid size"),
        (["--port", "70000"], "65535"),
        (["--max-num-seqs", "0"], "must be > 0"),
        (["--dtype", "int8"], "invalid choice"),
        (["--page-size", "24"], "--page-size must be a power of two, got 24"),
        (["--device-cache-size", "0"], "--device-cache-size must be > 0"),
        (["--max-request-bytes", "0"], "--max-request-bytes must be > 0"),
        (["--max-connections", "0"], "must be > 0"),
        (["--max-request-tokens", "0"], "must be > 0"),
        (["--namespace-share", "0"], "(0, 1]"),
        (["--remote-budget-scale", "0"], "--remote-budget-scale must be > 0"),
        (["--disk-cache-size", "4GiB"], "--disk-cache-size needs --disk-cache-dir"),
        (["--disk-cache-dir", "/nonexistent-parent/kv"], "its parent /nonexistent-parent"),
        (["--disk-cache-dir", "/tmp", "--disk-cache-size", "1000TiB"], "does not fit on"),
        (["--namespace-share", "half"], "`equal` or a fraction"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_flags_are_one_line_errors(capsys, flags, message):
    with pytest.raises(SystemExit) as exited:
        sys.exit(main(["serve", *flags]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert "Config." not in err  # the flags' names, not the classes behind them


def test_the_disk_tier_follows_its_directory(tmp_path):
    fresh = tmp_path / "kv"  # does not exist yet; its parent does
    s = settings("--disk-cache-dir", str(fresh))
    assert s.cache.disk_enabled and s.cache.disk_cache_bytes == 16 * GiB  # the default size
    assert not fresh.exists()  # nothing is created before the model loads
    assert not settings("--disk-cache-dir", str(fresh), "--disk-cache-size", "0").cache.disk_enabled
    assert not settings("--disk-cache-size", "0").cache.disk_enabled


def test_a_store_already_there_counts_as_free_space(tmp_path, monkeypatch):
    import os

    from tieredkv import serve_flags

    free = 8 * GiB
    monkeypatch.setattr(
        serve_flags.os,
        "statvfs",
        lambda path: os.statvfs_result((4096, 4096, 0, 0, free // 4096, 0, 0, 0, 0, 255)),
    )
    with pytest.raises(Exception, match="does not fit"):
        settings("--disk-cache-dir", str(tmp_path), "--disk-cache-size", "8GiB")
    store = tmp_path / "pages-0.tkv"
    with open(store, "wb") as file:
        os.posix_fallocate(file.fileno(), 0, 2 * GiB)  # the store of an earlier run
    reopened = settings("--disk-cache-dir", str(tmp_path), "--disk-cache-size", "8GiB")
    assert reopened.cache.disk_enabled


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 2GiB)", "(default: 4GiB)", "(default: 16)", "(default: 8000)",
                  "(default with --disk-cache-dir: 16GiB", "(default: 256)"):  # fmt: skip
        assert shown in text, shown


def test_a_missing_model_is_an_error_message_not_a_traceback(capsys, tmp_path):
    missing = str(tmp_path / "missing")
    assert main(["serve", "--model", missing, "--dtype", "float32", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tieredkv serve: error:") and "missing" in err and "Traceback" not in err


def test_unknown_benchmark_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "nosuch"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


CHILD = textwrap.dedent(
    """
    import asyncio, json, pathlib, sys
    from tests.model_factory import CHATML_TEMPLATE, build_tiny_tokenizer
    from tests.unit.server.fake_engine import FakeEngine
    from tieredkv.config import ServerConfig
    from tieredkv.model.tokenizer import ChatTokenizer
    from tieredkv.server.app import create_app
    from tieredkv.server.runner import serve

    out = pathlib.Path(sys.argv[1])
    build_tiny_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    engine = FakeEngine(ChatTokenizer(out))

    async def shutdown(timeout=8.0):
        await asyncio.sleep(0)
        (out / "shutdown").write_text(str(timeout))

    engine.shutdown = shutdown
    config = ServerConfig(port=0)
    app = create_app(engine, engine.tokenizer, config, "m", 64)
    print("serving", flush=True)
    serve(app, engine, config)
    print("exited", flush=True)
    """
)


def test_sigterm_shuts_the_engine_down_and_exits_zero(tmp_path):
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "serving\n"
        for line in child.stderr:  # uvicorn logs once it listens
            if "Uvicorn running" in line:
                break
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0
    assert "exited" in out
    assert float((tmp_path / "shutdown").read_text()) <= 8.0
