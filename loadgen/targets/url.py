"""Any OpenAI-compatible URL loadgen did not launch: warm = the warm-up set; cold = an emptied prefix cache.

loadgen cannot restart a target it did not launch, so "cold" here means what vLLM offers without a
restart: ``POST /reset_prefix_cache`` (served by vLLM with ``VLLM_SERVER_DEV_MODE=1``, and by the
simulated engine) empties the KV prefix cache. The manifest's ``warm_state`` then says
``method = "prefix_cache_reset"`` and that the process stayed up (weights loaded, kernels compiled).
Where the endpoint refuses (404, 405, an error) the cold state is "not achievable", saying why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx

from loadgen.driver.bounded import Bounded, bounded_request
from loadgen.util.errors import TargetError

from ..driver.options import RunSettings
from ..util.redact import redact_url
from .base import RunRequest, StateResult, Target
from .identity import UrlIdentity
from .replay import run_driver, warm_up

__all__ = ["RESET_TIMEOUT_S", "UrlTarget"]

#: Longest the cold reset (``POST /reset_prefix_cache``) may take, connect to status line and headers.
RESET_TIMEOUT_S = 30.0


async def _post_reset(root: str, query: str, headers: dict[str, str]) -> Bounded:
    """The reset, within RESET_TIMEOUT_S; its body is not read (the status says whether the cache was emptied:
    a body that trickles on forever held the plan before)."""
    async with httpx.AsyncClient(
        base_url=root, params=httpx.QueryParams(query), headers=headers, trust_env=False
    ) as client:
        return await bounded_request(client, "POST", "/reset_prefix_cache", timeout_s=RESET_TIMEOUT_S, max_bytes=0)


class UrlTarget(Target):
    """Any OpenAI-compatible endpoint the tool did not launch (cold runs are not achievable)."""

    kind = "url"

    def __init__(self, url: str, model: str | None = None, api_key_env: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise TargetError(f"--target {redact_url(url)!r}: expected an http:// or https:// URL")
        self._url = url.rstrip("/")
        self._model = model
        self.api_key_env = api_key_env

    @property
    def url(self) -> str | None:
        return self._url

    @property
    def model(self) -> str | None:
        return self._model

    def describe(self) -> dict[str, Any]:
        return UrlIdentity(
            kind="url", base_url=redact_url(self._url), model=self._model, launched_by_loadgen=False
        ).document()

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        if state == "cold":
            return self.reset_prefix_cache()
        return StateResult(
            "warm", True, warm_up(self._url, self._model, warmup_trace, work_dir, scenario_path, self.api_key_env)
        )

    def reset_prefix_cache(self) -> StateResult:
        """Cold = ``POST /reset_prefix_cache`` answered 2xx; otherwise not achievable, with the answer."""
        parts = urlsplit(self._url)  # the target's query string goes with it (a gateway may take its key there)
        root = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/").removesuffix("/v1"), "", ""))
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        got = anyio.run(_post_reset, root, parts.query, headers)
        if got.response is None:
            answer = f"failed ({(got.failure or '').split(':', 1)[0]})"
        elif got.response.is_success:
            action = (
                f"POST /reset_prefix_cache answered HTTP {got.response.status_code}: prefix cache emptied; the "
                "process stayed up (loadgen did not launch it: weights, compiled kernels and allocations are warm)"
            )
            return StateResult("cold", True, [action], method="prefix_cache_reset")
        else:
            answer = f"answered HTTP {got.response.status_code}"
        return StateResult(
            "cold",
            False,
            [],
            f"not achievable: loadgen did not launch this target, so it cannot restart "
            f"it, and POST /reset_prefix_cache {answer} (vLLM serves it with "
            "VLLM_SERVER_DEV_MODE=1); launch it with --sim or the vLLM path for cold cells",
        )

    def run(self, request: RunRequest) -> Path:
        return run_driver(
            request.trace_path,
            self._url,
            request.out_dir,
            model=self._model,
            scenario_path=request.scenario_path,
            state=request.state,
            extra_manifest=request.extra_manifest,
            settings=RunSettings(api_key_env=self.api_key_env).over(self.driver_options(request)),
        )
