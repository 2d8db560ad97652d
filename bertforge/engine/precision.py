"""The number format a model runs inference in: float32, float16/bfloat16 weights, or int8.

Half precision here means the weights themselves are converted (half the memory and the
bandwidth), not autocast over float32 weights. int8 is dynamic quantisation of every linear
layer (`Int8Linear`), on the CPU.
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

INFERENCE_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                    torch.qint8: "int8"}
# Input channels whose largest |activation| in a batch passes this stay in float (LLM.int8()'s 6.0;
# 10 left MiniLM's lowest cosine at 0.993, 4 gained 0.0006 for 3x the float channels).
OUTLIER_THRESHOLD = 6.0
ONEDNN_KERNELS = ("onednn", "onednn_u8")
UINT8_ZERO_POINT = 128  # "onednn_u8": a row's int8 levels -127..127 stored as 1..255
GRIDS = {"onednn_u8": "uint8", "fbgemm": "float"}  # the grid each kernel takes its activations on (else int8)
# Tokens the int8 feed-forward runs on at a time (models.model.Layer): a piece's (rows, 1536) intermediate states
# stay near the cores' L2 caches through rescale, GELU and quantisation. all-MiniLM-L6-v2, 1 thread, Xeon with AMX:
# +12% at 256 rows, +15% at 384, +14% at 512 (500 real texts); float32 gained nothing. At 2 threads (1,000 texts,
# 2026-11-26) 768 rows ran 617-620 texts/s, 512 611, 384 584. One size whatever the thread count: the outlier
# channels are found piece by piece, so pieces that grew with the threads (384 a thread until 2026-11-28) gave
# vectors that changed with the count the governor chose, by up to 0.007. On the VNNI Xeon (2026-11-28, 1,000 texts
# in calls of 64, five interleaved runs) 384 / 512 / 768 rows: 248 / 249 / 250 texts/s at 1 thread, 401 / 401 /
# 389 at 2.
INT8_FEED_FORWARD_ROWS = 512
# The command line's names (engine.DtypeName) and the long ones the Python API also takes, as it takes torch dtypes.
DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
               "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "int8": torch.qint8, "qint8": torch.qint8}


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights (one scale per output row) and int8 activations (one scale per token),
    except the few input channels with outliers, which are multiplied in float (LLM.int8(), Dettmers 2022).

    BERT's activations have a handful of channels far larger than the rest (the LayerNorm
    outlier dimensions): one int8 scale stretched over them leaves the other channels a few
    levels. On all-MiniLM-L6-v2 and 500 real texts, sentence vectors' lowest cosine to float32
    was 0.9885 with per-token scales alone and 0.998 with channels past OUTLIER_THRESHOLD kept
    in float (at most 1.3% of the channels of any layer).
    Why not torch.ao's `quantize_dynamic` (deprecated in torch 2.13): it scales activations per
    tensor, which gave a lowest cosine of 0.85. Why not torchao's Int8DynamicActivationInt8WeightConfig
    (per-token too): its asymmetric quantisation spent more time than the int8 matmul itself
    (1.2x over float32 against 1.5x here, eager, 1 thread).

    The int8 product (`int8_kernel`): oneDNN's int8 linear on prepacked weights (the weight scales applied in
    the kernel) where the CPU has AMX ("onednn", signed activations) or VNNI alone ("onednn_u8": activations
    shifted by 128 to uint8, the zero point the kernel takes back, as VNNI multiplies u8 x s8), `torch._int_mm`
    where that op is missing, FBGEMM's dynamic linear without VNNI (AVX2 only: there `_int_mm` falls back to a
    plain loop, 36x slower than float32 on all-MiniLM-L6-v2).
    `concatenated` makes one of several linears that read the same input (query, key and value):
    one quantisation of the input and one wider product instead of three.
    """

    def __init__(self, linear: nn.Linear, kernel: str | None = None):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,)
        quantized = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_t", quantized.t().contiguous())  # (in, out): _int_mm's layout
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel = kernel or int8_kernel()
        if self.kernel == "fbgemm":
            self.packed = fbgemm_weights(quantized, scale)
        elif self.kernel in ONEDNN_KERNELS:
            self.packed = torch.ops.onednn.qlinear_prepack(quantized, None)
            self.register_buffer("zero_points", torch.zeros(len(scale), dtype=torch.long), persistent=False)

    @classmethod
    def concatenated(cls, linears: list[nn.Linear], kernel: str | None = None) -> "Int8Linear":
        """One Int8Linear computing every linear of `linears` (same input width) side by side, outputs concatenated."""
        weights = torch.cat([linear.weight.detach() for linear in linears])
        with_bias = any(linear.bias is not None for linear in linears)
        joined = nn.Linear(weights.shape[1], weights.shape[0], bias=with_bias)
        with torch.no_grad():
            joined.weight.copy_(weights)
            if with_bias:
                joined.bias.copy_(torch.cat([linear.bias.detach() if linear.bias is not None
                                             else torch.zeros(linear.out_features) for linear in linears]))
        return cls(joined, kernel)

    def forward(self, states: Tensor) -> Tensor:
        """(..., in) float32 -> (..., out) float32."""
        leading = states.shape[:-1]
        states = states.reshape(-1, self.in_features)
        quantized, scale, outliers = quantize_per_token(states, grid=GRIDS.get(self.kernel, "int8"))
        output = self.int8_product(quantized)  # (tokens, out), times the weight scales
        output.mul_(scale)  # in place: addcmul(bias, output, scale) makes a new tensor and measured no faster
        if self.bias is not None:
            output.add_(self.bias)
        if len(outliers):  # (tokens, k) @ (k, out), the weights' rows dequantised
            weights = self.weight_t.index_select(0, outliers).to(torch.float32).mul_(self.weight_scale)
            output.addmm_(states.index_select(1, outliers), weights)
        return output.reshape(*leading, self.out_features)

    def int8_product(self, quantized: Tensor) -> Tensor:
        """(tokens, in) activations on the int8 grid -> (tokens, out) float32 products times the weight scales."""
        if self.kernel in ONEDNN_KERNELS:  # x_scale 1: the token scales are applied after, per row
            zero_point = UINT8_ZERO_POINT if self.kernel == "onednn_u8" else 0
            return torch.ops.onednn.qlinear_pointwise(quantized, 1.0, zero_point, self.packed, self.weight_scale,
                                                      self.zero_points, None, 1.0, 0, torch.float32, "none", [], "")
        if self.kernel == "fbgemm":
            # FBGEMM quantises its input with one scale for the whole tensor; the rows scaled to one
            # range make that a per-token scale. reduce_range: 7-bit activations, so that AVX2's
            # u8 x s8 pair sums cannot saturate (lowest cosine on MiniLM 0.9955 against 0.998 for VNNI).
            return torch.ops.quantized.linear_dynamic(quantized, self.packed, True)  # x weight scales, no bias
        return torch._int_mm(quantized, self.weight_t).to(torch.float32).mul_(self.weight_scale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kernel}")


def quantize_per_token(states: Tensor, grid: str = "int8") -> tuple[Tensor, Tensor, Tensor]:
    """(tokens, in) float32 -> each token's row on the int8 grid, its scale (tokens, 1) and the outlier channels (k,).

    Outlier channels (largest |value| past OUTLIER_THRESHOLD) are left out of the scales and are 0 in
    the rows: the caller multiplies them in float. grid: "int8" rows; "uint8", the same levels shifted by
    UINT8_ZERO_POINT (oneDNN's u8 x s8 product on VNNI); "float" within [-127, 127], where the kernel
    quantises them again itself (FBGEMM).
    """
    magnitude = states.abs()
    # Reading which channels are outliers is a host sync on a GPU; int8 runs on the CPU only.
    outliers = (magnitude.amax(dim=0) > OUTLIER_THRESHOLD).nonzero().squeeze(1)  # (k,)
    if len(outliers):
        magnitude.index_fill_(1, outliers, 0.0)  # k columns: the token scales ignore the outliers
    scale = magnitude.amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)  # (tokens, 1)
    rows = torch.div(states, scale, out=magnitude)  # within [-127, 127] outside the outlier channels
    if len(outliers):  # out of int8's range there; the float product replaces them
        rows.index_fill_(1, outliers, 0.0)
    if grid == "float":
        return rows, scale, outliers
    levels = rows.round_().to(torch.int8)
    if grid == "uint8":
        # the same levels + 128, wrapping (-127..127 -> 1..255): float -> int8 is a vectorised cast, float -> uint8
        # is not (3x slower at 1 thread), and adding 128 to the int8 bytes read as uint8 is one pass over a quarter
        # of the bytes
        levels = levels.view(torch.uint8).add_(UINT8_ZERO_POINT)
    return levels, scale, outliers


def int8_kernel() -> str:
    """"onednn" where the CPU has AMX, "onednn_u8" where it has VNNI alone, else "fbgemm" (AVX2); "int_mm" where
    oneDNN (or, on AVX2, FBGEMM) is not built.

    oneDNN's int8 linear with signed activations is fast only on AMX: on a Xeon with AVX-512 VNNI and no AMX it ran
    its reference loop, 18.9 s for a (1,000 x 384) x (384 x 1,536) product. With the activations shifted to uint8
    (VNNI multiplies u8 x s8) it runs its VNNI kernel: the whole linear 4.5 ms against `_int_mm`'s 6.2 (the int32
    product's conversion and weight scaling are the kernel's there) and float32's 7.2; all-MiniLM-L6-v2 int8, 500
    texts, 1 thread, four runs each in turn: 255 texts/s against 246 (2026-11-27). Without VNNI `_int_mm` is a plain
    loop (36x slower than float32 on AVX2): FBGEMM there. VNNI and AMX count only while torch runs its kernels past
    AVX2: with ATEN_CPU_CAPABILITY=avx2 (an AVX2 CPU stood in for, as `benchmarks/bench_cpu_peers.py --isa avx2`
    does) the choice is an AVX2 machine's.
    """
    capable = torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "AVX2")
    has_vnni = capable and getattr(torch.cpu, "_is_vnni_supported", lambda: False)()  # private, hence the fallbacks
    has_amx = capable and getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")
    if onednn and (has_amx or has_vnni):
        return "onednn" if has_amx else "onednn_u8"
    return "fbgemm" if not has_vnni and "fbgemm" in torch.backends.quantized.supported_engines else "int_mm"


def fbgemm_weights(quantized: Tensor, scale: Tensor):
    """Int8 weights (out, in) with one scale per output row, packed for torch.ops.quantized.linear_dynamic."""
    with warnings.catch_warnings():  # quantized tensor types are deprecated; FBGEMM's packing still takes them
        warnings.simplefilter("ignore", UserWarning)
        weight = torch._make_per_channel_quantized_tensor(quantized, scale.double(),
                                                          torch.zeros(len(scale), dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(weight, None)


def check_inference_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """None, a torch dtype or a name (fp32, fp16, bf16, int8) -> one of INFERENCE_DTYPES; ValueError otherwise."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    if dtype in INFERENCE_DTYPES:
        return dtype
    raise ValueError(f"dtype={dtype!r} is not supported; use torch.float32 (or None), torch.float16, torch.bfloat16 "
                     "or torch.qint8 (int8, CPU), or their names fp32, fp16, bf16, int8")


def model_dtype(model: nn.Module) -> torch.dtype:
    """The format a model is in now: torch.qint8 once quantised, else its first floating weight's dtype."""
    if any(isinstance(module, Int8Linear) for module in model.modules()):
        return torch.qint8
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def in_dtype(model: nn.Module, dtype: torch.dtype, inplace: bool) -> nn.Module:
    """`model` in `dtype`: itself when it already is, else converted (a copy unless inplace).

    A copy leaves the caller's model as it was (it may be training in float32). Converting an
    int8 model back is refused (ValueError): the float weights are gone.
    """
    if dtype == torch.qint8 and next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 runs on the CPU only; on a GPU use dtype float16 or bfloat16")
    current = model_dtype(model)
    if current == dtype:
        return model
    if current == torch.qint8:
        raise ValueError("this model was quantised to int8 and cannot be converted back; load it again")
    target = model if inplace else copy.deepcopy(model)
    if dtype == torch.qint8:
        return quantize_linear_layers(target.float())
    return target.to(dtype)


def quantize_linear_layers(model: nn.Module) -> nn.Module:
    """Every nn.Linear in model replaced by its Int8Linear, in place; returns model.

    A module that names linears reading the same input in `shared_input_linears` (attention's query,
    key and value) also gets them as one concatenated Int8Linear, `fused_projection`, to use instead.
    """
    for module in list(model.modules()):
        shared = [getattr(module, name, None) for name in getattr(module, "shared_input_linears", ())]
        if shared and all(isinstance(linear, nn.Linear) for linear in shared):
            module.fused_projection = Int8Linear.concatenated(shared)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear(child))
    return model
