"""The run controls of a panel that calls the model from a button: one run in flight in a worker thread, the latest
values winning, *cancel* stopping before the next decoder layer, progress and the answer box."""
from __future__ import annotations

import contextlib
import threading

import ipywidgets as W

from workbench.run.models import unwrap_model
from workbench.run.stopping import layer_checkpoint
from workbench.show.widgets.base import html_escape

__all__ = ["RunCancelled", "RunControls"]


class RunCancelled(Exception):
    """A model run stopped by the panel's *cancel* button (between its steps, or between two decoder layers)."""


class RunControls:
    """Cache, progress bar, cancel button and answer box of a panel that calls the model from a button.

    The button and *re-run on change* call :meth:`request_run`: the run goes to a worker thread (the kernel
    stays responsive), **one run is in flight at a time**, and slider moves during a run only mark the
    panel stale: when the run ends, one more run starts with the *latest* values (intermediate values are
    dropped). *cancel* stops the run in flight before the next decoder layer (a stopping point on every layer of
    the panel's model, :func:`~workbench.run.stopping.layer_checkpoint`) or between its steps, drops the pending one,
    and leaves the previous answers on screen (a note above them says they are the previous run's). :meth:`run`
    itself runs synchronously (scripts, tests).
    """

    live_only = "its figures follow a model run started from its button, not its sliders alone"

    def _init_run(self, label: str, steps: int) -> None:
        self.cache: dict = {}
        self.model_calls = 0  # runs actually executed (cache misses)
        self.runs_started = 0  # run() calls (cache hits included)
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="idle",
                                      style={"description_width": "initial"}, layout=W.Layout(width="320px"))
        self.run_button = W.Button(description=label, button_style="primary", icon="play")
        self.cancel_button = W.Button(description="cancel", icon="stop", disabled=True)
        self.auto = W.Checkbox(value=False, description="re-run on change")
        self.answers = W.HTML(value="<i>not run yet: press the button</i>", layout=W.Layout(width="auto"))
        self.run_button.on_click(lambda _b: self.request_run())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.auto.observe(lambda ch: self.request_run() if ch["new"] else None, names="value")
        self._extra = [W.HBox([self.run_button, self.cancel_button, self.auto, self.progress]), self.answers]
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._pending = False
        self._cancel = threading.Event()
        self._run_thread: int | None = None  # the thread whose model calls the layer stopping point may stop
        self._shown_answers = self.answers.value  # the last answers a run wrote (a cancel leaves them on screen)
        self.layers_run = 0  # decoder layers the panel's runs entered (the cancel tests count them)

    def request_run(self) -> threading.Thread:
        """Run in the worker thread with the current values, or (a run in flight) run once more with the
        latest values when it ends. Returns the worker thread."""
        with self._lock:
            self._pending = True
            if self._worker is not None and self._worker.is_alive():
                self.progress.description = "queued: latest values next"
                return self._worker
            self._cancel.clear()
            self._worker = threading.Thread(target=self._work, daemon=True, name=f"{type(self).__name__}-run")
            self._worker.start()
            return self._worker

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._pending or self._cancel.is_set():
                    self._pending = False
                    return
                self._pending = False
            try:
                self.run()
            except RunCancelled:
                return
            except Exception:  # noqa: BLE001 - shown in the answer box by _busy; the worker must not die loudly
                return

    def cancel(self) -> None:
        """Stop the run in flight (between its steps) and drop the pending one."""
        with self._lock:
            self._pending = False
            self._cancel.set()
        self.progress.description = "cancelling…"

    def wait(self, timeout: float | None = None) -> None:
        """Block until the worker thread (if any) is done."""
        w = self._worker
        if w is not None:
            w.join(timeout)

    def _step(self, i: int, what: str) -> None:
        if self._cancel.is_set():
            raise RunCancelled(what)
        self.progress.value = i
        self.progress.description = what

    def _layer_check(self, layer: int) -> None:
        """Before each decoder layer of the panel's own run: stop there when *cancel* was pressed. Another
        thread's call of the same model (another panel, the notebook) passes untouched."""
        if threading.get_ident() != self._run_thread:
            return
        if self._cancel.is_set():
            raise RunCancelled(f"before layer {layer}")
        self.layers_run += 1

    def _show_answers(self, html: str) -> None:
        """Write a run's answers (kept on screen when a later run is cancelled)."""
        self._shown_answers = self.answers.value = html

    @contextlib.contextmanager
    def _busy(self):
        """The run button is disabled (cancel enabled) while the model runs; a failure is shown in the answer box,
        then raised."""
        self.run_button.disabled = True
        self.cancel_button.disabled = False
        self.runs_started += 1
        self._run_thread = threading.get_ident()
        net = None if self.model is None else unwrap_model(self.model)[0]
        try:
            with layer_checkpoint(net, self._layer_check) if net is not None else contextlib.nullcontext():
                yield
        except RunCancelled:
            self.progress.description = "cancelled"
            self.answers.value = ("<i>cancelled: the answers below are the previous run's; press the button to run "
                                  "again</i><br>" + self._shown_answers)
            raise
        except Exception as e:
            self.progress.description = "failed"
            self.answers.value = f"<span style='color:#D55E00'>run failed: {html_escape(e)}</span>"
            raise
        finally:
            self._run_thread = None
            self.run_button.disabled = False
            self.cancel_button.disabled = True
            self._cancel.clear()

    def _cached(self, key, fn):
        if key not in self.cache:
            self.cache[key] = fn()
            self.model_calls += 1
        return self.cache[key]

    def _on_change(self, change) -> None:
        if self._silent:
            return
        self.update()
        if self.auto.value:
            self.request_run()
