"""Chat template rendering: the checkpoint's jinja2 `chat_template`, else a plain template for presets.

Templates run in jinja2's immutable sandbox with the helpers Hugging Face templates expect
(`raise_exception`, `tojson`, `strftime_now`, loop controls), so a checkpoint's `tokenizer_config.json`
template renders as it does under transformers.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# For presets (no tokenizer_config.json): one line of role tag, the content, then the assistant tag.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template raised (e.g. `raise_exception('roles must alternate')`) or failed to render."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from e


def render_chat(
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **template_kwargs: Any,
) -> str:
    """Render `messages` ([{"role", "content"}, ...]) into the prompt text the model expects."""
    template = compile_template(chat_template or PLAIN_CHAT_TEMPLATE)
    try:
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **template_kwargs,
        )
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
        raise ChatTemplateError(f"the chat template failed to render these messages: {e}") from e
