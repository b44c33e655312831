"""Small shared helpers."""
from __future__ import annotations

import contextlib
import functools

import torch


@contextlib.contextmanager
def one_thread():
    """Run small-tensor analytics on one intra-op thread (restored afterwards).

    The analytics work on tensors of a few hundred thousand elements; thread start-up and
    synchronisation then cost more than the arithmetic, badly so on a busy machine.
    """
    old = torch.get_num_threads()
    if old != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if old != 1:
            torch.set_num_threads(old)


def single_threaded(fn):
    """Decorator form of :func:`one_thread`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper
