import pytest

from tieredkv.config import CacheConfig, EngineConfig, parse_size
from tieredkv.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("1K", 1024),
        ("2KiB", 2048),
        ("3M", 3 << 20),
        ("1GiB", 1 << 30),
        ("1 TiB", 1 << 40),
        ("5g", 5 << 30),
    ],
)
def test_parse_size_units_are_binary(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1", "1.5G", "10KB", "1Gi"])
def test_parse_size_rejects_bad_text(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text)


def test_page_size_must_be_power_of_two() -> None:
    with pytest.raises(ConfigError, match="page_size"):
        CacheConfig(page_size=24)


def test_engine_config_names_bad_field() -> None:
    with pytest.raises(ConfigError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
