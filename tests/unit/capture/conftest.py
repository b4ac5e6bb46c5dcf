"""Fixtures for the capture tests: the embedded tokenizer, renderer and engine, built once."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from grove.capture.embedded import (
    CHATML_TEMPLATE,
    EMBEDDED_MODEL_NAME,
    REASONING_STRIPPING_TEMPLATE,
    EmbeddedEngine,
    build_tokenizer,
)
from grove.capture.render import Renderer, RenderOptions


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """The embedded ChatML tokenizer."""
    return build_tokenizer()


@pytest.fixture(scope="session")
def renderer(tokenizer: PreTrainedTokenizerFast) -> Renderer:
    """A renderer over the embedded ChatML tokenizer."""
    return Renderer(tokenizer)


@pytest.fixture(scope="session")
def stripping_renderer() -> Renderer:
    """A renderer whose template drops the reasoning of assistant turns before the last user."""
    return Renderer(build_tokenizer(template=REASONING_STRIPPING_TEMPLATE))


@pytest.fixture(scope="session")
def strict_content_renderer() -> Renderer:
    """A renderer whose template marks every defined content, so an empty assistant tool-call
    content renders differently from an absent one."""
    template = CHATML_TEMPLATE.replace(
        "{%- if message.content is string %}",
        "{%- if message.content is defined %}{{- '[content]' }}{%- endif %}"
        "{%- if message.content is string %}",
    )
    return Renderer(build_tokenizer(template=template))


@pytest.fixture
def options() -> RenderOptions:
    """Default render options for the embedded model."""
    return RenderOptions(model=EMBEDDED_MODEL_NAME)


@pytest.fixture(scope="session")
def engine(tokenizer: PreTrainedTokenizerFast) -> EmbeddedEngine:
    """The embedded engine (random weights, seed 0)."""
    return EmbeddedEngine.build(tokenizer)
