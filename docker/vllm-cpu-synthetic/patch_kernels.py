"""Run inside the vllm-cpu image (docker/vllm-cpu-synthetic/build.sh): route the two CPU rejection kernels'
synthetic mode to sparklab_cpu_synthetic instead of their assert, when SPARKLAB_VLLM_CPU_SYNTHETIC=1, and the CPU
expand kernel to its fixed copy when SPARKLAB_VLLM_CPU_EXPAND_FIX=1 (sparklab_cpu_synthetic.expand says why). Fails
unless each place is found exactly where expected, so a different vLLM build is never patched blind."""

import sys
from pathlib import Path

import vllm.utils.cpu_triton_utils as target

ASSERT = '    assert not SYNTHETIC_MODE, "Synthetic acceptance not supported with CPU sampling"\n'
GREEDY = ("    import sparklab_cpu_synthetic as _synthetic  # sparklab: docker/vllm-cpu-synthetic\n"
          "    if SYNTHETIC_MODE and _synthetic.enabled():\n"
          "        return _synthetic.greedy(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,\n"
          "                                 bonus_token_ids, is_greedy, uniform_probs, synthetic_conditional_rates)\n")
RANDOM = ("    import sparklab_cpu_synthetic as _synthetic  # sparklab: docker/vllm-cpu-synthetic\n"
          "    if SYNTHETIC_MODE and _synthetic.enabled():\n"
          "        return _synthetic.random(output_token_ids, cu_num_draft_tokens, draft_token_ids, bonus_token_ids,\n"
          "                                 recovered_token_ids, uniform_probs, is_greedy,\n"
          "                                 synthetic_conditional_rates)\n")

EXPAND_DEF = ("def _expand_kernel_impl(\n    output,\n    input_val,\n    cu_num_tokens,\n    replace_from,\n"
              "    replace_to,\n    MAX_NUM_TOKENS=None,\n):\n")
EXPAND = ("    import sparklab_cpu_synthetic as _synthetic  # sparklab: docker/vllm-cpu-synthetic\n"
          "    if _synthetic.expand_fix_enabled():\n"
          "        return _synthetic.expand(output, input_val, cu_num_tokens, replace_from, replace_to)\n")

path = Path(target.__file__)
text = path.read_text()
if text.count(EXPAND_DEF) != 1:
    sys.exit(f"{path}: expected _expand_kernel_impl's signature once, found it {text.count(EXPAND_DEF)} times")
text = text.replace(EXPAND_DEF, EXPAND_DEF + EXPAND)
if text.count(ASSERT) != 2:
    sys.exit(f"{path}: expected the synthetic-mode assert twice, found it {text.count(ASSERT)} times")
first = text.index(ASSERT)
second = text.index(ASSERT, first + 1)
if not (text.rfind("def _rejection_greedy_sample_kernel_impl(", 0, first) >
        text.rfind("def _rejection_random_sample_kernel_impl(", 0, first)):
    sys.exit(f"{path}: the first assert is not in _rejection_greedy_sample_kernel_impl")
text = text[:second] + RANDOM + ASSERT + text[second + len(ASSERT):]
text = text[:first] + GREEDY + ASSERT + text[first + len(ASSERT):]
path.write_text(text)
print(f"patched {path}")
