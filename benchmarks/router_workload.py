"""The router benchmark's workload: many tenants, each with a long system prompt of its own,
whose requests (the tenant's system prompt, then a short question) arrive spread over time.

A tenant's prompts share everything but the question, so a replica that holds the tenant's
system prompt serves most of each prompt from its cache; which replica holds which tenant is
what a router has to know. Arrivals are a Poisson process at `rate` requests per second; each
request's tenant is drawn uniformly. Everything comes from one seed.
"""

from __future__ import annotations

import dataclasses
import random

from tieredkv.bench.workload import prose, random_question
from tieredkv.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TenantWorkloadConfig:
    num_tenants: int
    system_words: int  # words of each tenant's system prompt
    num_requests: int
    rate: float  # requests per second, Poisson arrivals
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_tenants", "system_words", "num_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TenantWorkloadConfig.{name} must be >= 1, got "
                                  f"{getattr(self, name)}")  # fmt: skip
        if not self.rate > 0:
            raise ConfigError(f"TenantWorkloadConfig.rate must be > 0, got {self.rate}")


@dataclasses.dataclass(frozen=True)
class TenantRequest:
    index: int
    tenant: int
    arrival_s: float  # seconds after the run starts
    prompt: str


def system_prompts(config: TenantWorkloadConfig, rng: random.Random) -> list[str]:
    """One system prompt per tenant; the tenant's name leads, so prompts differ from token 0."""
    return [
        f"You are the assistant of tenant {tenant}. Answer from this document.\n\n"
        + prose(rng, config.system_words)
        for tenant in range(config.num_tenants)
    ]


def build_requests(config: TenantWorkloadConfig) -> list[TenantRequest]:
    """The workload's requests in order of arrival."""
    rng = random.Random(config.seed)
    systems = system_prompts(config, rng)
    requests = []
    arrival_s = 0.0
    for index in range(config.num_requests):
        tenant = rng.randrange(config.num_tenants)
        question = random_question(rng)
        requests.append(
            TenantRequest(index, tenant, arrival_s, f"{systems[tenant]}\n\nQuestion: {question}")
        )
        arrival_s += rng.expovariate(config.rate)
    return requests
