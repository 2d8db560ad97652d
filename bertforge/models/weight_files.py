"""The file names a checkpoint folder keeps its weights under, as transformers writes them: one place for the
reader (`checkpoint.read_state_dict`), the model's identity (`folder.model_fingerprint`), the hub download
(`checkpoint.HUB_FILES`) and the run folder's check that a folder holds a model. Torch-free, so the light
readers (a folder's settings, a run folder) can name them without loading it."""

WEIGHTS_SAFETENSORS = "model.safetensors"
WEIGHTS_SAFETENSORS_INDEX = "model.safetensors.index.json"  # shards: model-0000N-of-0000M.safetensors
WEIGHTS_PYTORCH = "pytorch_model.bin"  # the legacy pickle format, read with torch's weights-only loader
# Any of these beside a config.json makes a folder a checkpoint (shards are named by the index).
WEIGHT_FILES = (WEIGHTS_SAFETENSORS, WEIGHTS_SAFETENSORS_INDEX, WEIGHTS_PYTORCH)
