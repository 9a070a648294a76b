"""`POST /v1/cache/pin` and `DELETE /v1/cache/pin` (pinned prefixes, `tieredkv.cache.pins`),
an admin's `GET /v1/cache/pins` and `DELETE /v1/cache/pins/{id}` over every namespace's pins,
and the pins made at start: those an earlier run saved (less those of a tenant no key names any
more), then `--pin-file`'s.

A pin names a prompt (text or token ids, as `/v1/completions` takes it) or chat messages (the
template applied without the generation prompt, so it is a prefix of every later turn), in a
namespace resolved as for completions (`cache_salt`, the header, the caller's tenant).
`--pin-file`: one JSON object a line, `{"prompt": ...}` or `{"messages": [...]}`, optionally
with `"cache_salt"`; blank lines and lines starting with `#` are skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from tieredkv.config import KeyGrant, ServerConfig
from tieredkv.engine.protocol import EngineClient
from tieredkv.errors import ConfigError
from tieredkv.model.tokenizer import ChatTokenizer
from tieredkv.tenants import split_namespace

from .auth import require_admin
from .errors import APIError, bad_request
from .generation_inputs import (
    CONTEXT_LENGTH_EXCEEDED,
    chat_prompt_ids,
    check_model,
    completion_prompt_ids,
    resolve_namespace,
)
from .request_body import read_request
from .schemas import PinRequest

log = logging.getLogger(__name__)

NAMESPACE_HEADER = "X-Cache-Namespace"
SavedPin = tuple[str, tuple[int, ...]]  # (namespace, prompt ids)


def pin_prompt_ids(req: PinRequest, tokenizer: ChatTokenizer, max_model_len: int) -> list[int]:
    """The tokens a pin names; 400 unless exactly one of prompt and messages is given, or
    when the prompt leaves no room in the context for the one token that computes it."""
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of prompt and messages", "prompt")
    if req.messages is not None:
        ids = chat_prompt_ids(req, tokenizer, add_generation_prompt=False)
    else:
        ids = completion_prompt_ids(req, tokenizer)
    if len(ids) >= max_model_len:
        message = f"the prompt has {len(ids)} tokens; this model's context is {max_model_len}"
        raise bad_request(message, "prompt", CONTEXT_LENGTH_EXCEEDED)
    return ids


def pin_id(namespace: str, token_ids: tuple[int, ...]) -> str:
    """A pin's name in the admin endpoints: a digest of its namespace and prompt, which shows
    neither."""
    digest = hashlib.sha256(namespace.encode("utf-8") + b"\0" + repr(token_ids).encode())
    return "pin-" + digest.hexdigest()[:24]


def pin_view(entry: dict) -> dict:
    """One pin as an admin sees it: its namespace as the tenant and cache_salt that make it."""
    tenant, salt = split_namespace(entry["namespace"])
    return {
        "object": "cache.pin",
        "id": pin_id(entry["namespace"], entry["token_ids"]),
        "tenant": tenant,
        "cache_salt": salt or None,
        "prompt_tokens": len(entry["token_ids"]),
        "pinned_pages": entry["pinned_pages"],
        "held": entry["held"],
    }


def read_pin_file(path: Path) -> list[PinRequest]:
    """`--pin-file`'s entries; ConfigError naming the line that is not one."""
    entries = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"--pin-file {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            entries.append(PinRequest.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as exc:
            raise ConfigError(f"--pin-file {path} line {number}: {exc}") from None
        if (entries[-1].prompt is None) == (entries[-1].messages is None):
            raise ConfigError(f"--pin-file {path} line {number}: give prompt or messages")
    return entries


@dataclass
class PinHandler:
    engine: EngineClient
    tokenizer: ChatTokenizer
    config: ServerConfig
    model_name: str
    max_model_len: int

    async def _read(self, request: Request, grant: KeyGrant) -> tuple[str, tuple[int, ...]]:
        body = await read_request(
            request, self.config.max_request_bytes, self.config.body_timeout_s, PinRequest
        )
        check_model(body.model, self.model_name)
        namespace = resolve_namespace(
            body.cache_salt, request.headers.get(NAMESPACE_HEADER), grant.tenant
        )
        ids = await run_in_threadpool(pin_prompt_ids, body, self.tokenizer, self.max_model_len)
        return namespace, tuple(ids)

    async def pin(self, request: Request, grant: KeyGrant) -> dict:
        namespace, ids = await self._read(request, grant)
        return {"object": "cache.pin", **await self.engine.pin(namespace, ids)}

    async def unpin(self, request: Request, grant: KeyGrant) -> dict:
        namespace, ids = await self._read(request, grant)
        if not await self.engine.unpin(namespace, ids):
            message = "this prompt is not pinned in this namespace"
            raise APIError(404, message, "invalid_request_error", "prompt", "pin_not_found")
        return {"object": "cache.pin", "unpinned": True}

    async def list_all(self, grant: KeyGrant, tenant: str | None) -> dict:
        """Every namespace's pins (admin only), or one tenant's."""
        require_admin(grant, "/v1/cache/pins")
        listing = await self.engine.list_pins()
        views = [pin_view(entry) for entry in listing.pop("pins")]
        if tenant is not None:
            views = [view for view in views if view["tenant"] == tenant]
        return {"object": "list", "data": views, **listing}

    async def remove(self, grant: KeyGrant, wanted_id: str) -> dict:
        """Release any namespace's pin by its id (admin only); 404 when there is none."""
        require_admin(grant, "/v1/cache/pins")
        for entry in (await self.engine.list_pins())["pins"]:
            found = pin_id(entry["namespace"], entry["token_ids"]) == wanted_id
            if found and await self.engine.unpin(entry["namespace"], entry["token_ids"]):
                return {"object": "cache.pin", "id": wanted_id, "unpinned": True}
        raise APIError(404, "no pin has this id", "invalid_request_error", "id", "pin_not_found")

    async def _drop_keyless(self, saved: list[SavedPin]) -> list[SavedPin]:
        """The saved pins whose tenant some key still names; the others are released (their
        tenant's data has no owner left to serve it to) and logged."""
        tenants = {grant.tenant for grant in self.config.grants.values()}
        kept: list[SavedPin] = []
        dropped: Counter[str] = Counter()
        for namespace, ids in saved:
            tenant, _ = split_namespace(namespace)
            if tenant is None or tenant in tenants:
                kept.append((namespace, ids))
            elif await self.engine.unpin(namespace, ids):
                dropped[tenant] += 1
        for tenant, count in sorted(dropped.items()):
            log.warning("dropped %d saved pins of tenant %r: no API key names it", count, tenant)
        return kept

    async def pin_at_start(self, entries: list[PinRequest]) -> None:
        """Pin again what an earlier run pinned (but a tenant's that no key names any more),
        then the pin file's prompts (logged)."""
        wanted = await self._drop_keyless(list(self.engine.pins_to_restore()))
        for entry in entries:
            try:
                namespace = resolve_namespace(entry.cache_salt, None, None)
                ids = pin_prompt_ids(entry, self.tokenizer, self.max_model_len)
            except APIError as exc:
                log.error("a --pin-file entry is refused: %s", exc.message)
                continue
            wanted.append((namespace, tuple(ids)))
        for namespace, ids in wanted:
            try:
                result = await self.engine.pin(namespace, ids)
                log.info("pinned %d tokens at start", result["pinned_tokens"])
            except Exception as exc:  # one bad pin must not stop the others or the server
                log.error("a pin at start failed (%d tokens): %s", len(ids), exc)
