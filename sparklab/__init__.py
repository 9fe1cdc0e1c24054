"""sparklab: benchmark LLM serving with speculative decoding on NVIDIA DGX Spark."""

__version__ = "0.1.0"
