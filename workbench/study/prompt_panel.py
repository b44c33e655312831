"""The prompt panel (:class:`PromptPanel`): paste documents and a question, or choose a RULER-style task, a
length and a seed; *Build and capture* builds the prompt (:func:`workbench.run.prompt.build_prompt`, or the
family's item, :func:`workbench.study.ruler.build_ruler`), captures it (:func:`workbench.capture.run_capture`)
and sets a :class:`~workbench.show.widgets.CaptureState`, so that every panel built on that state shows the new
capture. Bad input (an empty document, no question, a prompt longer than the model's context, a count out of
its range) is said in the panel, naming the field, and changes nothing: the state keeps its capture and the
panels their figures.

*Load model* chooses the model in the lab (a local folder, a hub id already in the local cache or a shipped
research model's short name: :func:`workbench.run.models.load_model`) and captures the panel's prompt on it, so
that every following panel switches to it; a model that is refused, or a prompt it cannot capture, is said in the
panel and the previous model stays.

It sits in the study layer because it builds the study's task families; the panels it feeds are the show
layer's.
"""
from __future__ import annotations

import html
import re
import warnings

import ipywidgets as W

from workbench.capture import RowSet, run_capture
from workbench.checks import Choice, Interval, check_context
from workbench.constraints import PARAMS, register_all
from workbench.run.models import load_model
from workbench.run.prompt import build_prompt, has_visible_text
from workbench.run.shipped import SHIPPED
from workbench.show.widgets.state import CaptureState
from workbench.study.ruler import RULER_TASKS, build_ruler

__all__ = ["PromptPanel", "SEPARATOR", "split_documents", "haystack_note"]

#: a line of three or more dashes (alone on its line) separates documents pasted into one box
SEPARATOR = re.compile(r"^[ \t]*-{3,}[ \t]*$", re.M)
MODES = (("documents", "documents"), ("RULER task", "ruler"))
_LABEL = {"description_width": "110px"}


def _number() -> W.Layout:
    return W.Layout(width="240px")


def _auto() -> W.Layout:
    return W.Layout(width="auto")


TASK = Choice(tuple(sorted(RULER_TASKS)))
PROMPT_PANEL_CHECKS = register_all("prompt_panel", {
    "length": Interval("int", 256, 1_000_000),  # a RULER-style length: study.ruler.MIN_LENGTH and up
    "n_boxes": Interval("int", 1, 64),          # the document boxes
}, __name__)


def split_documents(boxes) -> list[str]:
    """The documents of the pasted boxes, in order: each box is one document, or several separated by a line of
    dashes (``---``). Every document must hold visible text: an empty one raises ``ValueError`` naming it
    (``document 2: ...``, counted over all boxes from 1)."""
    docs = [part.strip("\n") for box in boxes for part in SEPARATOR.split(box)]
    if not docs:
        raise ValueError("documents: paste at least one document")
    for i, d in enumerate(docs, 1):
        if not d.strip() or not has_visible_text(d):
            raise ValueError(f"document {i}: empty; every document must hold text (remove its box, or the "
                             f"separator line, if it is not wanted)")
    return docs


def haystack_note(prompt, length: int) -> str:
    """Why a RULER prompt's ``T`` exceeds the haystack length asked: the tokens in its documents and the rest
    (chat template, instruction, separators, question)."""
    T, docs = prompt.T, sum(e - s for s, e in prompt.spans.documents)
    return (f"T = {T:,} tokens: {docs:,} in the documents (the haystack, {length:,} asked) and {T - docs:,} of chat "
            f"template, instruction, separators and question")


def _red(msg: str) -> str:
    return f"<span style='color:#D55E00'>{html.escape(msg)}</span>"


class PromptPanel:
    """Build a prompt, capture it and hand the capture to every panel of ``state``.

    Args:
        lm: a :class:`~workbench.run.models.LoadedModel` (its tokenizer builds the prompt).
        state: the :class:`~workbench.show.widgets.CaptureState` the analytic panels follow.
        documents: the documents to show in the boxes at first (default ``n_boxes`` empty boxes).
        question: the question to show at first.
        n_boxes: document boxes when ``documents`` is empty (more with *add a box*).
        task, length, seed: the RULER-style family, its length in tokens and its seed.
        tail, n_decode: the captured rows (:class:`~workbench.capture.RowSet`: the observers, the query, a prompt
            tail of ``tail`` rows and ``n_decode`` greedy decode steps).
        max_context: the longest prompt (default the model's context).

    ``build()`` is what the button does; it returns the new capture, or ``None`` with the reason in
    ``.error`` and in the panel's status line.
    """

    def __init__(self, lm, state: CaptureState, *, documents=(), question: str = "", n_boxes: int = 3,
                 task: str = "niah_single", length: int = 2048, seed: int = 0, tail: int = 32, n_decode: int = 4,
                 max_context: int | None = None):
        if getattr(lm, "tokenizer", None) is None or not hasattr(lm, "model"):
            raise ValueError("lm: must be a LoadedModel with a tokenizer (the panel builds prompts)")
        if not isinstance(state, CaptureState):
            raise ValueError(f"state: must be a CaptureState, got {type(state).__name__}")
        PARAMS["max_context"].check("max_context", max_context)
        PROMPT_PANEL_CHECKS["n_boxes"].check("n_boxes", n_boxes)
        TASK.check("task", task)
        self.lm, self.state = lm, state
        self._max_context = max_context  # the caller's bound; None: each model's own context
        self.max_context = max_context if max_context is not None else (lm.shape.max_context or None)
        self.prompt = self.item = self.capture = None
        self.error: str | None = None
        docs = list(documents) or [""] * n_boxes
        self.mode = W.ToggleButtons(options=MODES, value="documents", description="prompt")
        self.boxes = W.VBox([self._box(d) for d in docs])
        self.add_box = W.Button(description="add a box", icon="plus", tooltip="another document box", layout=_auto())
        self.remove_box = W.Button(description="remove the last box", icon="minus", layout=_auto())
        self.question = W.Textarea(value=question, description="question", placeholder="the question",
                                   layout=W.Layout(width="640px", height="48px"))
        self.task = W.Dropdown(options=TASK.options, value=task, description="task")
        self.length = W.IntText(value=length, description="haystack (tokens)", style=_LABEL, layout=_number(),
                                tooltip="the documents' length in tokens (the haystack); the chat template, the "
                                        "instruction and the question add to it, so the prompt's T is larger (the "
                                        "status line gives both)")
        self.seed = W.IntText(value=seed, description="seed", style=_LABEL, layout=_number())
        self.tail = W.IntText(value=tail, description="tail rows", style=_LABEL, layout=_number())
        self.n_decode = W.IntText(value=n_decode, description="decode steps", style=_LABEL, layout=_number())
        self.button = W.Button(description="Build and capture", icon="play", button_style="primary",
                               layout=W.Layout(width="220px"),
                               tooltip="build the prompt, capture it (one prefill and the decode steps) and show it "
                                       "in every panel of the shared state")
        self.model = W.Combobox(value="", options=sorted(SHIPPED), ensure_option=False, description="model",
                                placeholder="a model folder, a cached hub id or a research model", style=_LABEL,
                                layout=W.Layout(width="520px"))
        self.load_button = W.Button(description="Load model", icon="download", layout=_auto(),
                                    tooltip="load this model and capture the prompt below on it; every panel of "
                                            "the shared state follows")
        self.status = W.HTML(self._summary())
        self.documents_box = W.VBox([W.HTML("documents: one per box, or several in a box separated by a line "
                                            "<code>---</code>"), self.boxes,
                                     W.HBox([self.add_box, self.remove_box]), self.question])
        self.task_box = W.VBox([W.HBox([self.task, self.length, self.seed])], layout=W.Layout(display="none"))
        self.widget = W.VBox([W.HTML("<b>Prompt: documents and a question, or a RULER-style task</b>"),
                              W.HBox([self.model, self.load_button]), self.mode,
                              self.documents_box, self.task_box, W.HBox([self.tail, self.n_decode]), self.button,
                              self.status])
        self.mode.observe(self._show_mode, names="value")
        self.add_box.on_click(lambda _b: self._add())
        self.remove_box.on_click(lambda _b: self._remove())
        self.button.on_click(lambda _b: self.build())
        self.load_button.on_click(lambda _b: self.choose_model(self.model.value))

    # ----- the controls -----
    @staticmethod
    def _box(text: str = "") -> W.Textarea:
        return W.Textarea(value=text, placeholder="a document", layout=W.Layout(width="640px", height="72px"))

    def _add(self) -> None:
        self.boxes.children = (*self.boxes.children, self._box())

    def _remove(self) -> None:
        if len(self.boxes.children) <= 1:
            self.status.value = _red("documents: the last box stays (a prompt needs a document; empty it to "
                                     "paste another)")
            return
        gone = self.boxes.children[-1]
        self.boxes.children = self.boxes.children[:-1]
        gone.close()

    def _show_mode(self, change=None) -> None:
        docs = self.mode.value == "documents"
        self.documents_box.layout.display = None if docs else "none"
        self.task_box.layout.display = "none" if docs else None

    def set_documents(self, documents, question: str | None = None) -> None:
        """Put ``documents`` in the boxes (one each; the boxes follow their count) and the question."""
        old = self.boxes.children
        self.boxes.children = tuple(self._box(str(d)) for d in documents) or (self._box(),)
        for w in old:
            w.close()
        if question is not None:
            self.question.value = question
        self.mode.value = "documents"

    def _summary(self) -> str:
        c = self.state.capture
        return (f"the panels show a capture of T = {c.T} tokens, k = {c.spans.k} chunks, {c.attn.shape[2]} rows "
                f"({html.escape(str(getattr(c, 'model_id', '')))})")

    # ----- building -----
    def _rows(self) -> RowSet:
        return RowSet(tail=self.tail.value, n_decode=self.n_decode.value)  # checked: names the field

    def _fits(self, T: int, field: str, rows: RowSet) -> None:
        mc = self.max_context
        if mc and T > mc:
            raise ValueError(f"{field}: the prompt has T = {T} tokens, more than the model's context {mc}")
        check_context(T, rows.n_decode, mc, n_name="n_decode")

    def build_prompt(self):
        """The prompt the controls describe (``ValueError`` naming the field when an input is bad)."""
        rows = self._rows()
        tok = self.lm.tokenizer
        if self.mode.value == "documents":
            docs = split_documents(b.value for b in self.boxes.children)
            q = self.question.value
            if not q.strip() or not has_visible_text(q):
                raise ValueError("question: must not be empty")
            prompt = build_prompt(tok, docs, q.strip())
            self._fits(prompt.T, "documents", rows)
            return prompt, None, rows
        PROMPT_PANEL_CHECKS["length"].check("length", self.length.value)
        PARAMS["seed"].check("seed", self.seed.value)
        if self.max_context and self.length.value > self.max_context:
            raise ValueError(f"length: must be <= the model's context {self.max_context} tokens (less the chat "
                             f"template), got {self.length.value}")
        item = build_ruler(self.task.value, tok, lengths=[self.length.value], n=1, seed=self.seed.value)[0]
        prompt = item.build(tok)
        self._fits(prompt.T, "length", rows)
        return prompt, item, rows

    def build(self):
        """Build the prompt, capture it and set the state (every following panel redraws); the new capture, or
        ``None`` when an input is bad (the reason in the status line and ``.error``; nothing else changes)."""
        self.button.disabled = True
        self.status.value = "<i>building the prompt and capturing…</i>"
        try:
            prompt, item, rows = self.build_prompt()
            cap = run_capture(self.lm, prompt, rows, progress=False)
        except ValueError as e:
            self.error = str(e)
            self.status.value = _red(self.error)
            return None
        finally:
            self.button.disabled = False
        self.error = None
        self.prompt, self.item, self.capture = prompt, item, cap
        failed = self.state.set(cap, prompt, model=self.lm)
        n = len(self.state.panels) - len(failed)
        msg = self._summary() + f"; shown in {n} of {len(self.state.panels)} panels"
        if item is not None:
            msg += f"<br>{html.escape(item.task)} (seed {self.seed.value}): answer {html.escape(item.answers[0])}"
            msg += f"<br>{html.escape(haystack_note(prompt, self.length.value))}"
        if failed:
            msg += "<br>" + "<br>".join(_red(f"{p} still shows the previous capture: {r}") for p, r in failed.items())
        self.status.value = msg
        return cap

    def choose_model(self, spec: str):
        """Load ``spec`` (a local model folder, a hub id already in the local cache or a research model's short
        name) on the current model's device, and capture the panel's prompt on it (:meth:`build`): every following
        panel switches to it. Returns the new capture, or ``None`` with the reason in the status line and
        ``.error`` (a refused model, or a prompt it cannot capture): the previous model, capture and figures stay.
        Warnings of a partly supported model are shown in the status line."""
        spec = str(spec).strip()
        if not spec:
            self.error = "model: name a model folder, a hub id already in the local cache or a research model"
            self.status.value = _red(self.error)
            return None
        self.load_button.disabled = True
        self.status.value = f"<i>loading {html.escape(spec)}…</i>"
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                lm = load_model(spec, device=str(self.lm.device), progress=False)
        except (ValueError, TypeError, OSError) as e:
            self.error = f"model: {spec} cannot be used: {e}"
            self.status.value = _red(self.error)
            return None
        finally:
            self.load_button.disabled = False
        old = self.lm, self.max_context
        self.lm = lm
        self.max_context = self._max_context if self._max_context is not None else (lm.shape.max_context or None)
        cap = self.build()
        if cap is None:
            self.lm, self.max_context = old
            self.error = (f"model: {lm.model_id} loaded, but the prompt cannot be captured on it: {self.error}; the "
                          f"panels keep {getattr(self.state.capture, 'model_id', '')}")
            self.status.value = _red(self.error)
            return None
        notes = "".join(f"<br>{html.escape(str(w.message))}" for w in said)
        self.status.value += notes
        return cap

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)
