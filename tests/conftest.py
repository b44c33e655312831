"""Shared fixtures. The default model is loaded once per session (converted once per machine)."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/peers/ runs only in the peer environment (``make test-peers``: the workbench at its transformers
# floor next to NVIDIA kvpress); the main suite never collects it, so it never imports kvpress.
collect_ignore = [] if os.environ.get("WORKBENCH_PEERS") else ["peers"]
torch.manual_seed(0)


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct (``LoadedModel``), on CPU in fp32."""
    from workbench.run.models import load_model

    return load_model(device="cpu", progress=False)


@pytest.fixture(scope="session")
def example():
    from workbench.run.examples import load_example

    return load_example()


@pytest.fixture(scope="session")
def example_prompt(smollm, example):
    return example.build(smollm.tokenizer, max_context=smollm.shape.max_context)


@pytest.fixture(scope="session")
def smollm_capture(smollm, example_prompt):
    """A capture of the bundled multi-document prompt: observers, the query as audit population,
    a 32-token tail, 3 decode steps, hidden states at a few layers."""
    from workbench.capture import RowSet, run_capture

    return run_capture(smollm, example_prompt, RowSet(tail=32, n_decode=3),
                       hidden_layers=(0, 10, 30), progress=False)
