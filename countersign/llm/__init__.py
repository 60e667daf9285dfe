"""Model adapters, chosen by the model id: `scripted`, `openai:<model>` or `anthropic:<model>`.

Guarantee: `check_model` refuses, with a message that says what to do, any id whose provider is
unknown, whose SDK extra is not installed, or whose API key is not configured, so a bad `MODEL`
refuses the start (`startup.check`: a SettingsError naming it) and a bad `AgentTask.model` is a 400
before any turn runs.
"""

from __future__ import annotations

import functools
import importlib
import re

from countersign.contract import Plan, ScriptStep
from countersign.extras import install_hint
from countersign.llm.base import ChatModel
from countersign.llm.scripted import ScriptedModel
from countersign.settings import get_settings

KNOWN = "scripted, openai:<model> (any OpenAI-compatible endpoint) or anthropic:<model>"
_MODEL_ID = re.compile(r"^(openai|anthropic):([A-Za-z0-9][A-Za-z0-9._:/@+-]{0,99})\Z")
_SDK = {"openai": "openai", "anthropic": "anthropic"}


class ModelUnavailable(ValueError):
    pass


def parse_model_id(model_id: str) -> tuple[str, str]:
    """(provider, model name); `scripted` is ("scripted", "")."""
    if model_id == "scripted":
        return "scripted", ""
    match = _MODEL_ID.match(model_id)
    if match is None:
        raise ModelUnavailable(f"model {model_id!r} is not available; use {KNOWN}")
    return match.group(1), match.group(2)


def check_model(model_id: str) -> None:
    provider, _ = parse_model_id(model_id)
    if provider == "scripted":
        return
    try:
        importlib.import_module(_SDK[provider])
    except ImportError:
        raise ModelUnavailable(
            f"model {model_id!r} needs the {_SDK[provider]} SDK, which is not installed: {install_hint(provider)}"
        ) from None
    _api_key(provider)


def load_model(model_id: str, script: list[ScriptStep] | None, plan: Plan | None = None) -> ChatModel:
    """The model; `plan` is the scripted model's plan, if it is asked for one (see countersign.llm.planning)."""
    if model_id == "scripted":
        return ScriptedModel(script, plan)
    check_model(model_id)
    return _provider_model(model_id)


@functools.cache
def _provider_model(model_id: str) -> ChatModel:
    """One client per model id and process: the SDK clients pool connections and are thread-safe."""
    provider, name = parse_model_id(model_id)
    settings = get_settings()
    if provider == "openai":
        from countersign.llm.openai_chat import OpenAIChat

        return OpenAIChat(
            model_id,
            name,
            api_key=_api_key(provider),
            base_url=settings.openai_base_url,
            timeout=settings.model_timeout_seconds,
        )
    from countersign.llm.anthropic_chat import AnthropicChat

    return AnthropicChat(
        model_id,
        name,
        api_key=_api_key(provider),
        base_url=settings.anthropic_base_url,
        timeout=settings.model_timeout_seconds,
        max_tokens=settings.model_max_tokens,
    )


def _api_key(provider: str) -> str:
    settings = get_settings()
    key = settings.openai_api_key if provider == "openai" else settings.anthropic_api_key
    if key is None:
        variable = f"{provider.upper()}_API_KEY"
        hint = " (a local server that needs no key accepts any value)" if provider == "openai" else ""
        raise ModelUnavailable(f"model provider {provider!r} needs {variable}, which is not set{hint}")
    return key.get_secret_value()
