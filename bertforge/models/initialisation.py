"""How a BERT model's weights are initialised: BERT's own scheme for the modules a checkpoint lacks, and none at all
while a model about to receive a checkpoint's weights is built (torch.nn.init skipped in the loading thread)."""
from __future__ import annotations

import contextlib
import functools
import threading

import torch
from torch import Tensor, nn


# What a module's constructor initialises its parameters with; no-ops in a thread building a checkpoint's model
INIT_FUNCTIONS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
                  "trunc_normal_", "zeros_", "ones_", "constant_")
_LOADING = threading.local()  # .depth: how many loads this thread is inside (a load within a load)
_INSTALLING = threading.Lock()


def skippable(initialiser):
    """`initialiser` as it is, except in a thread inside `initialisation_skipped`, where it leaves the tensor alone."""
    @functools.wraps(initialiser)
    def initialise(tensor, *args, **kwargs):
        if getattr(_LOADING, "depth", 0):
            return tensor
        return initialiser(tensor, *args, **kwargs)

    initialise.skips = initialiser
    return initialise


def install_skippable_initialisers() -> None:
    """Wrap torch.nn.init's initialisers in `skippable`, once: layers call them through the module at each use."""
    with _INSTALLING:
        for name in INIT_FUNCTIONS:
            current = getattr(nn.init, name)
            if not hasattr(current, "skips"):
                setattr(nn.init, name, skippable(current))


@contextlib.contextmanager
def initialisation_skipped():
    """torch.nn.init's initialisers as no-ops in this thread: a model about to be given a checkpoint's weights is not
    initialised twice first (torch's default in each layer's constructor, then BERT's), which was most of a load's
    time (all-MiniLM-L6-v2: 0.21 of 0.25 s), as transformers' `no_init_weights` does. transformers swaps the
    functions for the whole process while it loads; here they skip only in the loading thread, so a layer another
    thread builds meanwhile (a server's request, a user's thread pool) is initialised as usual."""
    install_skippable_initialisers()
    _LOADING.depth = getattr(_LOADING, "depth", 0) + 1
    try:
        yield
    finally:
        _LOADING.depth -= 1


def initialise_missing(model: nn.Module, missing: list[str], state_dict: dict[str, Tensor]) -> None:
    """BERT's initialisation for the modules owning a weight the checkpoint lacked (a new head, a pooler), the
    checkpoint's weights put back where such a module had some (a head whose bias alone was saved)."""
    owners = {key.rpartition(".")[0] for key in missing}
    modules = [module for name, module in model.named_modules() if name in owners]
    if not modules:
        return
    init_bert_weights(modules, model.config.initializer_range)
    prefixes = tuple(owner + "." for owner in owners)
    model.load_state_dict({k: v for k, v in state_dict.items() if k.startswith(prefixes)}, strict=False)


def init_bert_weights(modules: list[nn.Module], std: float) -> None:
    """BERT's initialisation: normal(0, std), zero biases, LayerNorm at identity (padding embedding zero)."""
    for module in modules:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    # Last, because a tied decoder (a Linear sharing the embedding matrix) was drawn above too.
    for module in modules:
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
