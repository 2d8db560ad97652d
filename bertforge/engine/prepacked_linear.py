"""float32 linear layers on oneDNN's prepacked weights, with what follows each product fused into it (CPU inference).

On a CPU the encoder's time is its linear layers (all-MiniLM-L6-v2, float32, 1 thread: addmm 70% of a pass),
and around each product torch's nn.Linear spends more: it copies the bias into every row of the output before
MKL's product adds to it (copy_, 6%), and GELU and the residual sum then read and write the whole output again
(6% and 2%). oneDNN's linear, on weights reordered once into its blocked layout, adds the bias and applies GELU
(the intermediate layer) or adds the residual (the two output layers) while each tile of the output is still in
the cache. Measured on the 2-vCPU Xeon (AVX-512), 1,000 real texts, interleaved runs, 2026-11-26: +4% at 1 thread
and +7% at 2 (weights prepacked alone: level); vectors at cosine 0.9999998 to nn.Linear's.

Where it pays: AVX-512 CPUs. On AVX2 (the same Xeon limited to AVX2) prepacking alone was level and the GELU
epilogue 2-3% slower than ATen's GELU, so `prepacking_pays` says no there and the model keeps nn.Linear.
Inference only (no backward), and only on a model the caller owns: the packed weights are a snapshot, so a
model that trains on would leave them behind.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

# The epilogue oneDNN applies for each activation module the intermediate layer may hold: (attr, algorithm).
FUSED_ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


class PrepackedLinear(nn.Module):
    """nn.Linear on oneDNN's prepacked weights, float32, CPU, inference; `activation` (FUSED_ACTIVATIONS) applied
    in the product's epilogue, and `plus` adds a residual there."""

    def __init__(self, linear: nn.Linear, activation: str | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().float(), None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.activation = activation
        self.attr, self.algorithm = FUSED_ACTIVATIONS[activation] if activation else ("none", "")

    def forward(self, states: Tensor) -> Tensor:
        """(..., in) -> (..., out), the activation applied."""
        return torch.ops.mkldnn._linear_pointwise(states, self.weight, self.bias, self.attr, [], self.algorithm)

    def plus(self, states: Tensor, residual: Tensor) -> Tensor:
        """linear(states) + residual in one pass ((..., out) residual; no activation)."""
        return torch.ops.mkldnn._linear_pointwise.binary(states, residual, self.weight, self.bias, "add")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation}")


def prepacking_pays(device: torch.device | str = "cpu") -> bool:
    """Whether `prepack_linear_layers` speeds up float32 inference here: a CPU running torch's AVX-512 kernels, with
    oneDNN built in (an AVX2 CPU, or this one limited to AVX2 with ATEN_CPU_CAPABILITY=avx2: no)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def fused_activation(module: nn.Module | None) -> str | None:
    """The FUSED_ACTIVATIONS name of an activation module, or None when oneDNN has no epilogue for it (or no module)."""
    if isinstance(module, nn.GELU):
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    if isinstance(module, nn.ReLU):
        return "relu"
    return None


def prepack_where_it_pays(model: nn.Module) -> nn.Module:
    """`prepack_linear_layers(model)` where `prepacking_pays` on the model's device; else `model` as it is. For a model
    its caller owns and runs for inference only (Embedder.from_pretrained, the server's models)."""
    if prepacking_pays(next(model.parameters()).device):
        prepack_linear_layers(model)
    return model


def prepack_linear_layers(model: nn.Module) -> nn.Module:
    """Every float32 nn.Linear of `model` replaced by its PrepackedLinear, in place; returns model.

    A module with `dense` followed by `intermediate_act_fn` (the feed-forward's expansion) gets the activation
    fused in, and the activation module becomes nn.Identity. The residual sums are the model's to fuse
    (`PrepackedLinear.plus`, models.model.ResidualOutput). Prepack only modules that call their linears: one that
    reads a linear's `weight` itself (the MLM head's tied decoder) would read oneDNN's blocked layout. Linears in
    another dtype (fp16/bf16 weights) or already replaced (int8) are left as they are.
    """
    for module in list(model.modules()):
        activation = fused_activation(getattr(module, "intermediate_act_fn", None))
        if activation and float32_linear(getattr(module, "dense", None)):
            module.dense = PrepackedLinear(module.dense, activation)
            module.intermediate_act_fn = nn.Identity()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if float32_linear(child):
                setattr(module, name, PrepackedLinear(child))
    return model


def float32_linear(module: nn.Module | None) -> bool:
    return isinstance(module, nn.Linear) and module.weight.dtype == torch.float32
