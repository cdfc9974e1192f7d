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

from engine.server.api_errors import invalid

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


def special_token_text(tok: Any, token_id: int | None) -> str:
    if token_id is None:
        return ""
    try:
        return tok.decode([token_id], skip_special_tokens=False)
    except Exception:
        return ""


def chat_prompt_ids(tok: Any, messages: list[dict[str, str]], add_generation_prompt: bool,
                    template_kwargs: dict[str, Any]) -> list[int]:
    """Render the messages with the checkpoint's template (or the plain one) and tokenize them.

    The template writes special tokens itself, so the text is encoded without them; BOS is added only
    when the tokenizer adds one to plain text and the template did not write it.
    """
    bos = getattr(tok, "bos_token_id", None)
    eos_ids = getattr(tok, "eos_token_ids", None) or []
    try:
        text = render_chat(
            messages,
            getattr(tok, "chat_template", None),
            add_generation_prompt=add_generation_prompt,
            bos_token=special_token_text(tok, bos),
            eos_token=special_token_text(tok, eos_ids[0] if eos_ids else None),
            **template_kwargs,
        )
    except ChatTemplateError as e:
        raise invalid("messages", f"'messages' could not be rendered: {e}") from e
    except TypeError as e:  # chat_template_kwargs clashing with the template's own arguments
        raise invalid("chat_template_kwargs", f"'chat_template_kwargs' is invalid: {e}") from e
    try:
        ids = tok.encode(text, add_special_tokens=False)
        adds_bos = bos is not None and tok.encode("a")[:1] == [bos]
    except TypeError:  # a tokenizer without add_special_tokens
        ids, adds_bos = tok.encode(text), False
    if adds_bos and ids[:1] != [bos]:
        ids = [bos, *ids]
    if not ids:
        raise invalid("messages", "'messages' render to an empty prompt")
    return ids
