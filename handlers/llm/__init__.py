"""Model adapters, chosen by the model id (`scripted`, later `openai:<name>`, `anthropic:<name>`)."""

from __future__ import annotations

from handlers.contract import ScriptStep
from handlers.llm.base import ChatModel
from handlers.llm.scripted import ScriptedModel

KNOWN_PROVIDERS = ("scripted",)


class ModelUnavailable(ValueError):
    pass


def load_model(model_id: str, script: list[ScriptStep] | None) -> ChatModel:
    if model_id == "scripted":
        return ScriptedModel(script)
    raise ModelUnavailable(f"model {model_id!r} is not available; known: {', '.join(KNOWN_PROVIDERS)}")


def check_model(model_id: str) -> None:
    load_model(model_id, None)
