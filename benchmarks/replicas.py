"""`tieredkv bench multiturn`'s workload through SGLang's router over N tieredkv replicas, for
every configuration of remote tier (on: a fresh `redis-server` the replicas share; off) x router
policy, in one run:

    .venv/bin/python -m benchmarks.replicas --replicas N [--remote on,off]
        [--router-policies cache_aware,round_robin] [--restart-at R] [bench multiturn's flags]

Each configuration starts from nothing: a fresh Redis (remote on), N fresh replicas with the
managed runs' flags (each its own disk store) and the router. The workload goes through the
router; before the turn of user `users // 2` in round `--restart-at`, replica 0 is stopped
(SIGTERM); once the router routes around it the run goes on, its turns landing on the other
replicas, while replica 0 starts again on its port with its flags and its disk store (a warm
restart). The next round starts once the router holds it healthy again and, with the remote
tier, once the replicas' writes to Redis have settled. The disk stores are dropped from the
page cache before every round, as in the single-server runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.redis_server import RedisServer, require_redis_server
from benchmarks.remote_limit import (
    RemotePromotions,
    redis_get_throughput,
    remote_writes_settled,
)
from benchmarks.replica_report import analyze, replicas_tables
from benchmarks.replica_set import ReplicaSet
from benchmarks.router import ROUTER_POLICIES, require_router
from tieredkv.bench import multiturn
from tieredkv.bench.client import direct_io_of
from tieredkv.bench.disk_check import drop_page_cache
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.suite import ServerSpec, SuiteConfig
from tieredkv.bench.workload import Workload
from tieredkv.bench.workload_run import run_workload
from tieredkv.errors import ConfigError

REMOTE_WORDS = {"on": True, "off": False}
DEFAULT_RESTART_ROUND = 2  # when there are rounds after it to see what the restart cost


@dataclasses.dataclass(frozen=True)
class ReplicaConfig:
    """One configuration: the remote tier on or off, and the router's policy."""

    remote: bool
    policy: str

    @property
    def label(self) -> str:
        return f"{'remote' if self.remote else 'local'} + {self.policy}"

    @property
    def tag(self) -> str:  # for file names
        return f"{'remote' if self.remote else 'local'}-{self.policy}"


@dataclasses.dataclass(frozen=True)
class ReplicasConfig:
    """The replicas run: `remote` × `policies` configurations of `num_replicas` replicas;
    replica 0 restarted before the turn of user `num_users // 2` in round `restart_at`
    (0: never)."""

    num_replicas: int
    remote: tuple[bool, ...]
    policies: tuple[str, ...]
    restart_at: int
    num_rounds: int
    num_users: int

    def __post_init__(self) -> None:
        if self.num_replicas < 2:
            raise ConfigError(f"--replicas must be >= 2, got {self.num_replicas}")
        if not self.remote or len(set(self.remote)) != len(self.remote):
            raise ConfigError(f"--remote: on and/or off, each once, got {self.remote}")
        unknown = [p for p in self.policies if p not in ROUTER_POLICIES]
        if not self.policies or unknown or len(set(self.policies)) != len(self.policies):
            known = ", ".join(ROUTER_POLICIES)
            raise ConfigError(f"--router-policies: each once, of {known}; got {self.policies}")
        if not 0 <= self.restart_at < self.num_rounds:
            raise ConfigError(
                f"--restart-at must be a round, 1..{self.num_rounds - 1} (or 0: none), "
                f"got {self.restart_at} with --rounds {self.num_rounds}"
            )

    @property
    def configurations(self) -> list[ReplicaConfig]:
        return [ReplicaConfig(remote, policy) for remote in self.remote for policy in self.policies]

    @property
    def round_robin_sticky(self) -> bool:
        """Whether `round_robin` keeps every conversation on one replica: with one request in
        flight, user u's turn k is request u + k * users, so replica (u + k * users) % N is
        u's own whenever N divides users."""
        return "round_robin" in self.policies and self.num_users % self.num_replicas == 0

    @property
    def restart_turn(self) -> tuple[int, int] | None:
        """(round, user) of the turn the restart comes before; None: no restart."""
        return (self.restart_at, self.num_users // 2) if self.restart_at else None


def add_replica_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replicas behind SGLang's router (managed runs)")
    add = group.add_argument
    add("--replicas", type=int, required=True, help="N >= 2 tieredkv replicas behind the router")
    add("--remote", help="remote tier per configuration: on,off (default both; on: a fresh "
        "redis-server the replicas share)")  # fmt: skip
    add("--router-policies", help="router policy per configuration (default "
        "cache_aware,round_robin)")  # fmt: skip
    add("--restart-at", type=int, help="restart replica 0 before the turn of user users//2 in "
        "this round (default 2 when --rounds >= 3; 0: none)")  # fmt: skip


def _words(text: str) -> list[str]:
    return [word.strip() for word in text.split(",") if word.strip()]


def replicas_config(args: argparse.Namespace) -> ReplicasConfig:
    """The replicas run the flags ask for; ConfigError names a bad or conflicting flag."""
    if args.base_url:
        raise ConfigError("--replicas starts its own servers: no --base-url")
    remote_words = _words(args.remote or "on,off")
    if unknown := [w for w in remote_words if w not in REMOTE_WORDS]:
        raise ConfigError(f"--remote: on and/or off, got {unknown}")
    restart_at = args.restart_at
    if restart_at is None:
        restart_at = DEFAULT_RESTART_ROUND if args.rounds > DEFAULT_RESTART_ROUND else 0
    return ReplicasConfig(
        num_replicas=args.replicas,
        remote=tuple(REMOTE_WORDS[w] for w in remote_words),
        policies=tuple(_words(args.router_policies or "cache_aware,round_robin")),
        restart_at=restart_at,
        num_rounds=args.rounds,
        num_users=args.users,
    )


def run_replica_configs(
    args: argparse.Namespace,
    spec: ServerSpec,
    suite: SuiteConfig,
    workload: Workload,
    arrival: ArrivalConfig,
    report: dict,
) -> list[dict]:
    """Every configuration the flags ask for, in order; each run joins `report` as it ends."""
    plan = replicas_config(args)
    if plan.round_robin_sticky and args.rate is None:
        print(f"note: with {args.users} users on {args.replicas} replicas, round_robin keeps "
              "each conversation on one replica (until the restart); a user count that "
              f"{args.replicas} does not divide sends turns to the other replicas",
              file=sys.stderr)  # fmt: skip
    require_router()
    if any(plan.remote):
        require_redis_server()
    runs = []
    for config in plan.configurations:
        runs.append(run_configuration(config, plan, spec, suite, workload, arrival))
        report["runs"].append(runs[-1])
    return runs


def add_analysis(report: dict, runs: list[dict], baseline: dict | None) -> None:
    report["replicas"] = analyze(runs, baseline)
    title = "Replicas behind SGLang's router (reuse rounds)"
    report["sections"][title] = replicas_tables(runs, report["replicas"])


def main(argv: list[str]) -> int:
    parser = multiturn.build_parser()
    parser.prog = "python -m benchmarks.replicas"
    add_replica_options(parser)
    try:
        replicas_config(multiturn.resolve(parser.parse_args(argv)))
    except ConfigError as exc:
        parser.error(str(exc))
    return multiturn.main(argv, parser, run_replica_configs, add_analysis)


def run_configuration(
    config: ReplicaConfig,
    plan: ReplicasConfig,
    spec: ServerSpec,
    suite: SuiteConfig,
    workload: Workload,
    arrival: ArrivalConfig,
) -> dict:
    log_dir = suite.work_dir / config.tag
    restarts: list[dict] = []
    dropped: list[int] = []
    remote_settled: list[bool] = []
    with (
        tempfile.TemporaryDirectory(prefix="kv-", dir=suite.work_dir) as stores_text,
        contextlib.ExitStack() as running,
    ):
        disk_dirs = [Path(stores_text) / f"replica{i}" for i in range(plan.num_replicas)]
        remote_args = []
        if config.remote:
            redis = running.enter_context(RedisServer(log_dir / "redis"))
            remote_args = redis.serve_flags()
        args = [[*spec.args(suite.common_args, d), *remote_args] for d in disk_dirs]
        for disk_dir in disk_dirs:
            disk_dir.mkdir()
        replicas = running.enter_context(ReplicaSet(args, log_dir, config.policy, suite.threads))
        promotions = RemotePromotions(replicas.urls) if config.remote else None

        def finish_restart() -> None:
            if (restart := replicas.finish_restart()) is not None:
                round_index, user = plan.restart_turn  # type: ignore[misc]
                restarts.append({"round": round_index, "before_user": user, **restart})

        def before_round(_round: int) -> None:
            finish_restart()  # a round starts with every replica back
            if config.remote:  # ... and with the previous round's pages in Redis
                remote_settled.append(remote_writes_settled(replicas.urls))
            if spec.disk_cache != "0":
                dropped.append(sum(drop_page_cache(d) for d in disk_dirs))

        def before_turn(round_index: int, user: int) -> None:
            if (round_index, user) == plan.restart_turn:
                if promotions is not None:
                    promotions.end(0)  # its counters die with it
                replicas.begin_restart(0)  # the round goes on while replica 0 is away

        result = run_workload(
            replicas.base_url, workload, arrival, before_round, config.label, None,
            suite.extra_body, before_turn=before_turn,
        )  # fmt: skip
        finish_restart()
        if promotions is not None:  # Redis still runs: its own limit, in the same run
            promotions.end_all()
            result["remote_promotion"] = promotions.figures()
            result["redis_get"] = redis_get_throughput(redis.url, result["remote_promotion"])
        if result["direct_io"] is None:  # the router answers no /health of tieredkv's: a replica's
            health = httpx.get(replicas.servers[0].base_url + "/health", timeout=30).json()
            result["direct_io"] = direct_io_of(health)
    result["server"] = "tieredkv"
    result["replicas"] = {"count": plan.num_replicas, "remote": config.remote,
                          "router_policy": config.policy, "restarts": restarts,
                          "restart_turn": plan.restart_turn}  # fmt: skip
    result["spec"] = dataclasses.asdict(spec)
    result["server_args"] = args[0]
    result["page_cache_dropped_bytes"] = dropped
    result["remote_writes_settled"] = remote_settled
    result["log"] = str(log_dir)
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
