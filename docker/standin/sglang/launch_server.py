"""`python3 -m sglang.launch_server --model-path ...` of the sparklab stand-in engine (not SGLang)."""

import standin

if __name__ == "__main__":
    standin.main("sglang")
