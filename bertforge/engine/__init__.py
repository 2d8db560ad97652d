"""The shared engine: attention (padded and packed), unpadding, batching by tokens."""
from typing import Literal

# The number formats the command line offers (precision.DTYPE_NAMES maps them to torch dtypes), here and
# not in precision.py so that building the command line's parser needs no torch.
DtypeName = Literal["fp32", "fp16", "bf16", "int8"]
