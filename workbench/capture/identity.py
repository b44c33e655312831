"""Is this prompt (or capture) meant for this model? One cheap check before a rerun.

A capture's spans hold token ids of the tokenizer that built them, and a capture records the model
that made it (``model_id``: name and config fingerprint ``(type, L, H_Q, G, d)``). Running those ids
through another model gives numbers that look fine and mean nothing. :func:`check_model_match` refuses:

- token ids ``>= `` the model's vocabulary size, in the prompt or among a capture's generated ids
  (always: they are not tokens of this model);
- spans built by a tokenizer whose fingerprint differs from the model's tokenizer (when both are known);
- a :class:`~workbench.capture.data.Capture` whose config fingerprint differs from the model's, or
  whose ``model_id`` carries no fingerprint (blank or synthetic: nothing says which model made it),

unless ``allow_foreign=True`` is passed (then only the vocabulary range is checked). The check costs a
few microseconds: the fingerprint samples the vocabulary, it does not hash it.
"""
from __future__ import annotations

from workbench.capture.data import config_fingerprint
from workbench.capture.hooks import model_identity
from workbench.checks import Bool
from workbench.constraints import register_all
from workbench.run import adapter
from workbench.run.prompt import TOKENIZER_KEY, tokenizer_fingerprint

__all__ = ["check_model_match", "config_fingerprint"]

_CHECKS = register_all("check_model_match", {"allow_foreign": Bool()}, __name__)


def check_model_match(model, tokenizer, prompt, *, allow_foreign: bool = False) -> None:
    """Raise ``ValueError`` when ``prompt`` (a Prompt, PromptSpans or Capture) was made for another model.

    Args:
        model: the HF model about to run (unwrapped).
        tokenizer: its tokenizer, or ``None`` when unknown.
        prompt: what the rerun was given.
        allow_foreign: skip the tokenizer and config comparison (the vocabulary range is still checked).
    """
    _CHECKS["allow_foreign"].check("allow_foreign", allow_foreign)
    spans = getattr(prompt, "spans", prompt)
    ids = getattr(spans, "input_ids", None)
    if ids is None:
        return
    V = adapter.model_shape(model).vocab
    top = max(ids) if len(ids) else 0
    if V and top >= V:
        raise ValueError(f"prompt: token id {top} is outside this model's vocabulary (size {V}): the prompt was "
                         "tokenised for another model; rebuild it with this model's tokenizer")
    gen = getattr(prompt, "generated_ids", None) if hasattr(prompt, "attn") else None
    if V and gen and max(gen) >= V:
        raise ValueError(f"prompt: the capture's generated token id {max(gen)} is outside this model's vocabulary "
                         f"(size {V}): it was made with another model")
    if allow_foreign:
        return
    want = (getattr(spans, "extra", None) or {}).get(TOKENIZER_KEY)
    if want is not None and tokenizer is not None:
        have = tokenizer_fingerprint(tokenizer)
        if have != want:
            raise ValueError(f"prompt: built with another tokenizer (fingerprint {want}, this model's {have}); "
                             "rebuild the prompt with this model's tokenizer, or pass allow_foreign=True")
    if hasattr(prompt, "attn"):
        cap_id, mine = getattr(prompt, "model_id", None), model_identity(model)
        theirs = config_fingerprint(cap_id) if isinstance(cap_id, str) else ""
        if not theirs:  # no fingerprint (blank, edited or synthetic): nothing says it is this model's
            raise ValueError(f"prompt: the capture's model identity {cap_id!r} does not say which model made it "
                             f"(expected a name and fingerprint like {mine!r}); use a capture of this model, "
                             "or pass allow_foreign=True")
        if theirs != config_fingerprint(mine):
            raise ValueError(f"prompt: the capture was made with {cap_id!r}, not with this model {mine!r}; "
                             "use the model it was captured with, or pass allow_foreign=True")
