"""What the target is: /version, served model, /metrics, and its kind (sim, vLLM, managed, other).

Probed once before the run, over the same base URL. The simulated engine announces itself in its
``/version`` body (``"engine": "loadgen-sim"``) or an ``x-loadgen-sim`` / ``server`` header; vLLM
answers ``/version`` with ``{"version": ...}`` and its ``/v1/models`` entries are ``owned_by: vllm``.

What the target says is recorded (manifest, analysis, handoff bundle) only after ``safe_version``: values
under credential-like keys and credential-like strings (the configured key, bearer/basic tokens, API-key
and JWT shapes) become ``REDACTED``, and the body is capped at ``VERSION_MAX_BYTES``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from loadgen.driver.bounded import PROBE_MAX_BYTES, PROBE_TIMEOUT_S, bounded_get
from loadgen.driver.metrics_scrape import parse_prometheus_text
from loadgen.util.errors import TargetError
from loadgen.util.redact import is_credential_name, redact, redact_url, without_secrets

__all__ = [
    "MANAGED_HOSTS",
    "VERSION_MAX_BYTES",
    "TargetInfo",
    "is_credential_name",
    "is_simulated",
    "probe_target",
    "safe_version",
]

#: Most bytes of a target's /version body kept in the record (JSON-encoded, after redaction).
VERSION_MAX_BYTES = 16 * 1024
_VERSION_MAX_DEPTH = 8
#: String shapes of credentials: API keys (sk-..., key-... with digits), JWTs, Basic tokens.
_SECRET_TEXT = re.compile(
    r"(?i)\b(?:sk|pk|rk|key|api|token)[-_](?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{12,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]+)?"
    r"|(?<=basic )[A-Za-z0-9+/=]{8,}"
)

#: Hosts of managed APIs (no /metrics, quotas, Retry-After).
MANAGED_HOSTS = (
    "api.openai.com",
    "openai.azure.com",
    "api.together.xyz",
    "api.fireworks.ai",
    "api.groq.com",
    "api.mistral.ai",
    "api.deepseek.com",
    "openrouter.ai",
    "generativelanguage.googleapis.com",
)


@dataclass
class TargetInfo:
    kind: str  # sim | vllm | managed | openai-compatible | unknown
    base_url: str  # redacted, safe to record
    model: str | None
    version: Any  # GET /version body (JSON or text), or None
    models: list[str] = field(default_factory=list)
    has_metrics: bool = False
    has_tokenize: bool | None = None
    engine: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def manifest(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "base_url": self.base_url,
            "model": self.model,
            "version": self.version,
            "engine": self.engine,
            "served_models": self.models,
        }


def _scrub(value: Any, secrets: tuple[str, ...], depth: int) -> Any:
    if isinstance(value, str):
        # redacted whole, then cut (redact cuts at 500 characters): a secret across the cut is never kept in part
        text = redact(_SECRET_TEXT.sub("REDACTED", without_secrets(value, secrets)))
        return text if len(value) <= 500 else text + " [truncated]"
    if depth >= _VERSION_MAX_DEPTH:
        return "[nested too deeply]" if isinstance(value, (dict, list)) else value
    if isinstance(value, dict):
        return {
            _scrub(str(k), secrets, depth): "REDACTED" if is_credential_name(str(k)) else _scrub(v, secrets, depth + 1)
            for k, v in list(value.items())[:256]
        }
    if isinstance(value, list):
        return [_scrub(v, secrets, depth + 1) for v in value[:256]]
    return value


def safe_version(body: Any, secrets: tuple[str, ...] = ()) -> Any:
    """A target's /version body fit to record: credentials redacted, at most VERSION_MAX_BYTES."""
    clean = _scrub(body, secrets, 0)
    encoded = json.dumps(clean, default=str)
    if len(encoded) <= VERSION_MAX_BYTES:
        return clean
    return {"truncated": True, "bytes": len(encoded), "head": encoded[: VERSION_MAX_BYTES // 4]}


def _model_entries(body: Any, safe_url: str) -> tuple[list[str], set[str]]:
    """(ids, owners) of a ``/v1/models`` body; a ``data`` that is not a list is one line, not a traceback."""
    data = body.get("data", []) if isinstance(body, dict) else None
    if data is None and isinstance(body, dict) and "data" not in body:
        data = []
    if not isinstance(data, list):
        shown = json.dumps(data)[:60] if isinstance(body, dict) else type(body).__name__
        raise TargetError(
            f"target {safe_url}: GET /v1/models: data = {shown}: expected a list of models (OpenAI's {{'data': [...]}})"
        )
    models: list[str] = []
    owners: set[str] = set()
    for entry in data:
        if isinstance(entry, dict) and entry.get("id") and isinstance(entry["id"], (str, int)):
            models.append(str(entry["id"]))
            owners.add(str(entry.get("owned_by", "")))
    return models, owners


async def _probe(client: httpx.AsyncClient, path: str, timeout_s: float, notes: list[str]) -> httpx.Response | None:
    """A bounded GET; a probe that failed, timed out or was cut is noted (``notes``)."""
    got = await bounded_get(client, path, timeout_s=timeout_s)
    if got.failure is not None:
        notes.append(f"GET {path}: {got.failure}")
    elif got.truncated:
        notes.append(f"GET {path}: answer longer than {PROBE_MAX_BYTES} bytes: not read further, not used")
        return None
    return got.response


def is_simulated(response: httpx.Response | None, body: Any) -> bool:
    """Whether a ``/version`` answer (response, parsed body) comes from loadgen's simulated engine."""
    if response is None:
        return False
    if "x-loadgen-sim" in response.headers or "loadgen-sim" in response.headers.get("server", ""):
        return True
    return isinstance(body, dict) and (
        "loadgen-sim" in str(body.get("engine", "")) or "loadgen-sim" in str(body.get("name", ""))
    )


async def probe_target(
    client: httpx.AsyncClient,
    base_url: str,
    model: str | None,
    *,
    secrets: tuple[str, ...] = (),
    check_metrics: bool = True,
    check_model: bool = True,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> TargetInfo:
    """Probe ``base_url`` (the client's base); raise TargetError when it cannot serve a run at all.

    ``check_model``: when ``/v1/models`` lists models and ``model`` is not among them, fail before the
    run with one line naming the models it does serve (a gateway that lists other names than it
    accepts needs ``check_model=False``; one that lists none is not checked). Each probe ends within
    ``timeout_s`` and reads at most ``PROBE_MAX_BYTES`` (``bounded_get``); one that did not is a note.
    """
    safe_url = redact_url(base_url)
    notes: list[str] = []
    version_resp = await _probe(client, "/version", timeout_s, notes)
    version: Any = None
    if version_resp is not None and version_resp.status_code == 200:
        try:
            version = version_resp.json()
        except (ValueError, RecursionError):
            version = version_resp.text.strip()[:500] or None
    models_resp = await _probe(client, "/v1/models", timeout_s, notes)
    if version_resp is None and models_resp is None:
        raise TargetError(
            redact(
                f"target {safe_url}: not reachable (GET /version and /v1/models failed: {'; '.join(notes)}): "
                "expected an OpenAI-compatible server",
                secrets,
            )
        )
    if check_model and _not_found(version_resp) and _not_found(models_resp):
        raise TargetError(
            f"target {safe_url}: GET /version and /v1/models answered HTTP 404: expected an OpenAI-compatible API "
            "under this URL (is its path right? a provider's base URL may carry a prefix, as https://HOST/openai/v1; "
            "--no-model-check to send the requests anyway)"
        )
    models, owners, listing = _served_models(models_resp, safe_url)
    model = _resolve_model(model, models, check_model, safe_url, secrets, listing)
    recorded_models = [safe_version(m, secrets) for m in models[:64]]
    info = TargetInfo(
        kind="unknown", base_url=safe_url, model=model, version=safe_version(version, secrets), models=recorded_models
    )
    _classify(info, version_resp, version, (urlsplit(base_url).hostname or "").lower(), owners, models)
    if check_metrics and info.kind != "managed":
        metrics = await _probe(client, "/metrics", timeout_s, notes)
        if metrics is not None and metrics.status_code == 200:
            info.has_metrics = next(iter(parse_prometheus_text(metrics.text[:65536])), None) is not None
    info.notes = [redact(note, secrets) for note in notes]
    if info.kind == "unknown":
        info.notes.append(redact(f"target kind unknown (version={info.version!r}, models={recorded_models})", secrets))
    return info


def _not_found(resp: httpx.Response | None) -> bool:
    return resp is not None and resp.status_code == 404


def _served_models(models_resp: httpx.Response | None, safe_url: str) -> tuple[list[str], set[str], str]:
    """(the model ids ``/v1/models`` lists, their owners, what it answered when it lists none); a 401/403 there
    is a missing or wrong key."""
    models: list[str] = []
    owners: set[str] = set()
    listing = "gave no answer" if models_resp is None else f"answered HTTP {models_resp.status_code}"
    if models_resp is not None and models_resp.status_code == 200:
        try:
            body = models_resp.json()
            listing = "lists none"
        except (ValueError, RecursionError):
            body = {}
            kind = models_resp.headers.get("content-type", "no content type").split(";")[0][:60]
            listing = f"answered HTTP 200 that is not JSON ({kind})"
        models, owners = _model_entries(body, safe_url)
    elif models_resp is not None and models_resp.status_code in (401, 403):
        raise TargetError(
            f"target {safe_url}: GET /v1/models answered HTTP {models_resp.status_code}: expected a valid API key (--api-key-env)"
        )
    return models, owners, listing


def _resolve_model(
    model: str | None,
    models: list[str],
    check_model: bool,
    safe_url: str,
    secrets: tuple[str, ...],
    listing: str = "lists none",
) -> str:
    """The model to request: ``model``, checked against the served ones (when listed and asked to), else the
    first one served (``listing``: what ``/v1/models`` answered, said when it lists none)."""
    if model is None:
        if not models:
            raise TargetError(f"target {safe_url}: no model given and GET /v1/models {listing}: expected --model NAME")
        if without_secrets(models[0], secrets) != models[0]:  # it would be sent and recorded as the run's model
            raise TargetError(
                redact(
                    f"target {safe_url}: no model given and the first model GET /v1/models lists "
                    f"({models[0][:80]!r}) holds a secret of the run (its key, a header or URL value): "
                    "expected --model NAME",
                    secrets,
                )
            )
        return models[0]
    if check_model and models and model not in models:
        shown = ", ".join(repr(m) for m in models[:10]) + (f" and {len(models) - 10} more" if len(models) > 10 else "")
        raise TargetError(
            redact(
                f"model {model!r} (--model, else the scenario's): not served by {safe_url}: expected one of {shown} "
                "(--no-model-check for a gateway whose /v1/models does not list what it accepts)",
                secrets,
            )
        )
    return model


def _sim_engine_config(version: dict[str, Any]) -> dict[str, Any] | None:
    """The simulated engine's own manifest (its name, sha256 and settings) from its /version, already redacted and
    capped by ``safe_version``; just its name when that is all the body carries."""
    config = version.get("config")
    if isinstance(config, dict) and config.get("name"):
        return config
    return {"name": version.get("engine_config")} if version.get("engine_config") else None


def _classify(
    info: TargetInfo, version_resp: httpx.Response | None, version: Any, host: str, owners: set[str], models: list[str]
) -> None:
    """``info.kind`` (and ``info.engine`` when known): sim, managed (by host), vllm, openai-compatible or unknown."""
    clean = info.version if isinstance(info.version, dict) else {}
    if is_simulated(version_resp, version):
        info.kind = "sim"
        info.engine = {
            "name": "loadgen-sim",
            "version": clean.get("version"),
            "config": _sim_engine_config(clean),
        }
    elif any(host == h or host.endswith("." + h) for h in MANAGED_HOSTS):
        info.kind = "managed"
    elif "vllm" in owners or (isinstance(version, dict) and set(version) == {"version"}):
        info.kind = "vllm"
        info.engine = {"name": "vllm", "version": clean.get("version"), "config": None}
    elif models:
        info.kind = "openai-compatible"
