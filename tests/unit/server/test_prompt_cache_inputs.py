"""The prompt-caching fields as the server reads them: which name keeps pages warm, the
prompt_cache_key limit, and the retention values the schema accepts."""

import pytest
from tieredkv.server.errors import APIError
from tieredkv.server.generation_inputs import session_key
from tieredkv.server.request_body import parse_body
from tieredkv.server.schemas import ChatCompletionRequest

MESSAGES = b'"messages": [{"role": "user", "content": "hi"}]'


def chat(fields: str = "") -> ChatCompletionRequest:
    return parse_body(b"{" + MESSAGES + (b", " + fields.encode() if fields else b"") + b"}",
                      ChatCompletionRequest)  # fmt: skip


def test_the_header_then_the_key_then_user_name_what_stays_warm() -> None:
    both = chat('"prompt_cache_key": "group", "user": "alice"')
    assert session_key("conversation-7", both) == "conversation-7"
    assert session_key(None, both) == "group"
    assert session_key(None, chat('"user": "alice"')) == "alice"
    assert session_key(None, chat()) is None


def test_prompt_cache_key_is_at_most_256_utf8_bytes() -> None:
    assert session_key(None, chat('"prompt_cache_key": "' + "é" * 128 + '"')) == "é" * 128
    with pytest.raises(APIError) as error:
        session_key(None, chat('"prompt_cache_key": "' + "é" * 129 + '"'))
    assert error.value.status == 400 and error.value.param == "prompt_cache_key"


@pytest.mark.parametrize("value", ['"1h"', '"24H"', '""', "24", "true"])
def test_other_retention_values_are_400s(value: str) -> None:
    with pytest.raises(APIError) as error:
        chat(f'"prompt_cache_retention": {value}')
    assert error.value.status == 400 and error.value.param == "prompt_cache_retention"


def test_retention_values() -> None:
    assert chat('"prompt_cache_retention": "24h"').prompt_cache_retention == "24h"
    assert chat('"prompt_cache_retention": "in_memory"').prompt_cache_retention == "in_memory"
    assert chat('"prompt_cache_retention": null').prompt_cache_retention is None
