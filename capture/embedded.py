"""The embedded engine: a tiny transformers causal LM and tokenizer, built offline in code.

For tests and the demo; nothing is downloaded. The tokenizer is a byte-level BPE trained by the
``tokenizers`` library on a small corpus in this module (so every string round-trips through
bytes) and wrapped as a transformers fast tokenizer with a ChatML-style chat template. The model
is a Qwen2-style decoder with random weights drawn from a fixed seed.

Sampling is at temperature 1 with no top-k or top-p, so the recorded logprob of each token is the
log-softmax of the model's raw logits at that step: exactly what the trainer recomputes. Other
sampling parameters are refused rather than approximated. A call with an output constraint is
sampled from the logits masked by its grammar (``capture/grammar.py``): the recorded logprob is
the log-softmax of the masked logits, the distribution the token was actually drawn from.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from grove.capture.embedded_moe import RouteMemory, RouteRecorder, router_modules
from grove.capture.engine import FinishReason, Generation, OutputConstraint, SamplingParams
from grove.capture.errors import InvalidPromptError, PromptTooLongError, UnsupportedSamplingError
from grove.capture.grammar import (
    ConstraintUnsupportedError,
    GrammarMask,
    TokenizerGrammar,
    grammar_text,
)
from grove.capture.tiny_decoder import seeded, tiny_decoder_config

__all__ = [
    "CHATML_TEMPLATE",
    "EMBEDDED_MODEL_NAME",
    "REASONING_STRIPPING_TEMPLATE",
    "EmbeddedEngine",
    "build_model",
    "build_tokenizer",
    "chat_template",
    "sample_token",
]

EMBEDDED_MODEL_NAME: Final = "grove/embedded-tiny"
END_OF_TEXT: Final = "<|endoftext|>"
IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
_MARKUP_TOKENS: Final = ("<think>", "</think>", "<tool_call>", "</tool_call>")
_VOCAB_SIZE: Final = 512

_CORPUS: Final = (
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "A model reads a prompt, writes an answer, and a harness decides what to keep.",
    "When the context grows too long, the agent summarizes the oldest turns and continues.",
    "Tool results arrive as observations: the weather is sunny, 21 degrees, light wind.",
    "user assistant system tool developer reasoning answer question observation summary",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    '{"name": "search", "arguments": {"query": "weather in Paris", "limit": 3}}',
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" # @ & % $ _ | \\ ~ `",
    "Please think step by step, then give the final answer in one short sentence.",
    "Grove records every model call with its exact tokens and trains on accepted history.",
)


def chat_template(*, strip_earlier_reasoning: bool = False) -> str:
    """A ChatML chat template; optionally one that drops the reasoning of assistant turns before
    the last user message (as Qwen3-style templates do), which is not append-compatible."""
    keep = "message.role != 'assistant' or loop.index0 > ns.last_user"
    if not strip_earlier_reasoning:
        keep = "true"
    return (
        "{%- set ns = namespace(last_user=-1) %}"
        "{%- for message in messages %}{%- if message.role == 'user' %}"
        "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
        "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}"
        "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
        "{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}"
        f"{{%- set keep = {keep} %}}"
        "{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- if keep and message.reasoning_content is defined %}"
        "{{- '<think>' + message.reasoning_content + '</think>' }}{%- endif %}"
        "{%- if message.content is string %}"
        "{%- if keep %}{{- message.content }}"
        "{%- else %}{{- message.content.split('</think>')[-1] }}{%- endif %}"
        "{%- elif message.content is defined %}{%- for part in message.content %}"
        "{%- if part.text is defined %}{{- part.text }}{%- endif %}{%- endfor %}{%- endif %}"
        "{%- if message.tool_calls is defined %}{%- for call in message.tool_calls %}"
        "{{- '<tool_call>' + (call.function | tojson) + '</tool_call>' }}{%- endfor %}{%- endif %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


CHATML_TEMPLATE: Final = chat_template()
REASONING_STRIPPING_TEMPLATE: Final = chat_template(strip_earlier_reasoning=True)


@functools.cache
def _trained_bpe() -> str:
    """The trained tokenizer as JSON (trained once per process; BPE training is deterministic)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=[END_OF_TEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer.add_tokens(list(_MARKUP_TOKENS))
    return tokenizer.to_str()


def build_tokenizer(*, template: str = CHATML_TEMPLATE) -> PreTrainedTokenizerFast:
    """The embedded byte-level BPE tokenizer with ``template`` as its chat template.

    End of turn (``<|im_end|>``) is the end-of-sequence token; ``<|endoftext|>`` pads.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_bpe()),
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        chat_template=template,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    context_length: int = 2048,
) -> Qwen2ForCausalLM:
    """A Qwen2-style causal LM sized for ``tokenizer``, with random weights from ``seed``.

    The global torch random state is left as it was.
    """
    shape = tiny_decoder_config(
        tokenizer, hidden_size=hidden_size, num_layers=num_layers, context_length=context_length
    )
    config = Qwen2Config(**shape, use_sliding_window=False)
    return seeded(seed, lambda: Qwen2ForCausalLM(config))


def sample_token(
    logits: torch.Tensor, mask: GrammarMask | None, generator: torch.Generator
) -> tuple[int, float]:
    """One token drawn from ``logits`` ``(V,)`` under the grammar ``mask`` (if any, which then
    accepts it), and its logprob: the embedded engines' sampling step."""
    if mask is not None:
        logits = mask.apply(logits)  # -inf where the grammar forbids the token
    logprobs = torch.log_softmax(logits, dim=-1)  # (V,)
    token = int(torch.multinomial(logprobs.exp(), 1, generator=generator).item())
    if mask is not None:
        mask.accept(token)
    return token, float(logprobs[token])


class EmbeddedEngine:
    """An :class:`grove.capture.engine.Engine` over a local transformers causal LM.

    Deterministic: a call with ``sampling.seed`` set draws from a generator seeded with it; a
    call without one draws from the engine's own stream, seeded at construction, so the same
    sequence of calls gives the same generations. Calls are serialized by a lock.

    ``policy_version`` counts the optimizer steps in the model's weights; each generation
    reports the value it read under the lock. Whoever changes the weights does so, and sets the
    version, inside :meth:`updating`, which holds the same lock: no generation sees half an
    update, and none straddles one.

    ``tokenizer`` (the model's) is needed for calls with an output constraint only: its
    vocabulary is what the grammar masks; an engine built without it refuses them. The grammar
    compiler for it is built on the first constrained call and kept.

    The engine runs where the model's parameters are (a GPU too: logits come back to the CPU,
    where the seeded generators draw); ``autocast_dtype`` (``torch.bfloat16`` for a run with
    ``policy.precision: bfloat16``) runs its forward under autocast, as the trainer's is.
    """

    name: str = "embedded"  # EmbeddedVLMEngine names itself apart

    def __init__(
        self,
        model: PreTrainedModel,  # a causal LM: the embedded one, or one load_model loaded
        *,
        stop_token_ids: Iterable[int],
        seed: int = 0,
        policy_version: int = 0,
        tokenizer: PreTrainedTokenizerBase | None = None,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.autocast_dtype = autocast_dtype
        self.policy_version = policy_version
        self.stop_token_ids = frozenset(stop_token_ids)
        self.tokenizer = tokenizer
        self._generator = torch.Generator().manual_seed(seed)
        # Reentrant: a training step holds it across the optimizer step and the publish, which
        # takes it again to set the version.
        self._lock = threading.RLock()
        self._grammar: TokenizerGrammar | None = None
        self._routers = router_modules(model)  # empty for a dense model: no routes recorded
        self._route_memory = RouteMemory()

    @classmethod
    def build(
        cls, tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, model_seed: int = 0
    ) -> EmbeddedEngine:
        """An engine over :func:`build_model` for ``tokenizer``, stopping at end of turn."""
        model = build_model(tokenizer, seed=model_seed)
        return cls(model, stop_token_ids=[tokenizer.eos_token_id], seed=seed, tokenizer=tokenizer)

    @contextmanager
    def updating(self) -> Iterator[None]:
        """Hold off generation while the weights (and ``policy_version``) change: a generation
        in progress finishes first, and the next one starts after the block exits."""
        with self._lock:
            yield

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """Sample up to ``max_tokens`` tokens after the prompt, stopping at a stop token."""
        self.check(prompt_token_ids, sampling)
        stops = self.stop_token_ids | set(sampling.stop_token_ids)
        device = next(self.model.parameters()).device
        autocast = torch.autocast(
            device.type,
            dtype=self.autocast_dtype or torch.float32,
            enabled=self.autocast_dtype is not None,
        )
        with (
            self._lock,
            torch.inference_mode(),
            autocast,
            self._recording(prompt_token_ids) as recorder,
        ):
            version = self.policy_version
            generator = (
                self._generator
                if sampling.seed is None
                else torch.Generator().manual_seed(sampling.seed)
            )
            mask = (
                None if sampling.constraint is None else self._mask(sampling.constraint, sampling)
            )
            tokens: list[int] = []
            logprobs: list[float] = []
            finish: FinishReason = "length"
            routes: torch.Tensor | None = None  # an MoE model's, recorded below
            prompt = list(prompt_token_ids)
            inputs = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, T)
            cache = None
            for _ in range(sampling.max_tokens):
                out = self.model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1)
                cache = out.cache
                token, logprob = sample_token(out.logits[0, -1].float().cpu(), mask, generator)
                tokens.append(token)
                logprobs.append(logprob)
                if token in stops:
                    finish = "stop"
                    break
                inputs = torch.tensor([[token]], dtype=torch.long, device=device)  # (1, 1)
            if recorder is not None:
                # The final token's route: what its continuation's prefill would observe
                # (docs/moe.md, "Capture"); the logits of this step are not used.
                final = torch.tensor([[tokens[-1]]], dtype=torch.long, device=device)  # (1, 1)
                self.model(input_ids=final, cache=cache, use_cache=True, logits_to_keep=1)
                routes = recorder.routes().cpu()  # (prompt + generated, layers, top_k)
                self._route_memory.remember([*prompt_token_ids, *tokens], routes)
        return Generation(
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            finish_reason=finish,
            routes=routes,
            policy_version=version,
        )

    @contextmanager
    def _recording(self, prompt: Sequence[int]) -> Iterator[RouteRecorder | None]:
        """A recorder of the routers' choices for one generation, its prefill routed as the
        engine routed the prompt's longest remembered prefix (``RouteMemory``); None for a
        dense model."""
        if not self._routers:
            yield None
            return
        recorder = RouteRecorder(self._routers, forced=self._route_memory.prefix_routes(prompt))
        with recorder.recording():
            yield recorder

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Raise the refusal ``generate`` would give, before anything is recorded."""
        for name, got, supported in (
            ("temperature", sampling.temperature, 1.0),
            ("top_p", sampling.top_p, 1.0),
            ("top_k", sampling.top_k, 0),
        ):
            if got != supported:
                raise UnsupportedSamplingError(self.name, name, got, supported)
        if sampling.constraint is not None:
            self._tokenizer_for_grammar()
            grammar_text(sampling.constraint)  # a schema it cannot enforce is refused here
        if not prompt_token_ids:
            raise InvalidPromptError("a prompt has at least one token", list(prompt_token_ids))
        text = self.model.config.get_text_config()  # a VLM's (EmbeddedVLMEngine): its text's
        vocab = text.vocab_size
        outside = sorted({t for t in prompt_token_ids if not 0 <= t < vocab})
        if outside:
            raise InvalidPromptError(f"token ids must lie in [0, {vocab})", outside[:10])
        context = text.max_position_embeddings
        if len(prompt_token_ids) + sampling.max_tokens > context:
            raise PromptTooLongError(len(prompt_token_ids), sampling.max_tokens, context)

    def _tokenizer_for_grammar(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise ConstraintUnsupportedError(
                self.name,
                "it was built without its tokenizer, whose vocabulary the grammar "
                "masks; build it with tokenizer=...",
            )
        return self.tokenizer

    def _mask(self, constraint: OutputConstraint, sampling: SamplingParams) -> GrammarMask:
        """A grammar mask for one generation (the compiler built on first use, under the lock)."""
        if self._grammar is None:
            self._grammar = TokenizerGrammar(
                self._tokenizer_for_grammar(),
                vocab_size=self.model.config.get_text_config().vocab_size,
                stop_token_ids=self.stop_token_ids,
            )
        stops = self.stop_token_ids | set(sampling.stop_token_ids)
        return self._grammar.mask(constraint, stops)
