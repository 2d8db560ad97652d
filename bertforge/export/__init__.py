"""Exporting models to other runtimes (ONNX)."""
