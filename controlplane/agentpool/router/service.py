"""The router service: configuration (with reload), tokenization, one directory round trip, dispatch.

:class:`RouterService` owns the node table, the engine client, the directory view, the metrics and
the current :class:`Routing` (config + policy + context). The HTTP layer (:mod:`.server`) validates
bodies and headers and calls :meth:`RouterService.prepare` and :meth:`RouterService.dispatcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Sequence

from agentpool.kv import block_hashes
from agentpool.router.auth import ReportAuth
from agentpool.router.config import ConfigError, ConfigFile, RouterConfig
from agentpool.router.directory_view import DirectoryError, DirectoryView, Resolved
from agentpool.router.discovery import Discovery
from agentpool.router.engine_client import EngineClient
from agentpool.router.flow import Dispatcher
from agentpool.router.flow_types import Endpoint, Prepared, Routing
from agentpool.router.metrics import QueueDepthCollector, RouterMetrics
from agentpool.router.nodes import NodeTable
from agentpool.router.policy import RequestView, create_policy
from agentpool.router.policy.contract import serves_prefill
from agentpool.router.prompt_cache import PromptCache
from agentpool.router.tokenizer import (
    BuiltinTokenizer,
    Encoded,
    Message,
    Tokenizer,
    TokenizerError,
    encode_chat,
    encode_completion,
    load_tokenizer,
)
from agentpool.secret_file import BearerAuth
from agentpool.wire.engine import LoadReport, ReportAck

log = logging.getLogger(__name__)

# Prompts longer than this many characters are tokenized in a worker thread, off the event loop.
_THREAD_TOKENIZE_CHARS = 64_000


class RouterService:
    def __init__(
        self,
        config: RouterConfig,
        directory: DirectoryView,
        *,
        report_auth: ReportAuth,
        engine_auth: BearerAuth | None = None,
        metrics: RouterMetrics | None = None,
        config_file: ConfigFile | None = None,
        reload_interval_s: float = 1.0,
    ) -> None:
        self.report_auth = report_auth
        self.metrics = metrics or RouterMetrics()
        self.directory = directory
        self.config_file = config_file
        self.reload_interval_s = reload_interval_s
        self.nodes = NodeTable(config.max_report_age_s, max_down_s=config.max_down_s)
        t = config.timeouts
        # engine_auth: the engine token sent to the engines (their API needs it unless started open)
        authorization = None if engine_auth is None else engine_auth.header
        self.engines = EngineClient(t.connect_s, t.first_event_s, t.between_events_s, authorization)
        self.tokenizer: Tokenizer = load_tokenizer(config.tokenizer)
        self.prompts = prompt_cache(self.tokenizer, config.page_size)
        self.routing = Routing(config, create_policy(config.policy, config.knobs), config.policy_context())
        self.nodes.configure(config.nodes, config.node_model)
        self.metrics.registry.register(QueueDepthCollector(lambda: self.nodes.snapshot(time.monotonic())))
        self.router_id = secrets.token_hex(8)  # this process's dispatch numbering (wire.engine)
        # request ids: this process's random prefix and a counter (unique without a urandom call each)
        self._id_prefix = secrets.token_hex(8)
        self._id_seq = itertools.count(1)
        self.report_ack = ReportAck(router_id=self.router_id).model_dump_json().encode()  # the report answer
        self.dispatcher = Dispatcher(
            self.nodes, self.engines, directory, self.metrics, self.routing, router_id=self.router_id
        )
        self._show_generation(config)
        self._reload_task: asyncio.Task[None] | None = None
        self.discovery = Discovery(self.nodes, lambda: self.routing.config, self.metrics)

    @property
    def config(self) -> RouterConfig:
        return self.routing.config

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.engines.start()
        if self.config_file is not None and self._reload_task is None:
            self._reload_task = asyncio.create_task(self._reload_loop(), name="router-config-reload")
        self.discovery.start()

    async def close(self) -> None:
        await self.discovery.stop()
        if self._reload_task is not None:
            self._reload_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reload_task
            self._reload_task = None
        await self.engines.close()
        await self.directory.close()

    # -- configuration -----------------------------------------------------------------------
    def apply_config(self, config: RouterConfig, tokenizer: Tokenizer | None = None) -> list[str]:
        """Switch to ``config`` without a restart; returns the nodes whose role changed (draining).

        ``tokenizer``: ``config``'s tokenizer when the caller already loaded it (off the event loop);
        otherwise a changed tokenizer is loaded here.
        """
        old = self.routing
        policy = old.policy
        if config.policy != old.config.policy or config.knobs != old.config.knobs:
            policy = create_policy(config.policy, config.knobs)
        if tokenizer is not None:
            self.tokenizer = tokenizer
        elif config.tokenizer != old.config.tokenizer:
            self.tokenizer = load_tokenizer(config.tokenizer)
        prompts = self.prompts
        if (
            prompts is None
            or prompts.tokenizer is not self.tokenizer
            or prompts.page_size != config.page_size
        ):
            self.prompts = prompt_cache(self.tokenizer, config.page_size)
        self.routing = Routing(config, policy, config.policy_context())
        self.dispatcher.routing = self.routing
        self.nodes.max_report_age_s = config.max_report_age_s
        self.nodes.max_down_s = config.max_down_s
        t = config.timeouts
        self.engines.connect_s, self.engines.first_event_s = t.connect_s, t.first_event_s
        self.engines.between_events_s = t.between_events_s
        switched = self.nodes.configure(config.nodes, config.node_model)
        self._show_generation(config)
        for node in switched:
            log.info("node %s changed role: draining its old phase", node)
        return switched

    def _show_generation(self, config: RouterConfig) -> None:
        """The pool generation this config is for, in the work batches (for the planner) and on
        ``/metrics`` (-1: the config names none)."""
        self.dispatcher.work_log.config_generation = config.generation
        self.metrics.config_generation.set(-1 if config.generation is None else config.generation)

    def _read_changed_config(self) -> tuple[RouterConfig, Tokenizer | None] | None:
        """The config file's new contents (and its tokenizer if that changed), or None if unchanged.

        Blocking file I/O: the reload loop runs this in a worker thread.
        """
        if self.config_file is None or not self.config_file.changed():
            return None
        config = self.config_file.load()
        changed = config.tokenizer != self.routing.config.tokenizer
        return config, load_tokenizer(config.tokenizer) if changed else None

    async def reload_if_changed(self) -> bool:
        """Apply the config file if it changed; a bad file keeps the previous config (and says so)."""
        try:
            read = await asyncio.to_thread(self._read_changed_config)
        except (ConfigError, TokenizerError, OSError) as e:
            self.metrics.config_reloads.labels("error").inc()
            log.error("router config reload failed, keeping the previous one: %s", e)
            return False
        if read is None:
            return False
        self.apply_config(*read)
        self.metrics.config_reloads.labels("ok").inc()
        return True

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reload_interval_s)
            await self.reload_if_changed()

    # -- reports -----------------------------------------------------------------------------
    def apply_report(self, report: LoadReport) -> bool:
        """Apply an engine's report; ``False`` when the node is unknown and could not register."""
        if report.node_id not in self.nodes and not self.discovery.register(report):
            return False
        self.nodes.apply_report(report, time.monotonic())
        capacity = report.kv_room_tokens + report.kv_used_tokens  # 0: the engine did not say
        self.dispatcher.work_log.served_role(report.node_id, report.role.value, capacity or None)
        if report.iterations:
            self.dispatcher.work_log.iterations(report.node_id, report.iterations)
        return True

    async def ready(self) -> tuple[bool, dict[str, str]]:
        """Ready when a node can take a prefill and the directory answers healthy (with the reasons)."""
        snapshot = self.nodes.snapshot(time.monotonic())
        nodes_ok = any(serves_prefill(n) and n.accepting and not n.draining for n in snapshot)
        try:
            async with asyncio.timeout(self.config.timeouts.directory_s):
                directory = await self.directory.health()
        except (DirectoryError, TimeoutError) as e:
            directory = f"unavailable: {e or 'timed out'}"
        checks = {"nodes": "ok" if nodes_ok else "no node can take a prefill", "directory": directory}
        return nodes_ok and directory == "ok", checks

    # -- requests ----------------------------------------------------------------------------
    async def encode_chat(self, messages: Sequence[Message]) -> Encoded:
        """``messages`` as validated (null fields included: the built-in tokenizer renders a null
        field as an absent one; a chat template gets them without their null fields, what
        ``model_dump(exclude_none=True)`` gives for these flat models)."""
        prompts = self.prompts
        if prompts is not None:  # the messages seen before come from the memo; the rest maybe in a thread
            found = prompts.lookup(messages)
            if found.missing_chars > _THREAD_TOKENIZE_CHARS:
                return prompts.finish(found, await asyncio.to_thread(prompts.tokenize, found))
            return prompts.finish(found, prompts.tokenize(found))
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        if chars > _THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(encode_chat, self.tokenizer, messages)
        return encode_chat(self.tokenizer, messages)

    async def encode_completion(self, prompt: str) -> Encoded:
        if len(prompt) > _THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(encode_completion, self.tokenizer, prompt)
        return encode_completion(self.tokenizer, prompt)

    async def resolve(self, encoded: Encoded, branch: str | None, parent: str | None) -> Resolved:
        """One directory round trip; on failure route without prefix knowledge (counted, logged)."""
        page = self.config.page_size
        hashes = encoded.hashes
        if hashes is None or encoded.page_size != page:
            hashes = block_hashes(encoded.token_ids, page)
        try:
            # the view bounds its own wait (a timer on the reply), not asyncio.timeout: that costs
            # several times the CPU, on every request
            return await self.directory.resolve(hashes, branch, parent, self.config.timeouts.directory_s)
        except DirectoryError as e:
            self.metrics.directory_errors.labels("resolve").inc()
            log.warning("directory resolve failed, routing without prefix information: %s", e)
            return Resolved({})

    async def prepare(
        self,
        endpoint: Endpoint,
        body: dict[str, object],
        encoded: Encoded,
        output_limit: int | None,
        branch: str | None,
        parent: str | None,
    ) -> Prepared:
        resolved = await self.resolve(encoded, branch, parent)
        prompt = len(encoded.token_ids)
        kind = "chatcmpl" if endpoint == "chat" else "cmpl"
        view = RequestView(
            request_id=f"{kind}-{self._id_prefix}{next(self._id_seq):08x}",
            prompt_tokens=prompt,
            turn=encoded.turn,
            new_turn_tokens=min(prompt, encoded.new_turn_tokens),
            branch_id=branch,
            local_prefix={n: p for n, p in resolved.prefixes.items() if p.total <= prompt},
            cluster_prefix=min(prompt, resolved.cluster_prefix),
            expected_output_tokens=output_limit or self.config.default_output_tokens,
        )
        return Prepared(
            view.request_id,
            endpoint,
            body,
            encoded.token_ids,
            view,
            branch,
            hashes=resolved.hashes,
            token_ids_json=encoded.token_ids_json,
        )

    async def end_branch(self, branch: str) -> bool:
        try:
            async with asyncio.timeout(self.config.timeouts.directory_s):
                return await self.directory.end_branch(branch)
        except (DirectoryError, TimeoutError):
            self.metrics.directory_errors.labels("end_branch").inc()
            raise


def prompt_cache(tokenizer: Tokenizer, page_size: int) -> PromptCache | None:
    """The per-message memo of chat prompts, for the tokenizer whose prompts it can split (the
    built-in one: :mod:`.prompt_cache`); ``None`` for the others, which tokenize whole prompts."""
    return PromptCache(tokenizer, page_size) if isinstance(tokenizer, BuiltinTokenizer) else None
